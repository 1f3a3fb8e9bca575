package ranktree

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/supervisor"
)

// Communicator restart without restarting processes, and Init after Close.
//
// Epochs. Every communicator is a (group name × epoch); engine rendezvous
// keys, abort/<group>.<epoch>, progress keys and fingerprints are all
// namespaced by it. A process's k-th Init of the same job and rank (its
// incarnation, k = 0, 1, ...) starts its groups at epoch k<<16, and its
// init barrier key is "init" for k = 0 and "init.<k>" after, so that keys
// left in the store by an earlier incarnation (a Close then Init in the same
// process) are never mistaken for the new ones. Every rank must call Init
// the same number of times. Within an incarnation a group name created
// again (NewGroup with the same WithGroupName) gets the last epoch + 1, and
// RestartGroup agrees on the last epoch + 1 through the store.
//
// Actor panics (issue 4, "supervision tree"). Every communicator actor is
// a child of the rank's supervision root (supervisor.Root). A panic while it
// handles an op fails that op's Work with an *comm.EngineError naming the
// panic, and the root's policy decides what follows (RANKTREE_ACTOR_PANIC,
// or the WithActorPanic option):
//
//   - escalate (default): the flight recorder is dumped and the process
//     exits with supervisor.ExitEscalate (4), so that rankrunner restarts the
//     job. The watchdog also sees the failed op and, in TearDown mode,
//     announces the abort so that peers tear down too; the process exits
//     once, with 4.
//   - restart: see "Restart policy" below.
//
// Restart policy (RANKTREE_ACTOR_PANIC=restart; it needs, and by default
// selects, RANKTREE_ASYNC_ERROR_HANDLING=CleanupOnly). The panicking actor
// is restarted in place, and its group is re-created under the next epoch
// on every member, coordinated through the store:
//
//  1. the panicking op fails with comm.ErrEngine; the rank's watchdog then
//     aborts the communicator (its in-flight and later ops fail with
//     comm.ErrAborted), writes abort/<group>.<epoch> to the store and dumps;
//     the peers' watchdogs see that key and fail their in-flight ops with
//     comm.ErrRemoteAbort;
//  2. every member's runtime watches the store's abort/ prefix too: on the
//     abort of the epoch it is using for a group — its own or a peer's, for
//     any reason (a panic, a timeout, an engine error) — it runs the
//     RestartGroup path for that group, once per epoch;
//  3. once all members have arrived (supervisor.RestartEpoch), Runtime.World
//     (for the world group), Runtime.Group(name) (for any group) and
//     Runtime.Restarted(ctx, old) return the new group. Ops on the old
//     handle fail with comm.ErrAborted ("... replaced by a communicator
//     restart").
//
// What the program must do under the restart policy: when an op fails with
// comm.ErrAborted, comm.ErrRemoteAbort, comm.ErrEngine or comm.ErrTimeout,
// call rt.Restarted(ctx, pg) (or re-fetch rt.World() / rt.Group(name) once
// it has a newer Epoch) and carry on with the new handle; it must not keep
// using the old one. Ops in flight when the group broke are lost (their
// Works failed): redo them on the new group, on every rank. If the members
// cannot agree within the store timeout (a member died), or a group breaks
// more than MaxAutoRestarts times within AutoRestartWindow, the rank
// escalates (dump, exit 4) instead. Subgroups made from a restarted group are not re-created
// unless they are aborted themselves.

// incarnations counts Inits per (store, job, rank) in this process.
var incarnations struct {
	mu sync.Mutex
	n  map[string]uint32
}

// nextIncarnation returns how many times this process already entered
// Init's barrier for the same store, job and rank, and counts this one.
// The store's identity matters for tests that run several in-process ranks
// on a fresh MemStore each.
func nextIncarnation(c *config) uint32 {
	key := fmt.Sprintf("%p|%s|%s|%d", c.store, c.natsURL, c.job, c.rank)
	incarnations.mu.Lock()
	defer incarnations.mu.Unlock()
	if incarnations.n == nil {
		incarnations.n = map[string]uint32{}
	}
	k := incarnations.n[key]
	incarnations.n[key] = k + 1
	return k
}

// baseEpoch is the first epoch of groups created by incarnation k.
func baseEpoch(k uint32) uint32 { return k << 16 }

