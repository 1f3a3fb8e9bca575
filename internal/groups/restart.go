package groups

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/supervisor"
)

// restartCall is one restart of a communicator epoch: Restart calls for
// the same epoch while it runs (the restart policy's and the program's)
// wait for it instead of entering the store barrier twice.
type restartCall struct {
	done chan struct{} // closed when pg and err are set
	pg   *comm.ProcessGroup
	err  error
}

func (c *restartCall) finished() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Restart re-creates pg's communicator under the next epoch (see
// ranktree.Runtime.RestartGroup for the contract): it aborts and closes
// pg's communicator, agrees with the other members on epoch pg.Epoch()+1
// through the store, and connects a new engine and communicator under that
// epoch. All of it runs on the caller's goroutine; the loop records the
// call so that a second call for the same epoch waits for this one.
func (m *Manager) Restart(ctx context.Context, pg *comm.ProcessGroup) (*comm.ProcessGroup, error) {
	if pg == nil {
		return nil, fmt.Errorf("ranktree: rank %d: RestartGroup(nil): %w", m.cfg.Rank, comm.ErrInvalidArgument)
	}
	name, from := pg.Name(), pg.Epoch()
	if !pg.IsMember() {
		return nil, fmt.Errorf("ranktree: rank %d: RestartGroup: not a member of group %q: %w", m.cfg.Rank, name, comm.ErrInvalidArgument)
	}
	call, running, l, err := m.beginRestart(name, from)
	if err != nil {
		return nil, err
	}
	if running {
		select {
		case <-call.done:
			return call.pg, call.err
		case <-ctx.Done():
			return nil, fmt.Errorf("ranktree: rank %d: waiting for the restart of group %q epoch %d: %w", m.cfg.Rank, name, from, ctx.Err())
		}
	}
	call.pg, call.err = m.restart(ctx, pg, l)
	close(call.done)
	m.do((*state).notify)
	return call.pg, call.err
}

// beginRestart records, on the loop, a restart of name from epoch from,
// or finds the one already running (running true). l is the group's live
// communicator at that epoch, nil if it was destroyed already.
func (m *Manager) beginRestart(name string, from uint32) (call *restartCall, running bool, l *member, err error) {
	key := supervisor.CommID(name, from)
	err = m.closedErr("restarting", name)
	m.do(func(s *state) {
		if s.closing {
			return
		}
		if c := s.restarts[key]; c != nil && !c.finished() {
			call, running, err = c, true, nil
			return
		}
		if last := s.epochs[name]; last != from {
			err = fmt.Errorf("ranktree: rank %d: RestartGroup: group %q epoch %d is stale (current epoch %d): %w",
				m.cfg.Rank, name, from, last, comm.ErrInvalidArgument)
			return
		}
		call, err = &restartCall{done: make(chan struct{})}, nil
		s.restarts[key] = call
		if c := s.current[name]; c != nil && c.epoch == from {
			l = c
		}
	})
	return call, running, l, err
}

// restart carries out Restart for pg, whose live communicator is l (nil
// if pg was destroyed already).
func (m *Manager) restart(ctx context.Context, pg *comm.ProcessGroup, l *member) (*comm.ProcessGroup, error) {
	name, from := pg.Name(), pg.Epoch()
	log := m.cfg.Log.With().Str("group", name).Uint32("epoch", from).Logger()
	log.Warn().Msg("restarting communicator")
	reason := fmt.Errorf("epoch %d was replaced by a communicator restart (use Runtime.World, Runtime.Group or Runtime.Restarted for the new group)", from)
	if l != nil {
		l.cm.Retire(&comm.AbortedError{Group: name, Reason: reason})
		l.cm.Abort(reason)
		if err := l.cm.Close(ctx); err != nil {
			log.Warn().Err(err).Msg("restart: closing the old communicator")
		}
	} else {
		pg.Abort(reason)
		if err := pg.Destroy(ctx); err != nil {
			log.Warn().Err(err).Msg("restart: closing the old communicator")
		}
	}
	next, err := supervisor.RestartEpoch(ctx, m.cfg.Store, name, from, pg.Rank(), pg.Size(), m.cfg.Timeout)
	if err != nil {
		return nil, fmt.Errorf("ranktree: rank %d: %w", m.cfg.Rank, err)
	}
	npg, err := m.createAt(ctx, comm.GroupSpec{Name: name, GlobalRanks: pg.Ranks(), Rank: pg.Rank(), Timeout: pg.Timeout()}, next, pg)
	if err != nil {
		return nil, err
	}
	if ev := m.sv.Events; ev != nil {
		ev.Emit(actors.Event{Kind: actors.KindRestart, Group: name, Epoch: next, Action: "restart",
			Detail: map[string]string{"from_epoch": strconv.FormatUint(uint64(from), 10)}})
	}
	log.Info().Uint32("new_epoch", next).Msg("communicator restarted")
	return npg, nil
}

