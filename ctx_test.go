package ranktree

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/supervisor"
)

// TestCtxDeadlineBoundsOp: a ctx deadline earlier than the op timeout
// becomes the op's deadline. Rank 0 launches an AllReduce alone with a
// 300 ms deadline (the group timeout is 10 minutes): the watchdog fails it
// with a *comm.TimeoutError naming rank 1 as not arrived and aborts the
// communicator, and rank 1's late AllReduce fails with ErrRemoteAbort
// naming rank 1 as where the failure started (it never reached seq 1),
// reported by rank 0, instead of succeeding or hanging.
func TestCtxDeadlineBoundsOp(t *testing.T) {
	clearSupervisionEnv(t)
	t.Setenv(supervisor.EnvAsyncErrorHandling, "CleanupOnly")
	ex := &exitRecorder{}
	rts := startRanks(t, 2, WithExit(ex.exit))
	bg, cancelAll := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelAll()
	rank0Done := make(chan struct{})
	eachRank(t, rts, func(rt *Runtime) error {
		pg := rt.World()
		data := []float32{float32(rt.Rank() + 1)}
		buf := comm.HostBuffer(data)
		if rt.Rank() == 0 {
			defer close(rank0Done)
			ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			err := pg.AllReduce(ctx, buf, comm.Sum).Wait(bg)
			el := time.Since(start)
			var te *comm.TimeoutError
			if !errors.As(err, &te) || te.Timeout > time.Second || len(te.NotReached) != 1 || te.NotReached[0] != 1 {
				t.Errorf("rank 0: got %v, want a TimeoutError at the ctx deadline naming rank 1", err)
			}
			t.Logf("rank 0 failed after %v: %v", el, err)
			if el > 3*time.Second {
				t.Errorf("rank 0: the ctx deadline (300 ms) took %v to fail the op", el)
			}
			return nil
		}
		<-rank0Done
		err := pg.AllReduce(bg, buf, comm.Sum).Wait(bg)
		var ra *comm.RemoteAbortError
		if !errors.As(err, &ra) || ra.Rank != 1 || ra.Relay != 0 || ra.Seq != 1 {
			t.Errorf("rank 1: got %v, want a RemoteAbortError blaming rank 1 at seq 1, reported by rank 0", err)
		}
		if data[0] != 2 {
			t.Errorf("rank 1: the failed AllReduce changed its buffer to %v", data)
		}
		return nil
	})
	if codes, _ := ex.snapshot(); len(codes) != 0 {
		t.Errorf("exit called with %v under CleanupOnly", codes)
	}
}

// TestCtxCancelAbortsOp: cancelling the ctx of a launched collective fails
// its Work with an error wrapping context.Canceled and aborts the
// communicator; a later op on the group fails with ErrAborted.
func TestCtxCancelAbortsOp(t *testing.T) {
	clearSupervisionEnv(t)
	t.Setenv(supervisor.EnvAsyncErrorHandling, "CleanupOnly")
	rts := startRanks(t, 2, WithExit(func(int) {}))
	bg, cancelAll := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelAll()
	pg := rts[0].World()
	ctx, cancel := context.WithCancel(bg)
	w := pg.AllReduce(ctx, comm.HostBuffer([]float32{1}), comm.Sum)
	time.Sleep(50 * time.Millisecond)
	if w.IsCompleted() {
		t.Fatalf("completed alone: %v", w.Err())
	}
	start := time.Now()
	cancel()
	err := w.Wait(bg)
	var ce *comm.CanceledError
	if !errors.Is(err, context.Canceled) || !errors.As(err, &ce) || ce.FP.Seq != 1 {
		t.Fatalf("got %v, want a CanceledError at seq 1 wrapping context.Canceled", err)
	}
	// The error names the op's identity as the communicator assigned it
	// (its one owner), group hash and epoch included.
	if want := w.Fingerprint(); ce.FP != want || want.Group != comm.GroupHash(pg.Name()) || want.Epoch != pg.Epoch() || want.Op != comm.OpAllReduce {
		t.Fatalf("CanceledError names %+v; the Work's fingerprint is %+v (group %q epoch %d)", ce.FP, want, pg.Name(), pg.Epoch())
	}
	t.Logf("cancelled op failed after %v: %v", time.Since(start), err)
	if err := pg.Barrier(bg).Wait(bg); !errors.Is(err, comm.ErrAborted) {
		t.Fatalf("op after the cancel: %v, want ErrAborted", err)
	}
}