// initBarrierKey picks this Init's incarnation and returns the key of its
// init barrier: InitBarrierKey for the first, "init.<k>" after.
func (r *Runtime) initBarrierKey(c *config) string {
	k := nextIncarnation(c)
	r.grp.incarnation = k
	if k == 0 {
		return InitBarrierKey
	}
	return InitBarrierKey + "." + strconv.FormatUint(uint64(k), 10)
}

// Incarnation is how many times this process had already initialized the
// same job and rank before this Runtime (0 for the first Init).
func (r *Runtime) Incarnation() uint32 { return r.grp.incarnation }

// Bounds of the restart policy: a group restarted automatically more than
// MaxAutoRestarts times within AutoRestartWindow escalates instead (as the
// supervision root's MaxRestarts does for one actor), so that a fault that
// recurs in every epoch ends in a job restart rather than a restart loop.
const (
	MaxAutoRestarts   = 3
	AutoRestartWindow = time.Minute
)

// restartCall is one restart of a communicator epoch: RestartGroup calls
// for the same epoch while it runs (the restart policy's and the
// program's) wait for it instead of entering the store barrier twice.
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

// RestartGroup re-creates pg's communicator under the next epoch without
// restarting processes — the recovery after an abort in CleanupOnly mode
// (RANKTREE_ASYNC_ERROR_HANDLING=2), where torch users destroy and re-create
// the process group. Under the restart policy (see above) the runtime calls
// it by itself. Every member of pg must call it (with its current handle);
// it
//
//  1. aborts pg's communicator and closes it (bounded as Destroy is;
//     in-flight Works fail; later ops on pg fail with comm.ErrAborted),
//  2. agrees with the other members on epoch pg.Epoch()+1 through the store
//     (supervisor.RestartEpoch: a barrier on restart/<group>/<epoch+1>),
//  3. connects a new engine and communicator for the same members and name
//     under that epoch, puts it under the watchdog and flight recorder, and
//     returns its ProcessGroup; if pg is World(), World() returns it from
//     now on, and Group(pg.Name()) does in any case.
//
// A call for an epoch whose restart is already running waits for it and
// returns its result. Sequence numbers start again at 1 in the new epoch.
// Subgroups made from pg are not restarted: restart each that broke.
// Errors: an error wrapping comm.ErrInvalidArgument for a nil pg, a
// non-member or a stale handle (an epoch already restarted); comm.ErrClosed
// after Close; a *store.BarrierError naming the members that did not arrive
// within the runtime's store timeout (the caller should then exit so that
// rankrunner restarts the job); ctx's error; engine connection errors.
func (r *Runtime) RestartGroup(ctx context.Context, pg *comm.ProcessGroup) (*comm.ProcessGroup, error) {
	if pg == nil {
		return nil, fmt.Errorf("ranktree: rank %d: RestartGroup(nil): %w", r.rank, comm.ErrInvalidArgument)
	}
	name, from := pg.Name(), pg.Epoch()
	if !pg.IsMember() {
		return nil, fmt.Errorf("ranktree: rank %d: RestartGroup: not a member of group %q: %w", r.rank, name, comm.ErrInvalidArgument)
	}
	g := &r.grp
	key := supervisor.CommID(name, from)
	g.mu.Lock()
	if g.closing {
		g.mu.Unlock()
		return nil, fmt.Errorf("ranktree: rank %d: restarting group %q: %w: the runtime is closed", r.rank, name, comm.ErrClosed)
	}
	if call := g.restarts[key]; call != nil && !call.finished() {
		g.mu.Unlock()
		select {
		case <-call.done:
			return call.pg, call.err
		case <-ctx.Done():
			return nil, fmt.Errorf("ranktree: rank %d: waiting for the restart of group %q epoch %d: %w", r.rank, name, from, ctx.Err())
		}
	}
	if last := g.epochs[name]; last != from {
		g.mu.Unlock()
		return nil, fmt.Errorf("ranktree: rank %d: RestartGroup: group %q epoch %d is stale (current epoch %d): %w",
			r.rank, name, from, last, comm.ErrInvalidArgument)
	}
	call := &restartCall{done: make(chan struct{})}
	if g.restarts == nil {
		g.restarts = map[string]*restartCall{}
	}
	g.restarts[key] = call
	l := g.current[name]
	if l != nil && l.epoch != from {
		l = nil
	}
	g.mu.Unlock()
	call.pg, call.err = r.restart(ctx, pg, l)
	close(call.done)
	return call.pg, call.err
}

