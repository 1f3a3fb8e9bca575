// Package comm is ranktree's collective-communication API: the public data
// types (DType, ReduceOp, Buffer, Work and the typed errors), the
// ProcessGroup that programs call (c10d's ProcessGroup), the Op descriptor
// and Fingerprint that travel to an engine, and the Backend interface that
// engines (comm/cpu, comm/nccl) implement.
//
// # One op, end to end
//
// A ProcessGroup method (AllReduce, Broadcast, ...) validates its input
// with c10d's rules and wording, lowers the call to one *Op, and submits it
// with its *Promise (allocated in one block with the Op) to the group's
// Launcher — the communicator actor of package actors; the caller gets the
// Promise's read-only *Work. The communicator assigns the op the group's
// next sequence number (Send and Recv, and batches made only of them, use
// a separate P2P counter), records the Fingerprint {group, epoch, seq, op,
// dtype, count, root, shape} on the Promise, tells its Observer (watchdog,
// flight recorder, event publisher) and calls Backend.Launch, in the order
// of its launch queue, on the calling goroutine when the queue is idle.
// The engine completes the Promise, or the watchdog fails it at its
// deadline.
//
// # Work and Promise
//
// A *Work is what callers hold: Wait, Done, IsCompleted, IsSuccess, Err,
// Seq, Fingerprint, OpType, Source, Timings (c10d's Work). It cannot be
// completed through it, as a context.Context cannot be cancelled through
// it. Its producer side is the *Promise (NewPromise), as the cancel func
// is the Context's: Complete, SetFingerprint, SetSeq, SetSource,
// MarkStarted, SetDeadline, SetSpinWait, SetInline, SetOpContext. The runtime, the
// communicator actor, the engines (Backend.Launch), the watchdog
// (actors.Observer) and comm hooks hold Promises; no ProcessGroup method
// returns one. A comm hook or a fake process group may create its own
// Promise and hand out its Work, as a torch comm hook returns a Future it
// fulfils. FailedWork gives a Work already complete with an error.
//
// # Blocking ops
//
// With the Blocking option (torch's async_op=False) a ProcessGroup method
// waits for its op and returns a completed Work. No handle to the op's own
// Work escapes on success, so the op's block is reused for a later
// blocking op once every runtime holder has released it (Promise.Retain,
// Promise.Release; opblock.go): a small blocking op allocates nothing in
// steady state. A runtime holder that keeps a Promise past the call that
// handed it over must Retain it there and Release it once it no longer
// reads or completes it.
//
// # The caller's duties
//
//  1. Issue the collectives of a group in the same order on every member:
//     that order defines their sequence numbers, and a rank that differs
//     gets ErrMismatch (from the CPU engine) or a timeout.
//  2. Leave a Buffer's memory alone until its Work is done (Wait, Done).
//  3. Pass group ranks as roots and peers (GlobalRank / GroupRank convert).
//  4. Call NewGroup, Split, NewSubgroups and NewSubgroupsByEnumeration on
//     every member of the parent group, in the same order (NewGroup with
//     WithLocalSynchronization: on the new group's members only); a
//     process outside the new group gets a Rank -1 group whose ops do
//     nothing. Call MonitoredBarrier on every member, in the same order.
//  5. Check errors with errors.Is: ErrInvalidArgument is a bug in the
//     call (nothing was sent, no seq used); ErrTimeout, ErrAborted,
//     ErrRemoteAbort, ErrMismatch, ErrTransport and ErrEngine leave the
//     communicator unusable — re-create the group (or restart the job);
//     ErrClosed follows Destroy.
//  6. Destroy groups you created when done (the runtime destroys the
//     world group on Close).
//  7. Pass buffers of one dtype, count and (if given, Buffer.WithShape)
//     shape on every rank of a collective; only the V-variants, the uneven
//     list forms of AllGather and ReduceScatter, all-to-all and P2P take
//     sizes that differ per rank. Complex dtypes reduce with Sum, Avg and
//     PreMulSum only.
//
// # Files
//
// processgroup.go (type, config, identity, Destroy), validate.go (input
// checks), dtype.go and shape.go (element types, buffer shapes), processgroup_collectives.go (collectives and their lowering),
// p2p.go (Send/Recv/BatchP2P), coalesce.go (Coalesce), objects.go (byte-blob
// collectives), processgroup_groups.go (NewGroup, Split), subgroups.go
// (local-synchronization NewGroup, NewSubgroups, NewSubgroupsByEnumeration),
// monitored_barrier.go (MonitoredBarrier), work.go (Work, Promise),
// ctxwatch.go (CtxWatch: the ops' contexts, one registration per ctx).
package comm
