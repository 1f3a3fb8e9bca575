package actors_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/internal/testrank"
)

// lifeComm builds a communicator over rec with cfg (Group "g", epoch 7)
// and a ProcessGroup over it.
func lifeComm(t *testing.T, rec *testrank.Recorder, cfg actors.CommunicatorConfig) (*actors.Communicator, *comm.ProcessGroup) {
	t.Helper()
	cfg.Group, cfg.Epoch, cfg.Log = "g", 7, zerolog.Nop()
	c, err := actors.NewCommunicator(testrank.QuietSystem(), rec, cfg)
	if err != nil {
		t.Fatal(err)
	}
	pg, err := comm.NewProcessGroup(comm.GroupConfig{Name: "g", Epoch: 7, Rank: rec.Rank(), Size: rec.Size(), Launcher: c, Engine: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Destroy(context.Background()) })
	return c, pg
}

// TestCommunicatorAsyncErrorAndSupervise: Supervise sees the communicator
// before its first op and its Observer sees every op; AsyncError is the
// engine's async error, or else the actor's first panic.
func TestCommunicatorAsyncErrorAndSupervise(t *testing.T) {
	rec := panicking(2)
	var supervised *actors.Communicator
	var scheduled atomic.Int32
	c, pg := lifeComm(t, rec, actors.CommunicatorConfig{Supervise: func(c *actors.Communicator) actors.Observer {
		supervised = c
		return actors.ObserverFunc(func(*comm.Op, *comm.Promise) { scheduled.Add(1) })
	}})
	if supervised != c {
		t.Fatalf("Supervise saw %p, want the communicator %p", supervised, c)
	}
	ctx := context.Background()
	if err := pg.AllReduce(ctx, comm.NewHostBuffer(comm.Int32, 1), comm.Sum).Wait(ctx); err != nil || c.AsyncError() != nil {
		t.Fatalf("op 1: %v, AsyncError %v", err, c.AsyncError())
	}
	err := pg.AllReduce(ctx, comm.NewHostBuffer(comm.Int32, 1), comm.Sum).Wait(ctx)
	if !errors.Is(err, comm.ErrEngine) || c.AsyncError() == nil || c.AsyncError().Error() != err.Error() {
		t.Fatalf("op 2 panicked: %v; AsyncError %v, want the panic's error", err, c.AsyncError())
	}
	if n := scheduled.Load(); n != 2 {
		t.Errorf("Observer saw %d ops, want 2", n)
	}
}

// TestCommunicatorRetireAndBlockingWait: with BlockingWait a held op's
// Wait fails with a *TimeoutError naming the rank and the op at its
// timeout; after Retire every Submit fails with the retirement's error.
func TestCommunicatorRetireAndBlockingWait(t *testing.T) {
	rec := testrank.NewRecorder(0, 2)
	rec.SetHold(true)
	defer rec.Release(nil)
	c, pg := lifeComm(t, rec, actors.CommunicatorConfig{Rank: 5, BlockingWait: true})
	ctx := context.Background()
	w := pg.AllReduce(ctx, comm.NewHostBuffer(comm.Int32, 1), comm.Sum, comm.WithOpTimeout(50*time.Millisecond))
	var te *comm.TimeoutError
	if err := w.Wait(ctx); !errors.As(err, &te) || te.Rank != 5 || te.Group != "g" || te.FP.Seq != 1 {
		t.Fatalf("held op under blocking wait: %v, want a *TimeoutError of rank 5, group g, seq 1", err)
	}
	retired := &comm.AbortedError{Group: "g", Reason: errors.New("replaced by epoch 8")}
	c.Retire(retired)
	if err := pg.Barrier(ctx).Wait(ctx); !errors.Is(err, comm.ErrAborted) || !errors.Is(err, retired) {
		t.Fatalf("op after Retire: %v, want the retirement's *AbortedError", err)
	}
}