// restart carries out RestartGroup for pg, whose live communicator is l
// (nil if pg was destroyed already).
func (r *Runtime) restart(ctx context.Context, pg *comm.ProcessGroup, l *supervisedLauncher) (*comm.ProcessGroup, error) {
	g := &r.grp
	name, from := pg.Name(), pg.Epoch()
	log := r.log.With().Str("group", name).Uint32("epoch", from).Logger()
	log.Warn().Msg("restarting communicator")
	reason := fmt.Errorf("epoch %d was replaced by a communicator restart (use Runtime.World, Runtime.Group or Runtime.Restarted for the new group)", from)
	if l != nil {
		l.retired.Store(&comm.AbortedError{Group: name, Reason: reason})
		l.Abort(reason)
		if err := l.Close(ctx); err != nil {
			log.Warn().Err(err).Msg("restart: closing the old communicator")
		}
	} else {
		pg.Abort(reason)
		if err := pg.Destroy(ctx); err != nil {
			log.Warn().Err(err).Msg("restart: closing the old communicator")
		}
	}
	next, err := supervisor.RestartEpoch(ctx, r.st, name, from, pg.Rank(), pg.Size(), r.timeout)
	if err != nil {
		return nil, fmt.Errorf("ranktree: rank %d: %w", r.rank, err)
	}
	npg, err := r.createGroupAt(ctx, comm.GroupSpec{Name: name, GlobalRanks: pg.Ranks(), Rank: pg.Rank(), Timeout: pg.Timeout()}, next)
	if err != nil {
		return nil, err
	}
	if name == WorldGroupName {
		g.world.CompareAndSwap(pg, npg)
	}
	if ev := g.sv.Events; ev != nil {
		ev.Emit(actors.Event{Kind: actors.KindRestart, Group: name, Epoch: next, Action: "restart",
			Detail: map[string]string{"from_epoch": strconv.FormatUint(uint64(from), 10)}})
	}
	log.Info().Uint32("new_epoch", next).Msg("communicator restarted")
	return npg, nil
}

// Restarted waits until the group that old is a handle of has been
// re-created under a later epoch on this rank and returns the new handle —
// at once if that has happened already. Use it under the restart policy
// after an op on old failed (see "Restart policy" above). Errors: the
// restart's own error; an error wrapping comm.ErrInvalidArgument for a nil
// or non-member old; comm.ErrClosed once Close began; ctx's error if no
// restart completed before ctx ended (with the default escalate policy
// nothing restarts groups by itself: call RestartGroup).
func (r *Runtime) Restarted(ctx context.Context, old *comm.ProcessGroup) (*comm.ProcessGroup, error) {
	if old == nil || !old.IsMember() {
		return nil, fmt.Errorf("ranktree: rank %d: Restarted needs a handle this rank is a member of: %w", r.rank, comm.ErrInvalidArgument)
	}
	g := &r.grp
	key := supervisor.CommID(old.Name(), old.Epoch())
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		g.mu.Lock()
		closing, call, l := g.closing, g.restarts[key], g.current[old.Name()]
		g.mu.Unlock()
		switch {
		case closing:
			return nil, fmt.Errorf("ranktree: rank %d: waiting for the restart of group %q: %w: the runtime is closed", r.rank, old.Name(), comm.ErrClosed)
		case l != nil && l.epoch > old.Epoch():
			return l.pg, nil
		case call != nil && call.finished() && call.err != nil:
			return nil, call.err
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, fmt.Errorf("ranktree: rank %d: group %q epoch %d was not restarted (policy %v): %w",
				r.rank, old.Name(), old.Epoch(), g.sup.ActorPanic, ctx.Err())
		}
	}
}

// startAbortWatch starts the restart policy's watch of the store's abort/
// prefix (replaying keys already there, so that no abort between a group's
// creation and the watch is missed). Close ends it (closeGroups).
func (r *Runtime) startAbortWatch() error {
	g := &r.grp
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := r.st.Watch(ctx, supervisor.AbortPrefix, true)
	if err != nil {
		cancel()
		return fmt.Errorf("ranktree: rank %d: restart policy: watching %s in the store: %w", r.rank, supervisor.AbortPrefix, err)
	}
	g.mu.Lock()
	g.restart = newRestartCore(true, MaxAutoRestarts, AutoRestartWindow)
	g.mu.Unlock()
	g.watchCtx, g.stopWatch = ctx, cancel
	go func() {
		for ev := range ch {
			if ev.Type == store.EventPut && strings.HasPrefix(ev.Key, supervisor.AbortPrefix) {
				r.onAbort(strings.TrimPrefix(ev.Key, supervisor.AbortPrefix), ev.Value)
			}
		}
	}()
	return nil
}

