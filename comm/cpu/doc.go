// Package cpu is ranktree's built-in CPU collective engine: a comm.Backend
// that runs every collective and point-to-point op of torch.distributed on
// host buffers, between ranks on one host (shared memory) or across hosts
// (TCP). It plays the role of c10d's ProcessGroupGloo.
//
// # Structure
//
//   - engine.go: the Engine (New, Launch, Abort, Close) and its stream, an
//     ordered queue drained by one progress goroutine.
//   - rendezvous.go: addresses and the job secret through the store,
//     authenticated TCP handshakes, shm segment set-up.
//   - connect_inmem.go: the same for the inmem transport, through an
//     InmemHub (transport.InmemHub.Connect).
//   - failure.go: notices that tell peers the communicator broke or was
//     destroyed, their acknowledgements, and blame (the origin rank).
//   - mesh.go, slots.go: Mesh, the interface every message-based
//     algorithm is written against (Gloo's pairs: ordered, fingerprinted
//     messages per peer), and Slots, the interface of the one-step
//     algorithms (*_flat.go: allreduce, broadcast, allgather,
//     reduce-scatter below Options.FlatThreshold) over a group segment.
//     Package comm/cpu/transport implements both.
//   - exec.go: lowers a comm.Op (flat or list buffers, V-variants, Avg,
//     PreMulSum) to an algorithm and picks the algorithm by size.
//   - <collective>_<method>.go: one algorithm per file, pure functions of a
//     Mesh and byte blocks, with no goroutines, timers or sockets.
//     docs/algorithms.md gives each one's cost in steps and bytes.
//
// The transports live in package comm/cpu/transport, beside the
// algorithms as Gloo's gloo/transport/{tcp,uv,ibverbs} sit beside
// gloo/allreduce_*.h: the links (tcp, shm and the in-memory rings), the
// 64-byte wire header, the waits (spin, yield, doorbell), the group segment
// of the one-step algorithms and transport.Mesh, which implements Mesh
// and Slots over one link per peer. transport.InmemMesh connects the
// ranks of a group in memory without an engine; the algorithm tests
// (algorithms_test.go) run every algorithm over it. Reductions use package
// comm/cpu/kernel.
//
// # Caller's duties
//
//  1. Create one Engine per communicator (process group × epoch) on every
//     member with New (or through Factory), with the same Options on all
//     ranks (Transport, ShmRingBytes, RingThreshold and FlatThreshold must
//     agree).
//  2. Launch ops in the same order on every rank, one at a time, with equal
//     fingerprints (comm.ProcessGroup and the communicator actor do this).
//     The engine checks the fingerprint of every message: a rank that gets
//     another op's data fails with *comm.MismatchError and tells its peers,
//     which fail too (a peer that only sends in that op, such as a
//     broadcast root, may complete it first; its next op then fails and
//     AsyncError reports the mismatch).
//  3. Keep an op's buffers untouched until its Work completes.
//  4. After any error other than bad input, treat the communicator as broken
//     (AsyncError reports it; later ops fail with the same error): Abort or
//     Close it and create a new one under a new epoch.
//  5. Call Close to release sockets and shared memory.
package cpu
