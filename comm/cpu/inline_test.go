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

// TestStreamProgressesWithoutWaiters checks the progress goroutine's
// hand-offs (engine.go: Launch wakes it only when it is parked on an idle
// stream; an inline runner hands over what was queued meanwhile): with one
// P, ops that nobody waits for complete in the background, whether they
// were launched on a parked stream, behind an op the progress goroutine
// runs, or behind an op a waiter runs inline; and every rank ends with the
// right sums.
func TestStreamProgressesWithoutWaiters(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	g := newGroup(t, 2, Options{Transport: TransportInmem})
	const n = 40
	ctx := context.Background()
	bufs := make([][]comm.Buffer, 2)
	works := make([][]*comm.Work, 2)
	for r := range 2 {
		for range n {
			b := comm.NewHostBuffer(comm.Float32, 1)
			setF(b, 0, float64(r+1))
			bufs[r] = append(bufs[r], b)
		}
	}
	launch := func(r, i int) {
		fp := comm.Fingerprint{Group: comm.GroupHash(g.name), Seq: uint64(i + 1), Op: comm.OpAllReduce, DType: comm.Float32,
			Count: 1, Root: -1, RedOp: comm.RedSum}
		p := comm.NewPromise(comm.OpAllReduce)
		g.engines[r].Launch(&comm.Op{FP: fp, Type: comm.OpAllReduce, Reduce: comm.Sum, Root: -1, Peer: -1, In: []comm.Buffer{bufs[r][i]}}, p)
		works[r] = append(works[r], p.Work())
	}
	// Rank 1 launches everything up front; nobody waits on its Works.
	for i := range n {
		launch(1, i)
	}
	// Rank 0: a first batch nobody waits for, then one op run inline by
	// its waiter with more launched behind it, then the rest.
	for i := range n / 4 {
		launch(0, i)
	}
	waitDone := func(w *comm.Work, what string) {
		t.Helper()
		select {
		case <-w.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("%s never completed without a waiter", what)
		}
	}
	waitDone(works[0][n/4-1], "rank 0's first batch")
	launch(0, n/4)
	for i := n/4 + 1; i < n/2; i++ {
		launch(0, i)
	}
	if err := works[0][n/4].Wait(ctx); err != nil {
		t.Fatal(err)
	}
	waitDone(works[0][n/2-1], "the ops queued behind the inline one")
	for i := n / 2; i < n; i++ {
		launch(0, i)
	}
	for r := range 2 {
		waitDone(works[r][n-1], "the last op")
		for i, w := range works[r] {
			if err := w.Err(); err != nil || !w.IsCompleted() {
				t.Fatalf("rank %d op %d: completed %v, %v", r, i, w.IsCompleted(), err)
			}
			if got := getF(bufs[r][i], 0); got != 3 {
				t.Fatalf("rank %d op %d: %v, want 1+2", r, i, got)
			}
		}
	}
}

// TestLazyStart checks when Launch leaves a small op to its waiter (the
// parked progress goroutine is not woken, lazy is set): only once waiters
// have run lazyAfter ops in a row inline, never for a large op, and no
// longer after the progress goroutine ran one. Such an op that nobody
// waits for, with nothing launched behind it and its Done channel never
// taken, still completes in the background once the kick timer fires
// (lazyGrace): the test only polls IsCompleted. A group of one rank makes
// every Wait below run its op inline (nothing yields between Launch and
// Wait on one P).
func TestLazyStart(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	e := newGroup(t, 1, Options{Transport: TransportInmem}).engines[0]
	ctx := context.Background()
	seq := uint64(0)
	// launch launches one allreduce of count float32 once the progress
	// goroutine is parked and reports whether it was left lazy.
	launch := func(count int) (*comm.Work, bool) {
		for end := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Microsecond) {
			e.qmu.Lock()
			parked := e.parked
			e.qmu.Unlock()
			if parked {
				break
			}
			if time.Now().After(end) {
				t.Fatal("the progress goroutine never parked")
			}
		}
		seq++
		b := comm.NewHostBuffer(comm.Float32, count)
		fp := comm.Fingerprint{Seq: seq, Op: comm.OpAllReduce, DType: comm.Float32, Count: int64(count), Root: -1, RedOp: comm.RedSum}
		p := comm.NewPromise(comm.OpAllReduce)
		e.Launch(&comm.Op{FP: fp, Type: comm.OpAllReduce, Reduce: comm.Sum, Root: -1, Peer: -1, In: []comm.Buffer{b}}, p)
		e.qmu.Lock()
		defer e.qmu.Unlock()
		return p.Work(), e.lazy
	}
	poll := func(w *comm.Work, what string) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); !w.IsCompleted(); time.Sleep(100 * time.Microsecond) {
			if time.Now().After(end) {
				t.Fatalf("%s: an op nobody waits for never completed", what)
			}
		}
		if err := w.Err(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	for i := range lazyAfter + 1 {
		w, lazy := launch(1)
		if want := i >= lazyAfter; lazy != want {
			t.Fatalf("op %d, after %d run inline: lazy %v, want %v", i, i, lazy, want)
		}
		if i < lazyAfter {
			if err := w.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		} else {
			poll(w, "lazy small op") // the kick timer starts it
		}
	}
	// The progress goroutine ran the last one: the next is not lazy.
	if w, lazy := launch(1); lazy {
		t.Fatal("lazy after the progress goroutine ran an op")
	} else {
		poll(w, "small op after a background one")
	}
	for range lazyAfter {
		w, _ := launch(1)
		if err := w.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if w, lazy := launch(lazyMaxBytes/4 + 1); lazy {
		t.Fatal("an op over lazyMaxBytes was left lazy")
	} else {
		poll(w, "large op")
	}
}