// onAbort handles abort/<commID> seen in the store: the restart core
// decides (restart_core.go) whether it restarts a group of this rank.
func (r *Runtime) onAbort(commID string, value []byte) {
	rec, ok := parseAbort(commID, value)
	if !ok {
		r.log.Warn().Str("key", supervisor.AbortPrefix+commID).Msg("restart policy: unreadable abort key; ignored")
		return
	}
	g := &r.grp
	g.mu.Lock()
	ev := abortObserved{CommID: commID, Rec: rec, Closing: g.closing}
	if l := g.current[rec.Group]; l != nil {
		ev.Current, ev.HasCurrent = l.epoch, true
	}
	acts := g.restart.Step(ev, time.Now())
	g.mu.Unlock()
	r.carryOut(acts)
}

// carryOut does what the restart core decided. It must be called without
// groups.mu held.
func (r *Runtime) carryOut(acts []restartAction) {
	g := &r.grp
	for _, a := range acts {
		switch a := a.(type) {
		case restartGroupAction:
			g.mu.Lock()
			l := g.current[a.Group]
			g.mu.Unlock()
			if l == nil || l.epoch != a.Epoch {
				continue // replaced meanwhile (the program restarted it)
			}
			go r.autoRestart(l, a.Rec)
		case escalateAction:
			r.escalate(a)
		case quietAction:
			r.log.Debug().Str("group", a.Group).Uint32("epoch", a.Epoch).Err(a.Err).
				Msg("restart policy: restart not completed (runtime closing, or restarted already)")
		}
	}
}

// escalate gives up on a group's epoch: past the restart bound it first
// makes Restarted(old) report that at once, then the rank escalates (dump,
// exit supervisor.ExitEscalate).
func (r *Runtime) escalate(a escalateAction) {
	g := &r.grp
	if a.Count > 0 {
		call := &restartCall{done: make(chan struct{}), err: fmt.Errorf("ranktree: rank %d: group %q epoch %d not restarted: it broke %d times within %v, the restart policy escalates: %w",
			r.rank, a.Group, a.Epoch, a.Count, AutoRestartWindow, comm.ErrAborted)}
		close(call.done)
		g.mu.Lock()
		if g.restarts == nil {
			g.restarts = map[string]*restartCall{}
		}
		g.restarts[supervisor.CommID(a.Group, a.Epoch)] = call
		g.mu.Unlock()
		r.log.Error().Str("group", a.Group).Uint32("epoch", a.Epoch).Int("restarts", a.Count).
			Msg("restart policy: too many restarts; escalating")
		go g.sv.Escalate(fmt.Sprintf("rank %d: group %q broke %d times within %v (last: %s)",
			r.rank, a.Group, a.Count, AutoRestartWindow, a.Rec.Reason))
		return
	}
	r.log.Error().Str("group", a.Group).Uint32("epoch", a.Epoch).Err(a.Err).Msg("restart policy: restart failed; escalating")
	g.sv.Escalate(fmt.Sprintf("rank %d: restarting group %q from epoch %d failed: %v", r.rank, a.Group, a.Epoch, a.Err))
}

// autoRestart restarts l's group (the restart core's restartGroupAction)
// and reports a failure back to the core, which decides whether the rank
// escalates: its group is broken and the members could not agree on a
// new one.
func (r *Runtime) autoRestart(l *supervisedLauncher, rec supervisor.AbortRecord) {
	g := &r.grp
	log := r.log.With().Str("group", l.group).Uint32("epoch", l.epoch).Logger()
	log.Warn().Int("aborted_by", rec.Rank).Str("reason", rec.Reason).Msg("restart policy: group aborted; re-creating it under the next epoch")
	ctx, cancel := context.WithTimeout(g.watchCtx, r.timeout+CloseGrace+closeCommBound)
	defer cancel()
	_, err := r.RestartGroup(ctx, l.pg)
	if err == nil {
		return
	}
	g.mu.Lock()
	acts := g.restart.Step(autoRestartFailed{Group: l.group, Epoch: l.epoch, Err: err,
		Closing: g.closing || g.watchCtx.Err() != nil}, time.Now())
	g.mu.Unlock()
	r.carryOut(acts)
}
