package ddp_test

import (
	"context"
	"testing"
	"time"

	"github.com/ranktree/ranktree"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/ddp"
)

// TestInitStandalone: without rankrunner's env (RANK unset) Init gives a
// working world of 1 on which Wrap and Sync run (the single-process
// fallback).
func TestInitStandalone(t *testing.T) {
	t.Setenv(ranktree.EnvRank, "") // restored after the test
	unsetenv(t, ranktree.EnvRank)
	if !ddp.Standalone() {
		t.Fatal("Standalone() = false with RANK unset")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rt, err := ddp.Init(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	if rt.Rank() != 0 || rt.WorldSize() != 1 {
		t.Fatalf("rank %d of %d, want 0 of 1", rt.Rank(), rt.WorldSize())
	}
	w, g := []float32{1, 2}, []float32{3, 4}
	m, err := ddp.Wrap(ctx, rt.World(), []ddp.Param{{Name: "w", Shape: []int{2},
		Value: func(fn func(comm.Buffer)) error { fn(comm.HostBuffer(w)); return nil },
		Grad:  func(fn func(comm.Buffer)) error { fn(comm.HostBuffer(g)); return nil }}}, ddp.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if g[0] != 3 || g[1] != 4 || w[0] != 1 {
		t.Fatalf("world of 1 changed values: w %v g %v", w, g)
	}
}
