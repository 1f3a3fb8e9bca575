package cpu

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/x448/float16"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/store"
)

// group is N engines of one process group, ranks as goroutines in this
// process, connected through an in-memory store.
type group struct {
	t       testing.TB
	name    string
	engines []*Engine
	seq     uint64
}

func newGroup(t testing.TB, n int, opts Options) *group {
	t.Helper()
	return newGroupStore(t, n, opts, store.NewMemStore(store.WithMemTimeout(30*time.Second)), zerolog.Nop())
}

func newGroupStore(t testing.TB, n int, opts Options, st store.Store, log zerolog.Logger) *group {
	t.Helper()
	g := &group{t: t, name: "g", engines: make([]*Engine, n)}
	if opts.Transport == TransportInmem && opts.Hub == nil {
		opts.Hub = NewInmemHub()
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := comm.BackendConfig{Group: g.name, Rank: r, Size: n, Store: st, Device: -1,
				Timeout: 30 * time.Second, Log: log.With().Int("rank", r).Logger()}
			g.engines[r], errs[r] = New(context.Background(), cfg, opts)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("New rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, e := range g.engines {
			if e != nil {
				_ = e.Close()
			}
		}
	})
	return g
}

// fp is the fingerprint of the group's next op.
func (g *group) fp(t comm.OpType, dt comm.DType, count int, root int, red comm.ReduceOp) comm.Fingerprint {
	return comm.Fingerprint{Group: comm.GroupHash(g.name), Seq: g.seq, Op: t, DType: dt, Count: int64(count), Root: int32(root), RedOp: red.Type()}
}

// run launches mk(r) on every rank as op seq g.seq+1 and waits for all.
func (g *group) run(mk func(r int, fp func(comm.OpType, comm.DType, int, int, comm.ReduceOp) comm.Fingerprint) *comm.Op) ([]*comm.Work, []error) {
	g.seq++
	n := len(g.engines)
	works := make([]*comm.Work, n)
	for r, e := range g.engines {
		op := mk(r, g.fp)
		op.SetIdentity(op.FP.Group, op.FP.Epoch, op.FP.Seq) // as the communicator actor does
		p := comm.NewPromise(op.Type)
		p.SetSeq(g.seq)
		e.Launch(op, p)
		works[r] = p.Work()
	}
	errs := make([]error, n)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for r, w := range works {
		errs[r] = w.Wait(ctx)
	}
	return works, errs
}

// mustRun is run that fails the test on any error.
func (g *group) mustRun(what string, mk func(r int, fp func(comm.OpType, comm.DType, int, int, comm.ReduceOp) comm.Fingerprint) *comm.Op) []*comm.Work {
	g.t.Helper()
	works, errs := g.run(mk)
	for r, err := range errs {
		if err != nil {
			g.t.Fatalf("%s: rank %d: %v", what, r, err)
		}
	}
	return works
}

// setF writes v (rounded to dt) at element i of b.
func setF(b comm.Buffer, i int, v float64) {
	switch b.DType() {
	case comm.Float32:
		s, _ := comm.AsSlice[float32](b)
		s[i] = float32(v)
	case comm.Float64:
		s, _ := comm.AsSlice[float64](b)
		s[i] = v
	case comm.Float16:
		s, _ := comm.AsSlice[comm.Float16Value](b)
		s[i] = f16(v)
	case comm.BFloat16:
		s, _ := comm.AsSlice[comm.BFloat16Value](b)
		s[i] = comm.BFloat16FromFloat32(float32(v))
	case comm.Int8:
		s, _ := comm.AsSlice[int8](b)
		s[i] = int8(int64(v))
	case comm.Uint8:
		s, _ := comm.AsSlice[uint8](b)
		s[i] = uint8(int64(v))
	case comm.Int32:
		s, _ := comm.AsSlice[int32](b)
		s[i] = int32(int64(v))
	case comm.Int64:
		s, _ := comm.AsSlice[int64](b)
		s[i] = int64(v)
	case comm.Bool:
		s, _ := comm.AsSlice[bool](b)
		s[i] = v != 0
	case comm.Complex64:
		// The imaginary part is -2× the real one, so linear reductions
		// keep that relation (checked by imagOK).
		s, _ := comm.AsSlice[complex64](b)
		s[i] = complex(float32(v), float32(-2*v))
	case comm.Complex128:
		s, _ := comm.AsSlice[complex128](b)
		s[i] = complex(v, -2*v)
	}
}

