package ranktree

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
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
// Actor panics. A panic in one of the supervision root's children (the
// watchdog, the heartbeat monitor, the event publisher) follows the root's
// policy, Escalate by default: the flight recorder is dumped and the process
// exits with supervisor.ExitEscalate so that rankrunner restarts the job.
// Communicator actors are spawned at the actor system's root and protoactor
// restarts a panicking one in place with its sequence counters kept (the
// message being handled is lost, so its Work never completes and the
// watchdog times it out, which then aborts the group like any other
// timeout); recovering from that is RestartGroup, called by the program
// after it sees the error, exactly as after a timeout in CleanupOnly mode.

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

// RestartGroup re-creates pg's communicator under the next epoch without
// restarting processes — the recovery after an abort in CleanupOnly mode
// (RANKTREE_ASYNC_ERROR_HANDLING=2), where torch users destroy and re-create
// the process group. Every member of pg must call it (with its current
// handle); it
//
//  1. aborts and destroys pg (bounded as Destroy is; in-flight Works fail),
//  2. agrees with the other members on epoch pg.Epoch()+1 through the store
//     (supervisor.RestartEpoch: a barrier on restart/<group>/<epoch+1>),
//  3. connects a new engine and communicator for the same members and name
//     under that epoch, puts it under the watchdog and flight recorder, and
//     returns its ProcessGroup; if pg is World(), World() returns it from
//     now on.
//
// Sequence numbers start again at 1 in the new epoch. Subgroups made from
// pg are not restarted: restart each that broke. Errors: an error wrapping
// comm.ErrInvalidArgument for a nil pg, a non-member or a stale handle (an
// epoch already restarted); comm.ErrClosed after Close; a
// *store.BarrierError naming the members that did not arrive within the
// runtime's store timeout (the caller should then exit so that rankrunner
// restarts the job); engine connection errors.
func (r *Runtime) RestartGroup(ctx context.Context, pg *comm.ProcessGroup) (*comm.ProcessGroup, error) {
	if pg == nil {
		return nil, fmt.Errorf("ranktree: rank %d: RestartGroup(nil): %w", r.rank, comm.ErrInvalidArgument)
	}
	name, from := pg.Name(), pg.Epoch()
	if !pg.IsMember() {
		return nil, fmt.Errorf("ranktree: rank %d: RestartGroup: not a member of group %q: %w", r.rank, name, comm.ErrInvalidArgument)
	}
	g := &r.grp
	g.mu.Lock()
	closing, last := g.closing, g.epochs[name]
	g.mu.Unlock()
	if closing {
		return nil, fmt.Errorf("ranktree: rank %d: restarting group %q: %w: the runtime is closed", r.rank, name, comm.ErrClosed)
	}
	if last != from {
		return nil, fmt.Errorf("ranktree: rank %d: RestartGroup: group %q epoch %d is stale (current epoch %d): %w",
			r.rank, name, from, last, comm.ErrInvalidArgument)
	}
	log := r.log.With().Str("group", name).Uint32("epoch", from).Logger()
	log.Warn().Msg("restarting communicator")
	pg.Abort(errors.New("communicator restart requested"))
	if err := pg.Destroy(ctx); err != nil {
		log.Warn().Err(err).Msg("restart: closing the old communicator")
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
		r.grp.world.CompareAndSwap(pg, npg)
	}
	if ev := g.sv.Events; ev != nil {
		ev.Emit(actors.Event{Kind: actors.KindRestart, Group: name, Epoch: next, Action: "restart",
			Detail: map[string]string{"from_epoch": strconv.FormatUint(uint64(from), 10)}})
	}
	log.Info().Uint32("new_epoch", next).Msg("communicator restarted")
	return npg, nil
}
