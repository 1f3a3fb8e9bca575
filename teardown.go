package ranktree

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// Teardown bounds (issue 4, "Teardown"): Runtime.Close and
// ProcessGroup.Destroy return within CloseGrace plus about 2 s whatever the
// state — peers gone, an op hung in the engine, NATS down. In-flight ops
// first get CloseGrace to finish (c10d's destroy_process_group waits for
// pending work; we bound the wait); what is still running then fails with an
// error wrapping comm.ErrClosed (or comm.ErrAborted if the watchdog got
// there first). Each later step is bounded on its own and, if it overruns,
// is left to finish in the background while Close reports it.
const (
	// CloseGrace is how long Close and Destroy let in-flight ops finish
	// before closing the engine under them.
	CloseGrace = 2 * time.Second
	// closeCommBound bounds closing one communicator (actor drain and
	// engine close), after the grace period.
	closeCommBound = time.Second
	// closeSupervisionBound bounds stopping the rank's supervision tree
	// (watchdog, heartbeat monitor, event flush, root) and the actor system.
	closeSupervisionBound = 800 * time.Millisecond
)

// bounded runs f and returns its error, or a timeout error naming what
// once d has passed (f then finishes in the background).
func bounded(what string, d time.Duration, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return fmt.Errorf("ranktree: %s did not finish within %v (left running)", what, d)
	}
}

// waitInFlight waits until the last Work submitted to l has completed, or
// until graceEnd or ctx ends, whichever comes first. Collectives of a group
// run in submission order, so the last one completing means the others
// have; a P2P op still running is closed under.
func (l *supervisedLauncher) waitInFlight(ctx context.Context, graceEnd time.Time) {
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
func (l *supervisedLauncher) closeBy(ctx context.Context, graceEnd time.Time) error {
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
		if l.rt.forget(l) {
			l.sv.DetachGroup(l.group)
		}
	})
	return l.closeErr
}

// forget removes l from the runtime's live communicators and reports
// whether it was its group's current one (a closed stale epoch must not
// take its successor off the watchdog).
func (r *Runtime) forget(l *supervisedLauncher) bool {
	g := &r.grp
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, c := range g.comms {
		if c == l {
			g.comms = append(g.comms[:i], g.comms[i+1:]...)
			break
		}
	}
	if g.current[l.group] == l {
		delete(g.current, l.group)
		return true
	}
	return false
}

// closeGroups is the runtime's teardown (registered with onClose): no new
// groups and no automatic restarts from now on; every communicator gets one shared grace period for
// its in-flight ops and is then closed, all concurrently; then the
// supervision tree and the actor system stop. Every step is bounded.
func (r *Runtime) closeGroups(ctx context.Context) error {
	g := &r.grp
	g.mu.Lock()
	g.closing = true
	comms := append([]*supervisedLauncher(nil), g.comms...)
	g.mu.Unlock()
	if g.stopWatch != nil {
		g.stopWatch() // the restart policy's watch; restarts under way end
	}
	graceEnd := time.Now().Add(CloseGrace)
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for i, l := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = l.closeBy(ctx, graceEnd)
		}()
	}
	wg.Wait()
	errs = append(errs, bounded("stopping the supervision tree", closeSupervisionBound+200*time.Millisecond, func() error {
		err := g.sv.Close(closeSupervisionBound)
		g.system.Shutdown()
		return err
	}))
	if err := errors.Join(errs...); err != nil {
		r.log.Warn().Err(err).Msg("teardown incomplete")
		return err
	}
	return nil
}
