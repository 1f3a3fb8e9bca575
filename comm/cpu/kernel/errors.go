package kernel

import (
	"fmt"

	"github.com/ranktree/ranktree/comm"
)

// Error is a kernel call rejected for bad arguments: mismatched lengths, a
// length that is not a whole number of elements, an invalid dtype or a
// dtype/op pair that c10d forbids, a non-floating dtype given to Scale, or
// partially overlapping buffers. It unwraps to comm.ErrInvalidArgument (and,
// for a rejected dtype/op pair, to the error of comm.ReduceOp.Check). These
// are caller bugs: nothing was written to dst.
type Error struct {
	Func     string        // "Reduce", "ReduceParallel", "Scale", "ToFloat32", "FromFloat32"
	DType    comm.DType    // element type passed
	Op       comm.ReduceOp // reduction passed (zero for Scale and conversions)
	DstBytes int           // len(dst) (or len(buf) for Scale)
	SrcBytes int           // len(src); -1 when the call has no src
	Msg      string        // what is wrong
	Err      error         // underlying error, if any (from ReduceOp.Check)
}

// Error implements error: the message names what failed and why.
func (e *Error) Error() string {
	s := fmt.Sprintf("kernel: %s(%v", e.Func, e.DType)
	if e.Op != (comm.ReduceOp{}) {
		s += ", " + e.Op.String()
	}
	s += fmt.Sprintf(", dst %d B", e.DstBytes)
	if e.SrcBytes >= 0 {
		s += fmt.Sprintf(", src %d B", e.SrcBytes)
	}
	s += "): " + e.Msg
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns comm.ErrInvalidArgument and the underlying error.
func (e *Error) Unwrap() []error {
	if e.Err != nil {
		return []error{comm.ErrInvalidArgument, e.Err}
	}
	return []error{comm.ErrInvalidArgument}
}
