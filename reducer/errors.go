package reducer

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Test with errors.Is; the concrete error is *Error (or
// *BucketError for a failed collective), which names the rank, the
// iteration and, where one is involved, the parameter.
//
// All of them except ErrModelMismatch and the wrapped comm errors are
// caller bugs: the training loop drove the reducer out of protocol. After
// ErrModelMismatch, fix the model; after a *BucketError the reducer is
// unusable (re-create the process group and the reducer).
var (
	// ErrModelMismatch is returned by New when ranks hold different
	// parameter counts, shapes or dtypes (c10d: "DDP expects same model
	// across all ranks" / "appears not to match").
	ErrModelMismatch = errors.New("reducer: DDP expects same model across all ranks")
	// ErrMarkedTwice is returned by GradReady for a parameter already
	// marked ready in this iteration (c10d: "Expected to mark a variable
	// ready only once").
	ErrMarkedTwice = errors.New("reducer: expected to mark a variable ready only once")
	// ErrUnfinishedReduction is returned by GradReady and
	// PrepareForBackward when a new iteration starts before the prior one
	// was finalized by a successful EndBackward (c10d: "Expected to have
	// finished reduction in the prior iteration before starting a new one").
	ErrUnfinishedReduction = errors.New("reducer: expected to have finished reduction in the prior iteration before starting a new one")
	// ErrMissingGradients is returned by EndBackward when parameters got
	// no gradient on this rank and FindUnusedParameters is off.
	ErrMissingGradients = errors.New("reducer: parameters did not receive a gradient")
	// ErrHookRegistered is returned by RegisterCommHook when a hook is
	// already registered (c10d: "register_comm_hook or
	// register_builtin_comm_hook can only be called once").
	ErrHookRegistered = errors.New("reducer: register_comm_hook can only be called once")
	// ErrStaticGraphChanged is returned under Config.StaticGraph when the
	// set of parameters that receive gradients differs from the first
	// iteration's (c10d: "Your training graph has changed in this iteration").
	ErrStaticGraphChanged = errors.New("reducer: training graph has changed under StaticGraph")
	// ErrBadState is returned for calls made in the wrong phase: EndBackward
	// racing GradReady, RegisterCommHook or NoSync during a backward pass,
	// GradReady after Join, or any call after the reducer failed.
	ErrBadState = errors.New("reducer: call not allowed in the current state")
)

// Error is a reducer error carrying the rank and iteration it happened
// in, and the parameter involved (Param -1 if none). It unwraps to one of
// the sentinels above or to comm.ErrInvalidArgument / comm.ErrUnsupported.
type Error struct {
	Rank      int
	Iteration int64 // synced iterations finalized before this one
	Param     int   // parameter index, or -1
	Name      string
	Err       error // the sentinel
	Msg       string
}

// Error renders "reducer: rank R, iteration I: [parameter P (name): ]msg".
func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "reducer: rank %d, iteration %d: ", e.Rank, e.Iteration)
	if e.Param >= 0 {
		fmt.Fprintf(&b, "parameter %d (%s): ", e.Param, e.Name)
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns the sentinel.
func (e *Error) Unwrap() error { return e.Err }

// BucketError is a failed collective of the reducer: a bucket's reduction
// (Bucket ≥ 0), the local-used-map allreduce (Bucket -1) or a setup
// collective (Bucket -2). It unwraps to the Work's error (comm.ErrTimeout,
// comm.ErrAborted, ...). The reducer is unusable afterwards.
type BucketError struct {
	Rank      int
	Iteration int64
	Bucket    int
	What      string // e.g. "allreduce of bucket 3 (float32×262144)"
	Err       error
}

// Error renders "reducer: rank R, iteration I: <what> failed: <cause>".
func (e *BucketError) Error() string {
	return fmt.Sprintf("reducer: rank %d, iteration %d: %s failed: %v", e.Rank, e.Iteration, e.What, e.Err)
}

// Unwrap returns the collective's error.
func (e *BucketError) Unwrap() error { return e.Err }

// paramList renders parameter indices with their names: "3 (fc.bias), 5 (out.w)".
func paramList(idx []int, names []string) string {
	parts := make([]string, len(idx))
	for i, p := range idx {
		parts[i] = fmt.Sprintf("%d (%s)", p, names[p])
	}
	return strings.Join(parts, ", ")
}
