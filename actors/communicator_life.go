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
		fp := w.Fingerprint()
		if fp.Seq == 0 { // not scheduled yet: name its shape
			fp = shape
		}
		return &comm.TimeoutError{Rank: rank, FP: fp, Group: c.group, Timeout: timeout, Elapsed: elapsed}
	})
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
	w := c.last.Load()
	d := time.Until(graceEnd)
	if w == nil || d <= 0 {
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
