package comm_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// TestWorkSpinWait: a spinning Wait returns the result of a completion
// that arrives within the spin, and once the spin is over without one it
// honours ctx and the blocking-wait deadline as a plain Wait does.
func TestWorkSpinWait(t *testing.T) {
	want := errors.New("engine failure")
	w := comm.NewWork(comm.OpAllReduce)
	w.SetSpinWait(time.Second)
	if w.SpinWait() != time.Second {
		t.Fatalf("SpinWait = %v", w.SpinWait())
	}
	go func() {
		time.Sleep(2 * time.Millisecond)
		w.Complete(want)
	}()
	start := time.Now()
	if err := w.Wait(context.Background()); err != want {
		t.Fatalf("Wait = %v, want %v", err, want)
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Fatalf("Wait took %v for a completion after 2 ms", d)
	}

	// Nothing completes: ctx ends during the spin; Wait returns ctx's error
	// once the spin is over, not before and not much after.
	w = comm.NewWork(comm.OpAllReduce)
	w.SetSpinWait(20 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	start = time.Now()
	if err := w.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v, want the ctx deadline", err)
	}
	if d := time.Since(start); d < 20*time.Millisecond || d > 5*time.Second {
		t.Fatalf("Wait returned after %v, want after the 20 ms spin", d)
	}

	// Blocking wait's deadline still applies after the spin.
	w = comm.NewWork(comm.OpAllReduce)
	w.SetDeadline(time.Now().Add(time.Millisecond), func(time.Duration) error { return comm.ErrTimeout })
	w.SetSpinWait(5 * time.Millisecond)
	if err := w.Wait(context.Background()); !errors.Is(err, comm.ErrTimeout) {
		t.Fatalf("Wait = %v, want the blocking-wait timeout", err)
	}

	// Off: d ≤ 0.
	w = comm.NewWork(comm.OpAllReduce)
	w.SetSpinWait(-1)
	w.Complete(nil)
	if err := w.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestWorkSpinWaitRace sets the spin while waiters already wait and the
// Work completes, as an engine taking a Work the caller waits on does; run
// under -race.
func TestWorkSpinWaitRace(t *testing.T) {
	for range 200 {
		w := comm.NewWork(comm.OpBarrier)
		var wg sync.WaitGroup
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := w.Wait(context.Background()); err != nil {
					t.Error(err)
				}
			}()
		}
		w.SetSpinWait(time.Millisecond)
		w.Complete(nil)
		wg.Wait()
	}
}
