package comm

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/store"
)

// Backend is a collective engine for one communicator (one process group on
// one device): the built-in CPU engine (comm/cpu) or the NCCL engine
// (comm/nccl). It plays the role of a c10d ProcessGroup backend.
//
// The communicator actor is a Backend's only caller for Launch; it calls
// Launch in sequence order, one op at a time, and the Backend executes ops
// in that order on its stream. Abort, AsyncError and Close may be called
// from any goroutine.
type Backend interface {
	// Name is the engine's name: "cpu" or "nccl".
	Name() string
	// Rank and Size are this member's group rank and the group size.
	Rank() int
	Size() int
	// Launch enqueues op on the engine's stream and returns without waiting
	// for communication. The engine completes p exactly once: nil on
	// success, else a typed error (*MismatchError, *TransportError,
	// *AbortedError, *EngineError ...). op and its buffers stay referenced
	// until then. op has passed the ProcessGroup's validation (validate.go:
	// buffers on the engine's memory, roots, peers, counts) and carries its
	// identity, children included (Op.SetIdentity, by the communicator
	// actor), which is also recorded on p (Promise.SetFingerprint); the
	// engine checks neither again. It records the op's start (MarkStarted)
	// and a Recv's source (SetSource).
	Launch(op *Op, p *Promise)
	// Abort fails every in-flight and later op with an error wrapping
	// ErrAborted and reason; it returns promptly (the CPU engine unblocks
	// ops within 100 ms) and is idempotent.
	Abort(reason error)
	// AsyncError is the first asynchronous error the engine saw, or nil
	// (ncclCommGetAsyncError). The watchdog polls it.
	AsyncError() error
	// Close releases the engine's transports and goroutines; in-flight ops
	// fail with ErrClosed. Idempotent.
	Close() error
}

// BackendConfig is what a Backend needs to connect one communicator.
type BackendConfig struct {
	// Group is the process group's name ("default_pg", "pg1", ...); Epoch
	// its epoch (incremented by communicator restarts). Group and Epoch
	// namespace every store key the engine uses.
	Group string
	Epoch uint32
	// Rank and Size: this member's group rank and the group size.
	Rank, Size int
	// GlobalRanks maps group rank to global rank (for messages and events).
	GlobalRanks []int
	// Store is the job's store, already prefixed for this job and restart.
	Store store.Store
	// Device is the CUDA device ordinal, or -1 for host.
	Device int
	// Timeout bounds connection setup (rendezvous, handshakes).
	Timeout time.Duration
	// Faults are RANKTREE_FAULT's injected faults; engines honour those that
	// match their rank (see Fault).
	Faults []Fault
	// Log is the logger, already carrying rank fields.
	Log zerolog.Logger
}

// BackendFactory creates and connects a Backend; it blocks until every
// member of the group has connected or ctx / cfg.Timeout ends.
type BackendFactory func(ctx context.Context, cfg BackendConfig) (Backend, error)

// Fault is one injected fault from RANKTREE_FAULT, e.g. "hang@rank=1,seq=5":
// when global rank Rank reaches collective Seq (in any group unless Group is
// set), the engine hangs (until aborted), crashes the process (exit code 3
// after printing the fault), or fails the op with an *EngineError.
type Fault struct {
	Kind  string // "hang", "crash" or "error"
	Rank  int    // global rank
	Seq   uint64 // collective sequence number
	Group string // optional group name; "" matches every group
}
