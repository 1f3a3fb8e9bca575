package nccl

import (
	"fmt"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// Error is a failed NCCL call: the result code, ncclGetErrorString's text
// and ncclGetLastError's message (the most useful part: which peer, which
// CUDA call). It unwraps to comm.ErrEngine, or to comm.ErrInvalidArgument
// for ncclInvalidArgument/ncclInvalidUsage raised by ranktree's own calls.
type Error struct {
	Call string // e.g. "ncclCommInitRankConfig"
	Code Result
	Msg  string // ncclGetErrorString
	Last string // ncclGetLastError (may be empty)
}

// Error implements error: the message names what failed and why.
func (e *Error) Error() string {
	s := fmt.Sprintf("nccl: %s failed: %v: %s", e.Call, e.Code, e.Msg)
	if e.Last != "" {
		s += ": " + e.Last
	}
	return s
}

// Unwrap returns comm.ErrEngine.
func (e *Error) Unwrap() error { return comm.ErrEngine }

// VersionString renders a version code as "2.28.7" (both the pre-2.9
// X*1000+Y*100+Z and the later X*10000+Y*100+Z encodings).
func VersionString(code int) string {
	if code < 10000 {
		return fmt.Sprintf("%d.%d.%d", code/1000, code%1000/100, code%100)
	}
	return fmt.Sprintf("%d.%d.%d", code/10000, code%10000/100, code%100)
}

// InitTimeoutError reports that a communicator was not created before its
// deadline: rank 0's unique id never appeared in the store, or
// ncclCommInitRankConfig stayed in progress (a peer never joined). The
// half-made communicator was aborted. It unwraps to comm.ErrTimeout.
type InitTimeoutError struct {
	Group   string
	Epoch   uint32
	Rank    int // group rank
	Size    int
	Device  int
	Key     string // the store key of the unique id
	Phase   string // "waiting for the unique id" or "ncclCommInitRankConfig in progress"
	Timeout time.Duration
	Err     error // the store's error, if any
}

// Error implements error: the message names what failed and why.
func (e *InitTimeoutError) Error() string {
	s := fmt.Sprintf("nccl: communicator init for group %q epoch %d (rank %d of %d, cuda:%d) timed out after %v: %s (key %s)",
		e.Group, e.Epoch, e.Rank, e.Size, e.Device, e.Timeout, e.Phase, e.Key)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns comm.ErrTimeout and the underlying error.
func (e *InitTimeoutError) Unwrap() []error { return []error{comm.ErrTimeout, e.Err} }
