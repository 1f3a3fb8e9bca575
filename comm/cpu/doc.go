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
//   - link.go, tcp.go, shm.go, inmem.go: the transport interface (link) and
//     its implementations (inmem: the shm rings over Go memory, for ranks
//     as goroutines of one process); header.go: the 64-byte wire header;
//     shm_copy.go: how whole 1 MiB ring slots are copied (streaming or
//     cached stores, chosen per link by measured speed).
//   - mesh.go, p2p.go: Mesh, the interface every algorithm is written
//     against (Gloo's pairs): ordered, fingerprinted messages per peer.
//   - shm_group.go, futex_linux.go, mesh_flat.go: the group segment of a
//     group whose 2..8 ranks are all on one host (per-rank double-buffered
//     slots, sequence words, futex bells), the wait policy (spin at most
//     50 µs, then FUTEX_WAIT in 1 ms slices; see docs/algorithms.md,
//     "Waiting"), and Slots, the interface of the one-step algorithms
//     (*_flat.go: allreduce, broadcast, allgather, reduce-scatter below
//     Options.FlatThreshold).
//   - exec.go: lowers a comm.Op (flat or list buffers, V-variants, Avg,
//     PreMulSum) to an algorithm and picks the algorithm by size.
//   - <collective>_<method>.go: one algorithm per file, pure functions of a
//     Mesh and byte blocks, with no goroutines, timers or sockets.
//     docs/algorithms.md gives each one's cost in steps and bytes.
//
// Reductions use package comm/cpu/kernel.
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
