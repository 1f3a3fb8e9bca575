package testrank

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ranktree/ranktree/store"
)

// TestRunRanksChild is the child side of TestRunRanksReportsFailure; run
// directly it skips.
func TestRunRanksChild(t *testing.T) {
	p, ok := Current(t)
	if !ok {
		t.Skip("runs only as a child of TestRunRanksReportsFailure")
	}
	if err := os.WriteFile(filepath.Join(p.Dir, "rank"+strconv.Itoa(p.Rank)), []byte(os.Getenv("EXTRA")), 0o600); err != nil {
		t.Fatal(err)
	}
	if p.Rank == 1 {
		t.Fatal("deliberate failure of rank 1")
	}
}

func TestRunRanksReportsFailure(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	dir := t.TempDir()
	outs, err := RunRanks("TestRunRanksChild", dir, 3, time.Minute, "EXTRA=hello")
	if err == nil || !strings.Contains(err.Error(), "1 of 3 ranks") || !strings.Contains(err.Error(), "rank 1 (") {
		t.Fatalf("RunRanks error %v, want rank 1 named as the only failure", err)
	}
	if !strings.Contains(outs[1], "deliberate failure of rank 1") {
		t.Errorf("rank 1 output lacks its failure:\n%s", outs[1])
	}
	for _, r := range []string{"0", "1", "2"} {
		b, err := os.ReadFile(filepath.Join(dir, "rank"+r))
		if err != nil || string(b) != "hello" {
			t.Errorf("rank %s did not run with the shared dir and env: %q %v", r, b, err)
		}
	}
}

func TestRanksReportsHang(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	err := Ranks(3, 200*time.Millisecond, func(r int) error {
		if r == 2 {
			<-block
		}
		if r == 0 {
			return errors.New("boom")
		}
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "ranks [2] did not finish") {
		t.Fatalf("Ranks: %v", err)
	}
	err = Ranks(2, time.Minute, func(r int) error {
		if r == 1 {
			return errors.New("boom")
		}
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "rank 1: boom") {
		t.Fatalf("Ranks: %v", err)
	}
}

func TestFileStore(t *testing.T) {
	ctx := context.Background()
	s, err := NewFileStore(t.TempDir(), 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Set(ctx, "a/b c", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Get(ctx, "a/b c"); err != nil || string(v) != "v1" {
		t.Fatalf("Get: %q %v", v, err)
	}
	if _, err := s.Get(ctx, "missing"); !errors.Is(err, store.ErrTimeout) || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("Get of a missing key: %v", err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 10; j++ {
				if _, err := s.Add(ctx, "ctr", 1); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if v, _ := s.Add(ctx, "ctr", 0); v != 80 {
		t.Fatalf("counter %d after 80 concurrent adds", v)
	}
	if v, _ := s.CompareAndSet(ctx, "cas", nil, []byte("x")); string(v) != "x" {
		t.Fatalf("CAS absent: %q", v)
	}
	if v, _ := s.CompareAndSet(ctx, "cas", nil, []byte("y")); string(v) != "x" {
		t.Fatalf("CAS absent on a present key: %q", v)
	}
	if v, _ := s.CompareAndSet(ctx, "cas", []byte("x"), []byte("z")); string(v) != "z" {
		t.Fatalf("CAS expected: %q", v)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := s.Watch(wctx, "w/", false)
	if err != nil {
		t.Fatal(err)
	}
	s.Set(ctx, "w/1", []byte("p"))
	s.Set(ctx, "other", []byte("q"))
	if ev := <-ch; ev.Type != store.EventPut || ev.Key != "w/1" || string(ev.Value) != "p" {
		t.Fatalf("watch event %+v", ev)
	}
	if ok, _ := s.Delete(ctx, "w/1"); !ok {
		t.Fatal("Delete of a present key reported false")
	}
	if ev := <-ch; ev.Type != store.EventDelete || ev.Key != "w/1" {
		t.Fatalf("watch event %+v", ev)
	}
	if ok, _ := s.Check(ctx, []string{"a/b c", "cas"}); !ok {
		t.Fatal("Check of present keys")
	}
	if n, _ := s.NumKeys(ctx); n != 4 {
		t.Fatalf("NumKeys %d, want 4", n)
	}
	s.Close()
	if err := s.Set(ctx, "k", nil); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Set after Close: %v", err)
	}
}