// Restarted waits until the group that old is a handle of has been
// re-created under a later epoch on this rank and returns the new handle,
// at once if that has happened already (see
// ranktree.Runtime.Restarted). It waits on the loop's change signal, not
// by polling.
func (m *Manager) Restarted(ctx context.Context, old *comm.ProcessGroup) (*comm.ProcessGroup, error) {
	if old == nil || !old.IsMember() {
		return nil, fmt.Errorf("ranktree: rank %d: Restarted needs a handle this rank is a member of: %w", m.cfg.Rank, comm.ErrInvalidArgument)
	}
	key := supervisor.CommID(old.Name(), old.Epoch())
	for {
		closing, changed := true, (chan struct{})(nil)
		var call *restartCall
		var l *member
		m.do(func(s *state) {
			closing, call, l, changed = s.closing, s.restarts[key], s.current[old.Name()], s.changed
		})
		switch {
		case closing:
			return nil, fmt.Errorf("ranktree: rank %d: waiting for the restart of group %q: %w: the runtime is closed", m.cfg.Rank, old.Name(), comm.ErrClosed)
		case l != nil && l.epoch > old.Epoch():
			return l.pg, nil
		case call != nil && call.finished() && call.err != nil:
			return nil, call.err
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("ranktree: rank %d: group %q epoch %d was not restarted (policy %v): %w",
				m.cfg.Rank, old.Name(), old.Epoch(), m.cfg.Supervision.ActorPanic, ctx.Err())
		}
	}
}

// startAbortWatch starts the restart policy's watch of the store's abort/
// prefix (replaying keys already there, so that no abort between a group's
// creation and the watch is missed). Close ends it (stopWatch).
func (m *Manager) startAbortWatch() error {
	ch, err := m.cfg.Store.Watch(m.watchCtx, supervisor.AbortPrefix, true)
	if err != nil {
		return fmt.Errorf("ranktree: rank %d: restart policy: watching %s in the store: %w", m.cfg.Rank, supervisor.AbortPrefix, err)
	}
	go func() {
		for ev := range ch {
			if ev.Type == store.EventPut && strings.HasPrefix(ev.Key, supervisor.AbortPrefix) {
				m.onAbort(strings.TrimPrefix(ev.Key, supervisor.AbortPrefix), ev.Value)
			}
		}
	}()
	return nil
}

// onAbort hands abort/<commID> seen in the store to the loop, where the
// restart core decides whether it restarts a group of this rank.
func (m *Manager) onAbort(commID string, value []byte) {
	rec, ok := parseAbort(commID, value)
	if !ok {
		m.cfg.Log.Warn().Str("key", supervisor.AbortPrefix+commID).Msg("restart policy: unreadable abort key; ignored")
		return
	}
	m.do(func(s *state) {
		ev := abortObserved{CommID: commID, Rec: rec, Closing: s.closing}
		if l := s.current[rec.Group]; l != nil {
			ev.Current, ev.HasCurrent = l.epoch, true
		}
		m.step(s, ev)
	})
}

// autoRestart restarts l's group (the restart core's restartGroupAction)
// off the loop, and reports a failure back to the core, which decides
// whether the rank escalates: its group is broken and the members could
// not agree on a new one.
func (m *Manager) autoRestart(l *member, rec supervisor.AbortRecord) {
	log := m.cfg.Log.With().Str("group", l.group).Uint32("epoch", l.epoch).Logger()
	log.Warn().Int("aborted_by", rec.Rank).Str("reason", rec.Reason).Msg("restart policy: group aborted; re-creating it under the next epoch")
	ctx, cancel := context.WithTimeout(m.watchCtx, m.cfg.Timeout+CloseGrace+closeCommBound)
	defer cancel()
	_, err := m.Restart(ctx, l.pg)
	if err == nil {
		return
	}
	m.do(func(s *state) {
		m.step(s, autoRestartFailed{Group: l.group, Epoch: l.epoch, Err: err,
			Closing: s.closing || m.watchCtx.Err() != nil})
	})
}
