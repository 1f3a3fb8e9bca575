package groups

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ranktree/ranktree/actors"
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

// closed is a communicator's OnClosed: the owner forgets it (on the loop)
// and, if it was its group's current one, takes the group off the
// watchdog (a closed stale epoch must not take its successor off).
func (m *Manager) closed(group string, cm *actors.Communicator) {
	current := false
	m.do(func(s *state) {
		for i, c := range s.comms {
			if c.cm == cm {
				s.comms = append(s.comms[:i], s.comms[i+1:]...)
				break
			}
		}
		if l := s.current[group]; l != nil && l.cm == cm {
			delete(s.current, group)
			current = true
		}
	})
	if current {
		m.sv.DetachGroup(group)
	}
}

// Close is the rank's teardown: no new groups and no automatic restarts
// from now on; every communicator gets one shared grace period (CloseGrace)
// for its in-flight ops and is then closed, all concurrently, off the
// loop; then the supervision tree and the actor system stop, and the owner
// loop ends. Every step is bounded. Idempotent: later calls return the
// first call's result.
func (m *Manager) Close(ctx context.Context) error {
	m.closeOnce.Do(func() { m.closeErr = m.teardown(ctx) })
	return m.closeErr
}

// teardown is Close's one run.
func (m *Manager) teardown(ctx context.Context) error {
	var comms []*member
	m.do(func(s *state) {
		s.closing = true
		comms = append(comms, s.comms...)
		s.notify()
	})
	m.stopWatch() // the restart policy's watch; restarts under way end
	graceEnd := time.Now().Add(CloseGrace)
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for i, l := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = l.cm.CloseBy(ctx, graceEnd)
		}()
	}
	wg.Wait()
	errs = append(errs, bounded("stopping the supervision tree", closeSupervisionBound+200*time.Millisecond, func() error {
		err := m.sv.Close(closeSupervisionBound)
		m.system.Shutdown()
		return err
	}))
	m.stopLoop()
	if err := errors.Join(errs...); err != nil {
		m.cfg.Log.Warn().Err(err).Msg("teardown incomplete")
		return err
	}
	return nil
}
