package cpu

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// TestRunInline checks the waiter's inline path (issue 15, fewer
// hand-offs): a Work whose op is the head of an idle stream runs on the
// calling goroutine (RunInline reports it, and the Work is complete with
// the right result when it returns); a Work queued behind another op is
// refused, so launch order holds; Wait with a ctx that could end the wait
// early leaves the op to the progress goroutine; an engine stopped before
// the claim refuses.
func TestRunInline(t *testing.T) {
	// One P: the progress goroutine cannot take the op between Launch and
	// RunInline below.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	g := newGroup(t, 2, Options{Transport: TransportInmem})
	const count = 4
	bufs := []comm.Buffer{comm.NewHostBuffer(comm.Float32, count), comm.NewHostBuffer(comm.Float32, count)}
	op := func(r int, seq uint64) *comm.Op {
		fp := comm.Fingerprint{Group: comm.GroupHash(g.name), Seq: seq, Op: comm.OpAllReduce, DType: comm.Float32,
			Count: count, Root: -1, RedOp: comm.RedSum}
		return &comm.Op{FP: fp, Type: comm.OpAllReduce, Reduce: comm.Sum, Root: -1, Peer: -1, In: []comm.Buffer{bufs[r]}}
	}
	ctx := context.Background()

	// Seq 1 and 2 queued on rank 0; rank 1 has not launched yet.
	setF(bufs[0], 0, 1)
	w01, w02 := comm.NewPromise(comm.OpAllReduce), comm.NewPromise(comm.OpAllReduce)
	g.engines[0].Launch(op(0, 1), w01)
	g.engines[0].Launch(op(0, 2), w02)
	if g.engines[0].RunInline(w02.Work()) {
		t.Fatal("RunInline ran seq 2 ahead of seq 1")
	}
	// Rank 1 runs its two ops on its own goroutine (through Wait: inline).
	done := make(chan error, 1)
	go func() {
		setF(bufs[1], 0, 2)
		w11, w12 := comm.NewPromise(comm.OpAllReduce), comm.NewPromise(comm.OpAllReduce)
		g.engines[1].Launch(op(1, 1), w11)
		g.engines[1].Launch(op(1, 2), w12)
		err := w11.Work().Wait(ctx)
		if err == nil {
			err = w12.Work().Wait(ctx)
		}
		done <- err
	}()
	// Rank 0's seq 1 is the head of an idle stream: the waiter runs it.
	if !g.engines[0].RunInline(w01.Work()) {
		t.Fatal("RunInline refused the head of an idle stream")
	}
	if !w01.Work().IsCompleted() || w01.Work().Err() != nil {
		t.Fatalf("seq 1 after RunInline: completed %v, %v", w01.Work().IsCompleted(), w01.Work().Err())
	}
	if got := getF(bufs[0], 0); got != 3 {
		t.Fatalf("seq 1: %v, want 1+2", got)
	}
	if err := w02.Work().Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := getF(bufs[0], 0); got != 6 {
		t.Fatalf("seq 2: %v, want 3+3", got)
	}

	// A Wait whose ctx may end first (a deadline) does not run the op: it
	// returns the ctx's error while the op stays queued behind nothing but
	// the missing peer.
	w03 := comm.NewPromise(comm.OpAllReduce)
	g.engines[0].Launch(op(0, 3), w03)
	dctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := w03.Work().Wait(dctx); err != context.DeadlineExceeded {
		t.Fatalf("Wait with a deadline: %v, want the ctx's error", err)
	}
	w13 := comm.NewPromise(comm.OpAllReduce)
	g.engines[1].Launch(op(1, 3), w13)
	if err := w13.Work().Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := w03.Work().Wait(ctx); err != nil {
		t.Fatal(err)
	}

	// A stopped engine refuses; its op fails as before.
	w04 := comm.NewPromise(comm.OpAllReduce)
	g.engines[0].Launch(op(0, 4), w04)
	g.engines[0].Abort(nil)
	if g.engines[0].RunInline(w04.Work()) {
		t.Fatal("RunInline ran an op on an aborted engine")
	}
	if err := w04.Work().Wait(ctx); err == nil {
		t.Fatal("op on an aborted engine succeeded")
	}
}
