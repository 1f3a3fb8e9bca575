package actors

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// The communicator's lifetime duties besides launching: blocking-wait
// deadlines, retirement by a restart, and the bounded close with a grace
// period for the last op. The group's owner (internal/groups) configures
// them (CommunicatorConfig) and calls Retire and CloseBy.

// setDeadline gives p's Work op's timeout as its deadline (BlockingWait):
// Wait then fails with a *comm.TimeoutError naming the op's fingerprint,
// or its shape if the actor has not scheduled it yet.
func (c *Communicator) setDeadline(op *comm.Op, p *comm.Promise) {
	shape, timeout, rank, w := op.FP, op.Timeout, c.cfg.Rank, p.Work()
	p.SetDeadline(time.Now().Add(timeout), func(elapsed time.Duration) error {
		return &comm.TimeoutError{Rank: rank, FP: fingerprintOr(w, shape), Group: c.group, Timeout: timeout, Elapsed: elapsed}
	})
}

// fingerprintOr is w's fingerprint, or shape (the op's lowered
// fingerprint, without identity) if the actor has not scheduled it yet.
func fingerprintOr(w *comm.Work, shape comm.Fingerprint) comm.Fingerprint {
	if fp := w.Fingerprint(); fp.Seq != 0 {
		return fp
	}
	return shape
}

// applyContext makes the communicator the owner of op's deadline from
// ctx, the ctx given to the op's ProcessGroup method: a ctx deadline
// earlier than op.Timeout becomes op's timeout (the watchdog then fails
// the op with a *comm.TimeoutError and aborts, exactly as for the op
// timeout). It runs before the op is launched, so the observers see the
// final timeout. Cancelling ctx before the op completes aborts the
// communicator and fails the op with a *comm.CanceledError, since a
// collective cannot be left half-done: the launch binds the op to ctx
// (comm.CtxWatch, one registration per distinct ctx, not per op) and
// ctxDone acts when it ends.
func (c *Communicator) applyContext(ctx context.Context, op *comm.Op, p *comm.Promise) {
	if ctx == nil {
		return
	}
	if dl, ok := ctx.Deadline(); ok {
		if d := time.Until(dl); d < op.Timeout {
			op.Timeout = max(d, time.Nanosecond)
		}
	}
	p.SetOpContext(ctx)
}

// ctxDone is the CtxWatch's callback: ctx ended while the ops of ps were
// in flight (launched: their fingerprints are set). A cancelled ctx aborts
// the communicator and fails each with a *comm.CanceledError naming it; a
// deadline is the ops' timeout already, which the watchdog enforces.
func (c *Communicator) ctxDone(ctx context.Context, ps []*comm.Promise) {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return // the op's timeout is the deadline: the watchdog fails it
	}
	aborted := false
	for _, p := range ps {
		w := p.Work()
		if w.IsCompleted() {
			continue
		}
		err := &comm.CanceledError{Group: c.group, Rank: c.backend.Rank(), FP: w.Fingerprint(), Err: ctx.Err()}
		if !aborted {
			aborted = true
			c.log.Warn().Err(err).Msg("op abandoned by its ctx; aborting the communicator")
			// Abort first: once the Work has failed, every peer knows
			// (the engine's Abort waits for their acknowledgements). The
			// engine then fails the Work with an *AbortedError wrapping
			// err, unless this Complete comes first.
			c.Abort(err)
		}
		p.Complete(err)
	}
}

// Retire marks the communicator as replaced (a restart under a new epoch):
// every later Submit fails with e, an error wrapping comm.ErrAborted that
// names the restart. It neither aborts nor closes: the owner does both.
func (c *Communicator) Retire(e *comm.AbortedError) { c.retired.Store(e) }

// Epoch is the communicator's epoch.
func (c *Communicator) Epoch() uint32 { return c.epoch }

// CloseBy closes the communicator once: the last submitted op gets until
// graceEnd (or ctx's end) to finish — ops of a group complete in
// submission order, so the others have then too; a P2P op still running
// is closed under — then the actor and the engine close, bounded by
// CloseBound, then OnClosed runs. Close is CloseBy(now + CloseGrace); the
// rank's teardown gives every group one shared graceEnd. An ErrClosed from
// the engine is not reported. Later calls return the first result.
func (c *Communicator) CloseBy(ctx context.Context, graceEnd time.Time) error {
	c.closeOnce.Do(func() {
		c.waitLast(ctx, graceEnd)
		err := c.stopBounded(ctx)
		if p := c.last.Swap(nil); p != nil {
			p.Release()
		}
		if errors.Is(err, comm.ErrClosed) {
			err = nil
		}
		c.closeErr = err
		if c.cfg.OnClosed != nil {
			c.cfg.OnClosed(c)
		}
	})
	return c.closeErr
}

// waitLast waits until the last submitted Work has completed, or graceEnd
// or ctx ends.
func (c *Communicator) waitLast(ctx context.Context, graceEnd time.Time) {
	d := time.Until(graceEnd)
	if d <= 0 {
		return
	}
	p := c.pinLast()
	if p == nil {
		return
	}
	defer p.Release()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.Work().Done():
	case <-t.C:
	case <-ctx.Done():
	}
}

// pinLast returns the last submitted op's Promise with a reference of
// its own (Promise.TryRetain), or nil if none was submitted. c.last holds
// its Promise, but a Submit may swap it out and release it between the
// load and the pin: the pin then fails (its block went back to the pool),
// or holds a block reused since, which c.last no longer holds; either way
// it looks again.
func (c *Communicator) pinLast() *comm.Promise {
	for {
		p := c.last.Load()
		if p == nil {
			return nil
		}
		if p.TryRetain() {
			if c.last.Load() == p {
				return p
			}
			p.Release()
		}
	}
}

// stopBounded runs stop within CloseBound (if set): past it, stop is left
// to finish in the background and an error says so.
func (c *Communicator) stopBounded(ctx context.Context) error {
	bound := c.cfg.CloseBound
	if bound <= 0 {
		return c.stop(ctx)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bound)
	done := make(chan error, 1)
	go func() {
		defer cancel()
		done <- c.stop(cctx)
	}()
	t := time.NewTimer(bound + 100*time.Millisecond)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return fmt.Errorf("ranktree: closing the communicator of group %q (epoch %d) did not finish within %v (left running)",
			c.group, c.epoch, bound+100*time.Millisecond)
	}
}
