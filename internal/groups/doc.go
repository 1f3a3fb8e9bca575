// Package groups owns the lifetime of one rank's process groups: creating a
// group's communicator under an epoch, restarting it under the next epoch,
// Restarted, destroying it, and the rank's bounded teardown, with the
// restart policy's abort watch. The root package ranktree is its only user
// (Runtime.World, Group, NewGroup, RestartGroup, Restarted, Close).
//
// One owner. A Manager's state — the live communicators, the current one
// per group name, the last epoch per name, the restarts under way and the
// restart policy's pure core (core.go) — belongs to one goroutine, the
// owner loop (loop.go), in the manner of etcd's node.go around the pure
// raft.go: every other goroutine sends it a request and waits for the
// answer. Nothing that blocks runs on the loop: connecting an engine, the
// restart's store barrier, closing a communicator and escalating run on the
// caller's goroutine (or one of their own) and report back with a request,
// so that World and Group answer at once whatever is under way.
//
// Epochs. Every communicator is a (group name × epoch); engine rendezvous
// keys, abort/<group>.<epoch>, progress keys and fingerprints are all
// namespaced by it. A process's k-th Init of the same job and rank (its
// incarnation, k = 0, 1, ...) starts its groups at epoch k<<16
// (BaseEpoch), so that keys left in the store by an earlier incarnation (a
// Close then Init in the same process) are never mistaken for the new ones.
// Within an incarnation a group name created again (NewGroup with the same
// WithGroupName) gets the last epoch + 1, and Restart agrees on the last
// epoch + 1 through the store (supervisor.RestartEpoch).
//
// Actor panics. Every communicator actor is a child of the rank's
// supervision root (supervisor.Root). A panic while it handles an op fails
// that op's Work with an *comm.EngineError naming the panic, and the root's
// policy decides what follows (RANKTREE_ACTOR_PANIC): escalate (dump, exit
// supervisor.ExitEscalate) or restart.
//
// Restart policy (RANKTREE_ACTOR_PANIC=restart). The panicking actor is
// restarted in place, and its group is re-created under the next epoch on
// every member, coordinated through the store:
//
//  1. the panicking op fails with comm.ErrEngine; the rank's watchdog then
//     aborts the communicator, writes abort/<group>.<epoch> to the store and
//     dumps; the peers' watchdogs see that key and fail their in-flight ops
//     with comm.ErrRemoteAbort;
//  2. every member's Manager watches the store's abort/ prefix too: on the
//     abort of the epoch it is using for a group — its own or a peer's, for
//     any reason — the restart core (core.go) decides to restart that
//     group, once per epoch, and the Manager runs Restart for it off the
//     loop;
//  3. once all members have arrived, World, Group(name) and Restarted(old)
//     return the new group; ops on the old handle fail with comm.ErrAborted.
//
// A group broken more than MaxAutoRestarts times within AutoRestartWindow,
// or whose members cannot agree on a new epoch, escalates instead.
//
// Teardown bounds. Close and ProcessGroup.Destroy return within CloseGrace
// plus about 2 s whatever the state: in-flight ops get CloseGrace to finish,
// then each later step (closing a communicator, stopping the supervision
// tree) is bounded on its own and, if it overruns, is left to finish in the
// background while Close reports it.
package groups
