// Package transport holds the CPU engine's transports, apart from its
// algorithms (package comm/cpu), as Gloo keeps gloo/transport/{tcp,uv,
// ibverbs} beside gloo/allreduce_*.h: how bytes of one op move between
// the ranks of a group, and nothing about which bytes an algorithm sends.
//
// # Structure
//
//   - link.go: Link, the connection to one peer as the progress goroutine
//     sees it (Gloo's transport::Pair: poll, read, send, flush), the sink a
//     read delivers into (copy, reduce, or segments), Ctl, the state every
//     link of one engine shares (stop, wake-ups, notice handlers), and the
//     backoff that paces polling.
//   - tcp.go: TCPLink, over one authenticated TCP connection, whose poll
//     reads the socket itself while the progress goroutine waits, with a
//     reader goroutine for the rest of the time and a writer goroutine for
//     queued sends, and TCPWait, how waits on TCP links poll before they
//     park; shm.go, shm_copy.go: ShmLink, two rings in a
//     shared-memory segment per pair of ranks on one host; inmem.go:
//     InmemHub, the same rings in Go memory for ranks that are goroutines
//     of one process (the counterpart of hashicorp/raft's
//     inmem_transport.go).
//   - header.go: the 64-byte wire header every message starts with,
//     carrying the op's fingerprint.
//   - mesh.go, p2p.go: Mesh, one link per peer for one rank, matching
//     messages to the current op (fingerprint, step, length), stashing
//     point-to-point messages; it implements the comm/cpu Mesh interface
//     the algorithms are written against. mesh_forward.go: its forwards
//     (a receive whose pieces are sent on from cache as they are reduced
//     or copied, over a held shm send) and its receive with non-temporal
//     stores; ntcopy_amd64.s: the non-temporal copy.
//   - shm_group.go, doorbell_linux.go, mesh_flat.go: the group segment of
//     a group whose 2..MaxFlatRanks ranks share a host (per-rank
//     double-buffered slots and fast boxes, sleeping flags) and its
//     per-rank doorbell FIFOs, the wait policy (spin at most 50 µs, or
//     yield when oversubscribed, then sleep on the doorbell through the
//     Go netpoller in slices of 1-8 ms; docs/algorithms.md, "Waiting"),
//     and Mesh's Slots methods for the one-step algorithms.
//     shm_forecast.go: the forecast of a wait from the recent waits of the
//     same op and position, by which a wait that repeats naps on a
//     precise timer until just before its peer is due and spins through
//     the arrival.
//   - inmem_mesh.go: InmemMesh, the ranks of a group connected in memory,
//     each with a ready Mesh, for algorithm tests without an engine.
//
// Connection set-up (addresses through the store, handshakes, who creates
// which segment) and what a failure means for the communicator (notices,
// blame) belong to the engine (comm/cpu: rendezvous.go, failure.go); it
// hands this package the connections and hooks (Ctl.OnNotice, Mesh.Fatal,
// Mesh.Mismatch, ...).
//
// # Caller's duties
//
//  1. One goroutine at a time drives a rank's links and Mesh (the
//     engine's progress goroutine): the links' poll, read, send, flush and every Mesh
//     method. Ctl.Poke, notices and Close may come from any goroutine.
//  2. Call Mesh.Begin with the op's fingerprint before its first message,
//     with the same fingerprint on every rank.
//  3. Keep a sent buffer unchanged until Flush returns.
//  4. Stop (close Ctl.Stop, set Ctl.Stopped, Poke) before closing links,
//     and unmap segments only once no goroutine can touch them.
package transport