// TestCommunicatorCloseGrace: Close lets the last op finish within
// CloseGrace before closing the engine, then runs OnClosed once; an op
// still held past the grace is closed under.
func TestCommunicatorCloseGrace(t *testing.T) {
	for _, finish := range []bool{true, false} {
		rec := testrank.NewRecorder(0, 2)
		rec.SetHold(true)
		var closed atomic.Int32
		c, pg := lifeComm(t, rec, actors.CommunicatorConfig{CloseGrace: 300 * time.Millisecond, CloseBound: time.Second,
			OnClosed: func(*actors.Communicator) { closed.Add(1) }})
		ctx := context.Background()
		w := pg.AllReduce(ctx, comm.NewHostBuffer(comm.Int32, 1), comm.Sum)
		if finish {
			time.AfterFunc(50*time.Millisecond, func() { rec.Release(nil) })
		}
		start := time.Now()
		if err := c.Close(ctx); err != nil {
			t.Fatalf("finish %v: Close: %v", finish, err)
		}
		took := time.Since(start)
		err := w.Wait(ctx)
		switch {
		case finish && (err != nil || took >= 300*time.Millisecond):
			t.Errorf("op released within the grace: %v after %v, want success before the grace ended", err, took)
		case !finish && (err == nil || took < 300*time.Millisecond):
			t.Errorf("op held past the grace: %v after %v, want a failure after the grace", err, took)
		}
		if err := c.Close(ctx); err != nil || closed.Load() != 1 || !rec.Closed() {
			t.Errorf("finish %v: second Close %v, OnClosed ran %d times, engine closed %v", finish, err, closed.Load(), rec.Closed())
		}
	}
}

// TestCommunicatorOwnsCtxDeadline: the communicator derives the op's
// deadline from the ctx given to the op's method: a ctx deadline earlier
// than the op timeout becomes the timeout the observers (the watchdog)
// see, and cancelling ctx while the op is held aborts the engine and fails
// the op with a *CanceledError naming the op; an op that completed first
// is left alone.
func TestCommunicatorOwnsCtxDeadline(t *testing.T) {
	rec := testrank.NewRecorder(1, 2)
	var timeouts []time.Duration
	_, pg := lifeComm(t, rec, actors.CommunicatorConfig{Supervise: func(*actors.Communicator) actors.Observer {
		return actors.ObserverFunc(func(op *comm.Op, _ *comm.Promise) { timeouts = append(timeouts, op.Timeout) })
	}})
	bg := context.Background()
	dctx, cancelD := context.WithTimeout(bg, 200*time.Millisecond)
	defer cancelD()
	if err := pg.Barrier(dctx, comm.WithOpTimeout(time.Hour)).Wait(bg); err != nil {
		t.Fatal(err)
	}
	if err := pg.Barrier(bg, comm.WithOpTimeout(time.Hour)).Wait(bg); err != nil {
		t.Fatal(err)
	}
	if len(timeouts) != 2 || timeouts[0] <= 0 || timeouts[0] > 200*time.Millisecond || timeouts[1] != time.Hour {
		t.Fatalf("timeouts the observer saw: %v, want [≤200ms 1h]", timeouts)
	}

	// Ops that completed under the ctx are left alone when it is
	// cancelled later; the one in flight fails.
	cctx, cancel := context.WithCancel(bg)
	done := []*comm.Work{pg.Barrier(cctx), pg.Barrier(cctx)}
	for _, w := range done {
		if err := w.Wait(cctx); err != nil {
			t.Fatal(err)
		}
	}
	rec.SetHold(true)
	defer rec.Release(nil)
	w := pg.AllReduce(cctx, comm.NewHostBuffer(comm.Int32, 1), comm.Sum)
	cancel()
	var ce *comm.CanceledError
	if err := w.Wait(bg); !errors.As(err, &ce) || !errors.Is(err, context.Canceled) || ce.Group != "g" || ce.Rank != 1 || ce.FP.Seq != 5 {
		t.Fatalf("cancelled held op: %v, want a *CanceledError of group g, rank 1, seq 5 wrapping context.Canceled", err)
	}
	for i, w := range done {
		if err := w.Err(); err != nil {
			t.Errorf("op %d, completed before the cancel: %v", i+3, err)
		}
	}
	if err := rec.AsyncError(); !errors.As(err, &ce) {
		t.Fatalf("engine abort reason %v, want the *CanceledError (cancelling the op's ctx aborts the communicator)", err)
	}
}
