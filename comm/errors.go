package comm

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors. Test with errors.Is; the concrete errors below carry the
// rank, group, seq and op and unwrap to one of these.
//
// Recoverable by re-creating the process group (or the job): ErrTimeout,
// ErrAborted, ErrRemoteAbort, ErrTransport, ErrEngine, ErrMismatch.
// Caller bugs: ErrInvalidArgument. ErrClosed: the group or runtime was closed.
var (
	// ErrInvalidArgument is returned (through a failed Work or directly) by
	// ProcessGroup methods for bad input: dtype, length, root, peer, split sizes.
	// Nothing is sent and no sequence number is used.
	ErrInvalidArgument = errors.New("comm: invalid argument")
	// ErrTimeout is returned by the watchdog (or a blocking Wait) when a Work
	// outlives its deadline. The concrete error is *TimeoutError.
	ErrTimeout = errors.New("comm: timeout")
	// ErrAborted is returned by engines for every op in flight or launched
	// after Abort; its text contains "aborted".
	ErrAborted = errors.New("comm: communicator aborted")
	// ErrRemoteAbort is returned when a peer rank aborted the communicator;
	// the concrete error is *RemoteAbortError naming that rank.
	ErrRemoteAbort = errors.New("comm: communicator aborted by a remote rank")
	// ErrMismatch is returned by the CPU engine when ranks launched different
	// collectives at the same seq; the concrete error is *MismatchError.
	ErrMismatch = errors.New("comm: collective mismatch between ranks")
	// ErrTransport is returned when a connection to a peer fails (peer died,
	// reset, bad handshake); the concrete error is *TransportError.
	ErrTransport = errors.New("comm: transport error")
	// ErrEngine is an asynchronous engine failure (NCCL async error, injected
	// fault); the concrete error is *EngineError.
	ErrEngine = errors.New("comm: engine error")
	// ErrClosed is returned for ops on a destroyed group or closed runtime.
	ErrClosed = errors.New("comm: process group closed")
	// ErrUnsupported is returned for an op or dtype an engine does not implement.
	ErrUnsupported = errors.New("comm: unsupported")
)

// ArgError is a bad-input error from a ProcessGroup method. It unwraps to
// ErrInvalidArgument. Msg follows c10d's wording where c10d has one
// (e.g. "tensors with different dtypes").
type ArgError struct {
	Op    OpType // the call that was rejected
	Group string // process group name
	Rank  int    // the caller's rank in the group
	Msg   string
}

// Error implements error: the message names what failed and why.
func (e *ArgError) Error() string {
	return fmt.Sprintf("comm: invalid argument to %v on group %q (rank %d): %s", e.Op, e.Group, e.Rank, e.Msg)
}

// Unwrap returns ErrInvalidArgument.
func (e *ArgError) Unwrap() error { return ErrInvalidArgument }

// MismatchError says that two ranks launched different ops at one seq. Its
// text describes both sides, e.g. "rank 1 is at seq 7 AllReduce(float32×1024);
// rank 0 is at seq 7 Broadcast(float32×1024, root 0)".
type MismatchError struct {
	LocalRank, RemoteRank int
	Local, Remote         Fingerprint
}

// Error implements error: the message names what failed and why.
func (e *MismatchError) Error() string {
	return fmt.Sprintf("comm: collective mismatch: rank %d is at %v; rank %d is at %v",
		e.LocalRank, e.Local, e.RemoteRank, e.Remote)
}

// Unwrap returns ErrMismatch.
func (e *MismatchError) Unwrap() error { return ErrMismatch }

// RemoteAbortError reports that rank Rank aborted the communicator.
type RemoteAbortError struct {
	Rank   int    // global rank that aborted
	Reason string // its reason, as it wrote it to the store
}

// Error implements error: the message names what failed and why.
func (e *RemoteAbortError) Error() string {
	return fmt.Sprintf("comm: communicator aborted by rank %d: %s", e.Rank, e.Reason)
}

// Unwrap returns ErrRemoteAbort.
func (e *RemoteAbortError) Unwrap() error { return ErrRemoteAbort }

// TransportError is an I/O failure talking to Peer during an op.
type TransportError struct {
	Rank, Peer int         // local and remote rank (group ranks)
	FP         Fingerprint // op in progress (zero if none)
	Err        error       // underlying I/O error
}

// Error implements error: the message names what failed and why.
func (e *TransportError) Error() string {
	s := fmt.Sprintf("comm: transport error between rank %d and rank %d", e.Rank, e.Peer)
	if e.FP.Seq != 0 || e.FP.Op != 0 {
		s += " during " + e.FP.String()
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns both ErrTransport and the underlying error.
func (e *TransportError) Unwrap() []error { return []error{ErrTransport, e.Err} }

// TimeoutError is the watchdog's report of a Work past its deadline. It
// names which ranks have reached and completed the seq, and which have not.
type TimeoutError struct {
	Rank       int // the reporting rank
	FP         Fingerprint
	Group      string
	Timeout    time.Duration
	Elapsed    time.Duration
	Reached    []int // ranks known to have launched this seq
	Completed  []int // ranks known to have completed this seq
	NotReached []int // ranks that have not launched it (the likely stuck ones)
}

// Error implements error: the message names what failed and why.
func (e *TimeoutError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "comm: timeout: rank %d: %v on group %q ran %v, past its %v timeout", e.Rank, e.FP, e.Group, e.Elapsed.Round(time.Millisecond), e.Timeout)
	if len(e.NotReached) > 0 {
		fmt.Fprintf(&b, "; ranks %v have not reached seq %d", e.NotReached, e.FP.Seq)
	}
	if len(e.Reached) > 0 {
		fmt.Fprintf(&b, "; ranks %v reached it", e.Reached)
	}
	if len(e.Completed) > 0 {
		fmt.Fprintf(&b, "; ranks %v completed it", e.Completed)
	}
	return b.String()
}

// Unwrap returns ErrTimeout.
func (e *TimeoutError) Unwrap() error { return ErrTimeout }

// EngineError is an asynchronous engine failure.
type EngineError struct {
	Engine string // "cpu", "nccl"
	Rank   int
	FP     Fingerprint
	Msg    string
}

// Error implements error: the message names what failed and why.
func (e *EngineError) Error() string {
	return fmt.Sprintf("comm: %s engine error on rank %d at %v: %s", e.Engine, e.Rank, e.FP, e.Msg)
}

// Unwrap returns ErrEngine.
func (e *EngineError) Unwrap() error { return ErrEngine }

// AbortedError wraps ErrAborted with the reason the communicator was aborted.
type AbortedError struct {
	Group  string
	Reason error
}

// Error implements error: the message names what failed and why.
func (e *AbortedError) Error() string {
	if e.Reason == nil {
		return fmt.Sprintf("comm: communicator of group %q aborted", e.Group)
	}
	return fmt.Sprintf("comm: communicator of group %q aborted: %v", e.Group, e.Reason)
}

// Unwrap returns ErrAborted and the reason.
func (e *AbortedError) Unwrap() []error { return []error{ErrAborted, e.Reason} }