// imagOK reports whether element i of a complex buffer still has an
// imaginary part of -2× its real part (as setF writes it), within dt's
// tolerance; true for other dtypes.
func imagOK(b comm.Buffer, i int) bool {
	var re, im float64
	switch b.DType() {
	case comm.Complex64:
		s, _ := comm.AsSlice[complex64](b)
		re, im = float64(real(s[i])), float64(imag(s[i]))
	case comm.Complex128:
		s, _ := comm.AsSlice[complex128](b)
		re, im = real(s[i]), imag(s[i])
	default:
		return true
	}
	return approxEq(b.DType(), im, -2*re)
}

// getF reads element i of b as float64 (the real part of a complex one).
func getF(b comm.Buffer, i int) float64 {
	switch b.DType() {
	case comm.Float32:
		s, _ := comm.AsSlice[float32](b)
		return float64(s[i])
	case comm.Float64:
		s, _ := comm.AsSlice[float64](b)
		return s[i]
	case comm.Float16:
		s, _ := comm.AsSlice[comm.Float16Value](b)
		return float64(s[i].Float32())
	case comm.BFloat16:
		s, _ := comm.AsSlice[comm.BFloat16Value](b)
		return float64(s[i].Float32())
	case comm.Int8:
		s, _ := comm.AsSlice[int8](b)
		return float64(s[i])
	case comm.Uint8:
		s, _ := comm.AsSlice[uint8](b)
		return float64(s[i])
	case comm.Int32:
		s, _ := comm.AsSlice[int32](b)
		return float64(s[i])
	case comm.Int64:
		s, _ := comm.AsSlice[int64](b)
		return float64(s[i])
	case comm.Bool:
		s, _ := comm.AsSlice[bool](b)
		if s[i] {
			return 1
		}
		return 0
	case comm.Complex64:
		s, _ := comm.AsSlice[complex64](b)
		return float64(real(s[i]))
	case comm.Complex128:
		s, _ := comm.AsSlice[complex128](b)
		return real(s[i])
	}
	panic("bad dtype")
}

// castTo rounds or wraps an exact result v to what dt can hold.
func castTo(dt comm.DType, v float64) float64 {
	b := comm.NewHostBuffer(dt, 1)
	setF(b, 0, v)
	return getF(b, 0)
}

// tol is the relative tolerance for comparing reduced values of dt.
func tol(dt comm.DType) float64 {
	switch dt {
	case comm.Float16:
		return 4e-3
	case comm.BFloat16:
		return 3e-2
	case comm.Float32, comm.Complex64:
		return 1e-6
	case comm.Float64, comm.Complex128:
		return 1e-12
	}
	return 0
}

func approxEq(dt comm.DType, got, want float64) bool {
	if got == want {
		return true
	}
	return math.Abs(got-want) <= tol(dt)*math.Max(1, math.Abs(want))
}

// mustEqAt checks element i of b against want (the real part for a
// complex dtype, whose imaginary part must keep imagOK's relation).
func mustEqAt(t testing.TB, what string, b comm.Buffer, i int, want float64) {
	t.Helper()
	mustEq(t, what, b.DType(), getF(b, i), want)
	if !imagOK(b, i) {
		t.Fatalf("%s: imaginary part of %v is not -2× the real part (%v)", what, getF(b, i), b.DType())
	}
}

func mustEq(t testing.TB, what string, dt comm.DType, got, want float64) {
	t.Helper()
	if !approxEq(dt, got, want) {
		t.Fatalf("%s: got %v, want %v (%v)", what, got, want, dt)
	}
}

var _ = fmt.Sprintf

func f16(v float64) comm.Float16Value { return float16.Fromfloat32(float32(v)) }
