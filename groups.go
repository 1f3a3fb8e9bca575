package ranktree

import (
	"context"
	"fmt"
	"strconv"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/internal/groups"
)

// Process groups. Their lifetime (create under an epoch, restart under the
// next one, destroy, teardown, the restart policy's abort watch) is owned by
// one goroutine of internal/groups; the methods below are its public face.
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
// escalates (dump, exit 4) instead. Subgroups made from a restarted group
// are not re-created unless they are aborted themselves.

// Bounds of the restart policy: a group restarted automatically more than
// MaxAutoRestarts times within AutoRestartWindow escalates instead (as the
// supervision root's MaxRestarts does for one actor), so that a fault that
// recurs in every epoch ends in a job restart rather than a restart loop.
const (
	MaxAutoRestarts   = groups.MaxAutoRestarts
	AutoRestartWindow = groups.AutoRestartWindow
)

// CloseGrace is how long Close and Destroy let in-flight ops finish before
// closing the engine under them. Teardown bounds (issue 4, "Teardown"):
// Runtime.Close and ProcessGroup.Destroy return within CloseGrace plus about
// 2 s whatever the state — peers gone, an op hung in the engine, NATS down.
// In-flight ops first get CloseGrace to finish (c10d's
// destroy_process_group waits for pending work; we bound the wait); what is
// still running then fails with an error wrapping comm.ErrClosed (or
// comm.ErrAborted if the watchdog got there first). Each later step is
// bounded on its own and, if it overruns, is left to finish in the
// background while Close reports it.
const CloseGrace = groups.CloseGrace

// World is the default process group: every rank of the job, group rank =
// global rank (torch.distributed's default group / group.WORLD). After
// RestartGroup(World()), or an automatic restart under the restart policy,
// it is the restarted group.
func (r *Runtime) World() *comm.ProcessGroup { return r.grp.World() }

// Group returns this rank's live handle of the process group called name
// (the world group is WorldGroupName; subgroups are named by NewGroup,
// Split or comm.WithGroupName): after a restart, the restarted group. It
// returns nil if this rank is not a member of a live group of that name,
// including while a restart is re-creating it (see Runtime.Restarted).
func (r *Runtime) Group(name string) *comm.ProcessGroup { return r.grp.Group(name) }

// NewGroup creates a process group of the given global ranks. Every rank of
// the job must call it, in the same order; non-members get a group whose
// Rank is -1 (torch.distributed.new_group). With
// comm.WithLocalSynchronization only the members call it (torch's
// use_local_synchronization=True; see comm.ProcessGroup.NewGroup). Errors: an error wrapping
// comm.ErrInvalidArgument for bad ranks; comm.ErrClosed after Close;
// engine connection errors.
func (r *Runtime) NewGroup(ctx context.Context, ranks []int, opts ...comm.GroupOption) (*comm.ProcessGroup, error) {
	return r.World().NewGroup(ctx, ranks, opts...)
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
	return r.grp.Restart(ctx, pg)
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
	return r.grp.Restarted(ctx, old)
}

// Incarnation is how many times this process had already initialized the
// same job and rank before this Runtime (0 for the first Init).
func (r *Runtime) Incarnation() uint32 { return r.incarnation }

// initBarrierKey picks this Init's incarnation and returns the key of its
// init barrier: InitBarrierKey for the first, "init.<k>" after.
func (r *Runtime) initBarrierKey(c *config) string {
	k := groups.NextIncarnation(fmt.Sprintf("%p|%s|%s|%d", c.store, c.natsURL, c.job, c.rank))
	r.incarnation = k
	if k == 0 {
		return InitBarrierKey
	}
	return InitBarrierKey + "." + strconv.FormatUint(uint64(k), 10)
}
