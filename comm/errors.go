package comm

import (
	"errors"
	"fmt"
	"slices"
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
	Op    OpType // the op of the call that was rejected
	Group string // process group name
	Rank  int    // the caller's rank in the group
	Msg   string
	// Call names the ProcessGroup method when it is not Op's own (e.g.
	// "BatchP2P" for an OpCoalesced batch); the message is then headed by
	// it rather than by Op. Empty: Op.
	Call string
}

// Error implements error: the message names the call, what failed and why.
func (e *ArgError) Error() string {
	call := e.Call
	if call == "" {
		call = e.Op.String()
	}
	return fmt.Sprintf("comm: invalid argument to %s on group %q (rank %d): %s", call, e.Group, e.Rank, e.Msg)
}

// Unwrap returns ErrInvalidArgument.
func (e *ArgError) Unwrap() error { return ErrInvalidArgument }

// MismatchError says that two ranks launched different ops at one seq, or
// the same op with sizes that do not fit together (split sizes, V-variant
// counts). Its text names both ranks, both ops and the fields that differ,
// e.g. "rank 1 is at seq 7 Broadcast(float32×4, root 1); rank 0 is at seq 7
// Broadcast(float32×4, root 0) (root differs)". Every member of the group
// fails with it (the rank that detects it tells the others), within
// milliseconds rather than at the timeout.
type MismatchError struct {
	LocalRank, RemoteRank int         // group ranks of the two sides
	Local, Remote         Fingerprint // the op each side launched (zero: not known)
	// Detail describes a mismatch the fingerprints do not show (both
	// sides launched the same op but disagree on sizes), or is empty.
	Detail string
}

// Error implements error: the message names both ranks, their ops and
// which fields differ.
func (e *MismatchError) Error() string {
	var b strings.Builder
	b.WriteString("comm: collective mismatch: ")
	side := func(rank int, fp Fingerprint) {
		if fp.Op == 0 {
			fmt.Fprintf(&b, "rank %d is at an op not known here", rank)
			return
		}
		fmt.Fprintf(&b, "rank %d is at %v", rank, fp)
	}
	side(e.LocalRank, e.Local)
	b.WriteString("; ")
	side(e.RemoteRank, e.Remote)
	if d := e.Fields(); len(d) > 0 {
		fmt.Fprintf(&b, " (%s differ)", strings.Join(d, ", "))
	}
	if e.Detail != "" {
		b.WriteString(": " + e.Detail)
	}
	return b.String()
}

// Fields names the fingerprint fields that differ between the two sides
// ("op", "dtype", "count", "root", "reduce op", "shape", "seq", "group",
// "epoch"),
// or nil when either side is unknown or they are equal. "count" is left
// out when one side is an all-to-all, whose fingerprint carries no count.
func (e *MismatchError) Fields() []string {
	a, c := e.Local, e.Remote
	if a.Op == 0 || c.Op == 0 {
		return nil
	}
	var d []string
	add := func(diff bool, name string) {
		if diff {
			d = append(d, name)
		}
	}
	add(a.Group != c.Group, "group")
	add(a.Epoch != c.Epoch, "epoch")
	add(a.Seq != c.Seq, "seq")
	add(a.Op != c.Op, "op")
	add(a.DType != c.DType, "dtype")
	add(a.Count != c.Count && a.Op != OpAllToAll && c.Op != OpAllToAll, "count")
	add(a.Root != c.Root, "root")
	add(a.RedOp != c.RedOp, "reduce op")
	add(a.Shape != c.Shape, "shape")
	return d
}

// Unwrap returns ErrMismatch.
func (e *MismatchError) Unwrap() error { return ErrMismatch }

// RemoteAbortError reports that another member's failure broke the
// communicator: Rank is the global rank where the failure started (the
// rank that aborted, timed out, found a mismatch, or the rank that died),
// never a rank that only passed the news on (Relay).
type RemoteAbortError struct {
	Rank   int    // global rank where the failure started
	Reason string // what happened there, in that rank's words
	// Seq is the collective seq the origin was at when it failed (0: not known).
	Seq uint64
	// Relay is the global rank this rank heard it from, when not Rank
	// itself (-1 or equal to Rank otherwise).
	Relay int
}

// Error implements error: the message names the origin rank, its seq and
// reason.
func (e *RemoteAbortError) Error() string {
	s := fmt.Sprintf("comm: communicator aborted by a failure at rank %d", e.Rank)
	if e.Seq != 0 {
		s += fmt.Sprintf(", seq %d", e.Seq)
	}
	if e.Relay >= 0 && e.Relay != e.Rank {
		s += fmt.Sprintf(" (reported by rank %d)", e.Relay)
	}
	return s + ": " + e.Reason
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
	if e.FP.Op == 0 {
		return fmt.Sprintf("comm: %s engine error on rank %d: %s", e.Engine, e.Rank, e.Msg)
	}
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

// CanceledError is the error of a Work whose ctx was cancelled after it was
// launched. A collective cannot be left half-done, so the communicator is
// aborted with it (peers fail with *RemoteAbortError naming this rank).
// It unwraps to ErrAborted and to the ctx's error (context.Canceled or
// context.DeadlineExceeded).
type CanceledError struct {
	Group string
	Rank  int // group rank
	FP    Fingerprint
	Err   error // ctx.Err()
}

// Error implements error: the message names the op and the ctx's error.
func (e *CanceledError) Error() string {
	return fmt.Sprintf("comm: rank %d: %v on group %q abandoned: %v; the communicator is aborted", e.Rank, e.FP, e.Group, e.Err)
}

// Unwrap returns ErrAborted and the ctx's error.
func (e *CanceledError) Unwrap() []error { return []error{ErrAborted, e.Err} }

// Blame finds the rank where the failure behind err started and its seq:
// the origin of a *RemoteAbortError, the peer of a *TransportError, the
// first rank a *TimeoutError says never reached the op, the rank of an
// *EngineError, else self (a mismatch this rank found, an abort it chose,
// a cancelled ctx). members maps
// group ranks to global ranks. The seq is that of the op err names (0 if
// none).
func Blame(err error, self int, members []int) (rank int, seq uint64) {
	global := func(groupRank int) int {
		if groupRank >= 0 && groupRank < len(members) {
			return members[groupRank]
		}
		return self
	}
	var ra *RemoteAbortError
	var te *TransportError
	var me *MismatchError
	var to *TimeoutError
	var ee *EngineError
	var ce *CanceledError
	switch {
	case errors.As(err, &ra):
		return ra.Rank, ra.Seq
	case errors.As(err, &me):
		return self, max(me.Local.Seq, me.Remote.Seq)
	case errors.As(err, &te):
		return global(te.Peer), te.FP.Seq
	case errors.As(err, &to):
		// The ranks that never reached the op are where it went wrong
		// (a hung, stopped or desynchronized rank), unless this one is.
		if len(to.NotReached) > 0 && !slices.Contains(to.NotReached, self) {
			return to.NotReached[0], to.FP.Seq
		}
		return self, to.FP.Seq
	case errors.As(err, &ce):
		return self, ce.FP.Seq
	case errors.As(err, &ee):
		return global(ee.Rank), ee.FP.Seq
	}
	return self, 0
}
