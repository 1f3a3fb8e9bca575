package groups

import (
	"fmt"
	"time"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/supervisor"
)

// state is what the owner loop owns. Only the loop's goroutine reads or
// writes it: other goroutines reach it through Manager.do.
type state struct {
	closing bool // Close began: no new groups, no restarts
	stopped bool // the loop ends after this request (end of Close)

	comms    []*member               // live communicators, oldest first
	current  map[string]*member      // group name → its live communicator
	epochs   map[string]uint32       // group name → last epoch used
	restarts map[string]*restartCall // CommID of a restarted epoch → its restart
	core     *restartCore            // the restart policy's pure core (core.go); nil without the policy

	// changed is closed, and replaced, whenever a group becomes current
	// or a restart ends or Close begins: Restarted waits on it.
	changed chan struct{}
}

// member is the owner's record of one live communicator: the group's
// handle over it, for Group and Restarted. It is bookkeeping, not a layer
// on the op path (the ProcessGroup submits to the communicator itself).
type member struct {
	cm    *actors.Communicator
	pg    *comm.ProcessGroup
	group string
	epoch uint32
}

func newState(policy bool) *state {
	s := &state{current: map[string]*member{}, epochs: map[string]uint32{},
		restarts: map[string]*restartCall{}, changed: make(chan struct{})}
	if policy {
		s.core = newRestartCore(true, MaxAutoRestarts, AutoRestartWindow)
	}
	return s
}

// notify wakes everything waiting on changed.
func (s *state) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// run is the owner loop: it applies requests one at a time until one
// sets stopped. A request only reads and writes state and starts
// goroutines; it never blocks.
func (m *Manager) run(s *state) {
	defer close(m.done)
	for f := range m.reqs {
		f(s)
		if s.stopped {
			return
		}
	}
}

// do runs f on the owner loop and waits for it. It reports false, without
// running f, once the loop has ended (after Close).
func (m *Manager) do(f func(*state)) bool {
	ran := make(chan struct{})
	select {
	case m.reqs <- func(s *state) { f(s); close(ran) }:
		<-ran
		return true
	case <-m.done:
		return false
	}
}

// stopLoop ends the owner loop; later requests are refused.
func (m *Manager) stopLoop() { m.do(func(s *state) { s.stopped = true }) }

// step feeds ev to the restart core (on the loop) and carries out what it
// decides.
func (m *Manager) step(s *state, ev restartEvent) {
	if s.core == nil {
		return
	}
	m.carryOut(s, s.core.Step(ev, time.Now()))
}

// carryOut does what the restart core decided, on the loop: a restart and
// an escalation run on goroutines of their own.
func (m *Manager) carryOut(s *state, acts []restartAction) {
	for _, a := range acts {
		switch a := a.(type) {
		case restartGroupAction:
			l := s.current[a.Group]
			if l == nil || l.epoch != a.Epoch {
				continue // replaced meanwhile (the program restarted it)
			}
			go m.autoRestart(l, a.Rec)
		case escalateAction:
			m.escalate(s, a)
		case quietAction:
			m.cfg.Log.Debug().Str("group", a.Group).Uint32("epoch", a.Epoch).Err(a.Err).
				Msg("restart policy: restart not completed (runtime closing, or restarted already)")
		}
	}
}

// escalate gives up on a group's epoch: past the restart bound it first
// makes Restarted(old) report that at once, then the rank escalates (dump,
// exit supervisor.ExitEscalate) off the loop.
func (m *Manager) escalate(s *state, a escalateAction) {
	log := m.cfg.Log.Error().Str("group", a.Group).Uint32("epoch", a.Epoch)
	if a.Count == 0 {
		log.Err(a.Err).Msg("restart policy: restart failed; escalating")
		go m.sv.Escalate(fmt.Sprintf("rank %d: restarting group %q from epoch %d failed: %v", m.cfg.Rank, a.Group, a.Epoch, a.Err))
		return
	}
	call := &restartCall{done: make(chan struct{}), err: fmt.Errorf("ranktree: rank %d: group %q epoch %d not restarted: it broke %d times within %v, the restart policy escalates: %w",
		m.cfg.Rank, a.Group, a.Epoch, a.Count, AutoRestartWindow, comm.ErrAborted)}
	close(call.done)
	s.restarts[supervisor.CommID(a.Group, a.Epoch)] = call
	s.notify()
	log.Int("restarts", a.Count).Msg("restart policy: too many restarts; escalating")
	go m.sv.Escalate(fmt.Sprintf("rank %d: group %q broke %d times within %v (last: %s)",
		m.cfg.Rank, a.Group, a.Count, AutoRestartWindow, a.Rec.Reason))
}
