package groups

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
)

// launcher is a group's communicator actor as the ProcessGroup sees it:
// Close also takes the group off the watchdog, and with blocking wait
// (RANKTREE_BLOCKING_WAIT) every Work gets its deadline.
type launcher struct {
	*actors.Communicator
	m        *Manager
	group    string
	epoch    uint32
	blocking bool
	pg       *comm.ProcessGroup // the handle over this communicator; set before it is published

	// retired is set when a restart replaces this communicator: later
	// Submits fail with it (an *AbortedError naming the restart).
	retired atomic.Pointer[comm.AbortedError]

	last      atomic.Pointer[comm.Work] // the last Work submitted (teardown's grace waits for it)
	closeOnce sync.Once
	closeErr  error
}

// Submit implements comm.Launcher. Once a restart has replaced this
// communicator, w fails with an error wrapping comm.ErrAborted that says so.
func (l *launcher) Submit(op *comm.Op, w *comm.Work) {
	if e := l.retired.Load(); e != nil {
		w.Complete(e)
		return
	}
	if l.blocking && op.Timeout > 0 {
		shape, timeout, rank := op.FP, op.Timeout, l.m.cfg.Rank // the identity comes from the communicator (Work.Fingerprint)
		w.SetDeadline(time.Now().Add(timeout), func(elapsed time.Duration) error {
			fp := w.Fingerprint()
			if fp.Seq == 0 { // not scheduled yet: name its shape
				fp = shape
			}
			return &comm.TimeoutError{Rank: rank, FP: fp, Group: l.group, Timeout: timeout, Elapsed: elapsed}
		})
	}
	l.last.Store(w)
	l.Communicator.Submit(op, w)
}

// Close implements comm.Launcher (ProcessGroup.Destroy): it gives in-flight
// ops CloseGrace to finish, then closes the communicator within
// closeCommBound and stops watching the group. Idempotent.
func (l *launcher) Close(ctx context.Context) error {
	return l.closeBy(ctx, time.Now().Add(CloseGrace))
}

// waitInFlight waits until the last Work submitted to l has completed, or
// until graceEnd or ctx ends, whichever comes first. Collectives of a group
// run in submission order, so the last one completing means the others
// have; a P2P op still running is closed under.
func (l *launcher) waitInFlight(ctx context.Context, graceEnd time.Time) {
	w := l.last.Load()
	if w == nil {
		return
	}
	d := time.Until(graceEnd)
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.Done():
	case <-t.C:
	case <-ctx.Done():
	}
}

// closeBy closes l once: in-flight ops until graceEnd, then the
// communicator (bounded by closeCommBound), then the watchdog forgets the
// group if l is still its live communicator. Later calls return the first
// result.
func (l *launcher) closeBy(ctx context.Context, graceEnd time.Time) error {
	l.closeOnce.Do(func() {
		l.waitInFlight(ctx, graceEnd)
		// The watchdog publishes the last Works' completions when it
		// takes the group off (DetachGroup below polls them first).
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeCommBound)
		defer cancel()
		l.closeErr = bounded(fmt.Sprintf("closing the communicator of group %q (epoch %d)", l.group, l.epoch),
			closeCommBound+100*time.Millisecond, func() error { return l.Communicator.Close(cctx) })
		if errors.Is(l.closeErr, comm.ErrClosed) {
			l.closeErr = nil
		}
		if l.m.forget(l) {
			l.m.sv.DetachGroup(l.group)
		}
	})
	return l.closeErr
}

// panicAwareEngine is a group's engine as the watchdog sees it: its async
// error is the engine's, or else the communicator actor's first panic
// (actors.Communicator.PanicErr), so that a panic breaks the group — abort,
// abort/<comm-id> for the peers, dump — even if the panicking op was never
// put under the watchdog. Abort goes to the engine.
type panicAwareEngine struct {
	comm.Backend
	cm atomic.Pointer[actors.Communicator]
}

// AsyncError implements supervisor.AsyncErrorSource.
func (e *panicAwareEngine) AsyncError() error {
	if err := e.Backend.AsyncError(); err != nil {
		return err
	}
	if c := e.cm.Load(); c != nil {
		return c.PanicErr()
	}
	return nil
}
