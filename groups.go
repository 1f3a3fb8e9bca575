package ranktree

import (
	"context"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/internal/groups"
)

// Process groups: the methods below are the public face of internal/groups,
// whose one owner goroutine creates, restarts, destroys and closes them.
// The package doc's "Process groups and restarts" says what a program does
// when a group breaks.

// WorldGroupName is the name of the default process group (c10d's default_pg).
const WorldGroupName = groups.WorldGroupName

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
func (r *Runtime) World() *comm.ProcessGroup { return r.in.Groups.World() }

// Group returns this rank's live handle of the process group called name
// (the world group is WorldGroupName; subgroups are named by NewGroup,
// Split or comm.WithGroupName): after a restart, the restarted group. It
// returns nil if this rank is not a member of a live group of that name,
// including while a restart is re-creating it (see Runtime.Restarted).
func (r *Runtime) Group(name string) *comm.ProcessGroup { return r.in.Groups.Group(name) }

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
	return r.in.Groups.Restart(ctx, pg)
}

// Restarted waits until the group that old is a handle of has been
// re-created under a later epoch on this rank and returns the new handle —
// at once if that has happened already. Use it under the restart policy
// after an op on old failed (see "Process groups and restarts" in the package doc). Errors: the
// restart's own error; an error wrapping comm.ErrInvalidArgument for a nil
// or non-member old; comm.ErrClosed once Close began; ctx's error if no
// restart completed before ctx ended (with the default escalate policy
// nothing restarts groups by itself: call RestartGroup).
func (r *Runtime) Restarted(ctx context.Context, old *comm.ProcessGroup) (*comm.ProcessGroup, error) {
	return r.in.Groups.Restarted(ctx, old)
}
