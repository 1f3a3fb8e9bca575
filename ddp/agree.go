package ddp

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/reducer"
)

// MismatchError reports parameter lists that differ between ranks (Wrap,
// BroadcastState). Every rank returns the same one: the first rank whose
// list differs from rank 0's, and the first parameter in which it
// differs. It unwraps to comm.ErrMismatch; the ranks built different
// models, which is a bug in the program, not a fault to retry.
type MismatchError struct {
	// Rank is the rank returning the error.
	Rank int
	// Other is the rank whose list differs from rank 0's.
	Other int
	// Index is the position of the first parameter that differs.
	Index int
	// Name is that parameter's name on rank 0, or on Other when rank 0's
	// list is shorter.
	Name string
	// Want and Got describe the parameter on rank 0 and on Other
	// ("fc1.weight float32 [784 256]", or "none" past a list's end).
	Want, Got string
	// Op is the call that checked ("Wrap", "BroadcastState").
	Op string
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("ddp: %s on rank %d: parameter lists differ between ranks: first difference at params[%d] %q: rank 0 has %s, rank %d has %s",
		e.Op, e.Rank, e.Index, e.Name, e.Want, e.Other, e.Got)
}

// Unwrap returns comm.ErrMismatch.
func (e *MismatchError) Unwrap() error { return comm.ErrMismatch }

// ParamError reports a parameter list that is invalid on some rank (empty
// or duplicate name, negative dimension, non-floating dtype, missing
// callback). Every rank returns it, naming the first invalid rank. It
// unwraps to comm.ErrInvalidArgument.
type ParamError struct {
	// Rank is the rank returning the error; Culprit the rank whose list
	// is invalid.
	Rank, Culprit int
	// Msg says what is wrong.
	Msg string
	// Op is the call that checked ("Wrap", "BroadcastState").
	Op string
}

func (e *ParamError) Error() string {
	return fmt.Sprintf("ddp: %s on rank %d: rank %d's parameter list is invalid: %s", e.Op, e.Rank, e.Culprit, e.Msg)
}

// Unwrap returns comm.ErrInvalidArgument.
func (e *ParamError) Unwrap() error { return comm.ErrInvalidArgument }

// describe renders one parameter for comparison and messages.
func describe(p Param) string {
	dims := make([]string, len(p.Shape))
	for i, d := range p.Shape {
		dims[i] = strconv.Itoa(d)
	}
	return fmt.Sprintf("%s\x1f%v [%s]", p.Name, p.dtype(), strings.Join(dims, " "))
}

// check validates a local list; needGrad requires Grad callbacks.
func check(params []Param, needGrad bool) string {
	seen := map[string]int{}
	for i, p := range params {
		switch {
		case p.Name == "":
			return fmt.Sprintf("params[%d] has an empty name", i)
		case strings.ContainsAny(p.Name, "\n\x1f"):
			return fmt.Sprintf("params[%d] name %q contains a newline or a unit separator", i, p.Name)
		case !p.dtype().Valid() || !p.dtype().IsFloating():
			return fmt.Sprintf("params[%d] %q has dtype %v, want a floating dtype", i, p.Name, p.dtype())
		case p.Value == nil:
			return fmt.Sprintf("params[%d] %q has no Value callback", i, p.Name)
		case needGrad && p.Grad == nil:
			return fmt.Sprintf("params[%d] %q has no Grad callback", i, p.Name)
		}
		if j, dup := seen[p.Name]; dup {
			return fmt.Sprintf("params[%d] and params[%d] are both named %q", j, i, p.Name)
		}
		seen[p.Name] = i
		for _, d := range p.Shape {
			if d < 0 {
				return fmt.Sprintf("params[%d] %q has a negative dimension in shape %v", i, p.Name, p.Shape)
			}
		}
	}
	return ""
}

// agree exchanges every rank's parameter list (two allgathers) and
// returns the same verdict on every rank: nil, a *ParamError or a
// *MismatchError.
func agree(ctx context.Context, g reducer.Group, params []Param, needGrad bool, op string) error {
	rank, size := g.Rank(), g.Size()
	var blob string
	if msg := check(params, needGrad); msg != "" {
		blob = "!" + msg
	} else {
		lines := make([]string, len(params))
		for i, p := range params {
			lines[i] = describe(p)
		}
		blob = "+" + strings.Join(lines, "\n")
	}
	lens := make([]int64, size)
	if err := g.AllGatherInto(ctx, comm.HostBuffer(lens), comm.HostBuffer([]int64{int64(len(blob))})).Wait(ctx); err != nil {
		return fmt.Errorf("ddp: %s on rank %d: allgather of parameter-list sizes: %w", op, rank, err)
	}
	width := 0
	for _, n := range lens {
		width = max(width, int(n))
	}
	mine := make([]uint8, width)
	copy(mine, blob)
	all := make([]uint8, width*size)
	if err := g.AllGatherInto(ctx, comm.HostBuffer(all), comm.HostBuffer(mine)).Wait(ctx); err != nil {
		return fmt.Errorf("ddp: %s on rank %d: allgather of parameter lists: %w", op, rank, err)
	}
	lists := make([][]string, size)
	for r := range size {
		s := string(all[r*width : r*width+int(lens[r])])
		if strings.HasPrefix(s, "!") {
			return &ParamError{Rank: rank, Culprit: r, Msg: s[1:], Op: op}
		}
		s = strings.TrimPrefix(s, "+")
		if s != "" {
			lists[r] = strings.Split(s, "\n")
		}
	}
	for r := 1; r < size; r++ {
		a, b := lists[0], lists[r]
		for i := range max(len(a), len(b)) {
			want, got := "none", "none"
			if i < len(a) {
				want = a[i]
			}
			if i < len(b) {
				got = b[i]
			}
			if want == got {
				continue
			}
			name := want
			if i >= len(a) {
				name = got
			}
			name, _, _ = strings.Cut(name, "\x1f")
			show := func(s string) string { return strings.Replace(s, "\x1f", " ", 1) }
			return &MismatchError{Rank: rank, Other: r, Index: i, Name: name, Want: show(want), Got: show(got), Op: op}
		}
	}
	return nil
}
