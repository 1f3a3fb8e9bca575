package cuda

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ranktree/ranktree/comm"
)

// Result is a CUresult, the status code of every driver API call.
type Result int32

// CUresult values ranktree tests for (cuda.h).
const (
	Success       Result = 0   // CUDA_SUCCESS
	ErrorNotReady Result = 600 // CUDA_ERROR_NOT_READY: event or stream still has work
)

// ErrNoLibrary is returned by Load and Open when libcuda cannot be loaded
// (no driver on this machine, or RANKTREE_CUDA_LIB names a missing file).
// It wraps comm.ErrUnsupported: the NCCL engine is unavailable here.
var ErrNoLibrary = fmt.Errorf("%w: CUDA driver library (libcuda.so.1) not loadable", comm.ErrUnsupported)

// LoadError reports that no candidate library could be loaded or that a
// required symbol is missing. It unwraps to ErrNoLibrary.
type LoadError struct {
	Lib    string   // "libcuda" or "libnccl"
	Tried  []string // candidate paths, in order
	Errs   []string // dlopen/dlsym error text per candidate
	Symbol string   // missing symbol, if that was the failure
}

// Error implements error: the message names what failed and why.
func (e *LoadError) Error() string {
	if e.Symbol != "" {
		return fmt.Sprintf("cuda: %s at %s lacks symbol %s", e.Lib, strings.Join(e.Tried, ", "), e.Symbol)
	}
	return fmt.Sprintf("cuda: cannot load %s (tried %s): %s", e.Lib, strings.Join(e.Tried, ", "), strings.Join(e.Errs, "; "))
}

// Unwrap returns ErrNoLibrary.
func (e *LoadError) Unwrap() error { return ErrNoLibrary }

// Error is a failed driver API call. It unwraps to comm.ErrEngine.
type Error struct {
	Call string // driver function, e.g. "cuMemAlloc_v2"
	Code Result
	Name string // cuGetErrorName, e.g. "CUDA_ERROR_INVALID_VALUE"
	Msg  string // cuGetErrorString
}

// Error implements error: the message names what failed and why.
func (e *Error) Error() string {
	return fmt.Sprintf("cuda: %s failed: %s (%d): %s", e.Call, e.Name, int32(e.Code), e.Msg)
}

// Unwrap returns comm.ErrEngine.
func (e *Error) Unwrap() error { return comm.ErrEngine }

// IsNotReady reports whether err is a CUDA_ERROR_NOT_READY *Error.
func IsNotReady(err error) bool {
	var ce *Error
	return errors.As(err, &ce) && ce.Code == ErrorNotReady
}
