package ddp_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu"
	"github.com/ranktree/ranktree/ddp"
	"github.com/ranktree/ranktree/internal/testrank"
	"github.com/ranktree/ranktree/reducer"
)

func world(t *testing.T, n int) []*comm.ProcessGroup {
	t.Helper()
	pgs, _ := testrank.LocalWorld(t, n, "cpu", cpu.Factory(cpu.Options{Transport: cpu.TransportInmem, Hub: cpu.NewInmemHub()}))
	return pgs
}

// tensor is a framework tensor double whose storage moves on every write
// (as GoMLX replaces variable tensors each step), so ddp must never keep
// a slice it was handed.
type tensor struct {
	name  string
	shape []int
	val   []float32
	grad  []float32
}

func (x *tensor) param() ddp.Param {
	return ddp.Param{
		Name: x.name, Shape: x.shape,
		Value: func(fn func(comm.Buffer)) error {
			v := append([]float32(nil), x.val...) // a fresh buffer each access
			fn(comm.HostBuffer(v))
			x.val = v
			return nil
		},
		Grad: func(fn func(comm.Buffer)) error {
			if x.grad == nil {
				return errors.New("no gradient yet")
			}
			g := append([]float32(nil), x.grad...)
			fn(comm.HostBuffer(g))
			x.grad = g
			return nil
		},
	}
}

// model builds rank r's two-tensor model: values differ per rank so the
// broadcast is visible.
func model(r int) []*tensor {
	w := &tensor{name: "fc.weight", shape: []int{3, 2}, val: make([]float32, 6)}
	b := &tensor{name: "fc.bias", shape: []int{2}, val: make([]float32, 2)}
	for i := range w.val {
		w.val[i] = float32(100*r + i)
	}
	b.val[0], b.val[1] = float32(-r), float32(r)
	return []*tensor{w, b}
}

func params(ts []*tensor) []ddp.Param {
	out := make([]ddp.Param, len(ts))
	for i, x := range ts {
		out[i] = x.param()
	}
	return out
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestWrapBroadcastSyncAverages: Wrap gives every rank rank 0's values;
// Sync leaves every rank with the mean of the ranks' gradients, for world
// sizes 1..4 (each rank's gradient element i is rank·10+i, closed form of
// the mean: 10·(n-1)/2 + i).
func TestWrapBroadcastSyncAverages(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			pgs := world(t, n)
			ctx := ctxT(t)
			models := make([][]*tensor, n)
			err := testrank.Ranks(n, 60*time.Second, func(r int) error {
				models[r] = model(r)
				m, err := ddp.Wrap(ctx, pgs[r], params(models[r]), ddp.Config{Reducer: reducer.Config{BucketCapBytes: 16, FirstBucketBytes: 16}})
				if err != nil {
					return err
				}
				if m.Rank() != r || m.Size() != n {
					return fmt.Errorf("Rank/Size %d/%d", m.Rank(), m.Size())
				}
				for step := range 3 {
					for _, x := range models[r] {
						x.grad = make([]float32, len(x.val))
						for i := range x.grad {
							x.grad[i] = float32(r*10 + i + step) // distinct per rank, element and step
						}
					}
					if err := m.Sync(ctx); err != nil {
						return err
					}
					for _, x := range models[r] {
						for i, g := range x.grad {
							want := float32(10*(n-1))/2 + float32(i+step)
							if math.Abs(float64(g-want)) > 1e-5 {
								return fmt.Errorf("step %d: %s grad[%d] = %v, want %v", step, x.name, i, g, want)
							}
						}
					}
				}
				if s := m.Stats(); s.Syncs != 3 || s.SyncTime <= 0 || s.CommTime > s.SyncTime {
					return fmt.Errorf("stats %+v", s)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			ref := model(0)
			for r := range n {
				for k, x := range models[r] {
					for i, v := range x.val {
						if v != ref[k].val[i] {
							t.Fatalf("rank %d %s[%d] = %v after Wrap, want rank 0's %v", r, x.name, i, v, ref[k].val[i])
						}
					}
				}
			}
		})
	}
}

// TestWrapMismatch: a parameter list differing in a name, a shape, a
// dtype or the count fails on every rank with ErrMismatch naming the
// first differing parameter; an invalid list fails everywhere with
// ErrInvalidArgument naming the culprit rank.
func TestWrapMismatch(t *testing.T) {
	cases := []struct {
		name     string
		edit     func([]ddp.Param) []ddp.Param // applied on rank 1
		wantIs   error
		wantName string
	}{
		{"name", func(p []ddp.Param) []ddp.Param { p[1].Name = "fc.b"; return p }, comm.ErrMismatch, "fc.bias"},
		{"shape", func(p []ddp.Param) []ddp.Param { p[0].Shape = []int{2, 3}; return p }, comm.ErrMismatch, "fc.weight"},
		{"dtype", func(p []ddp.Param) []ddp.Param { p[1].DType = comm.Float64; return p }, comm.ErrMismatch, "fc.bias"},
		{"fewer", func(p []ddp.Param) []ddp.Param { return p[:1] }, comm.ErrMismatch, "fc.bias"},
		{"more", func(p []ddp.Param) []ddp.Param {
			x := &tensor{name: "extra", shape: []int{1}, val: []float32{0}}
			return append(p, x.param())
		}, comm.ErrMismatch, "extra"},
		{"duplicate", func(p []ddp.Param) []ddp.Param { p[1].Name = p[0].Name; return p }, comm.ErrInvalidArgument, ""},
		{"nograd", func(p []ddp.Param) []ddp.Param { p[0].Grad = nil; return p }, comm.ErrInvalidArgument, ""},
	}
	pgs := world(t, 3)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := ctxT(t)
			errs := make([]error, 3)
			_ = testrank.Ranks(3, 60*time.Second, func(r int) error {
				p := params(model(r))
				if r == 1 {
					p = c.edit(p)
				}
				_, errs[r] = ddp.Wrap(ctx, pgs[r], p, ddp.Config{})
				return nil
			})
			for r, err := range errs {
				if !errors.Is(err, c.wantIs) {
					t.Fatalf("rank %d: %v, want %v", r, err, c.wantIs)
				}
				var me *ddp.MismatchError
				var pe *ddp.ParamError
				switch {
				case errors.As(err, &me):
					if me.Name != c.wantName || me.Other != 1 || me.Rank != r {
						t.Errorf("rank %d: %+v, want parameter %q on rank 1", r, me, c.wantName)
					}
				case errors.As(err, &pe):
					if pe.Culprit != 1 || !strings.Contains(err.Error(), "rank 1") {
						t.Errorf("rank %d: %v does not name rank 1", r, err)
					}
				default:
					t.Errorf("rank %d: %T %v", r, err, err)
				}
			}
		})
	}
}

// TestNoSyncAccumulates: two micro-steps under NoSync then a synced one
// give the mean over ranks of the accumulated sums (DDP no_sync).
func TestNoSyncAccumulates(t *testing.T) {
	pgs := world(t, 2)
	ctx := ctxT(t)
	err := testrank.Ranks(2, 60*time.Second, func(r int) error {
		ts := model(r)
		m, err := ddp.Wrap(ctx, pgs[r], params(ts), ddp.Config{})
		if err != nil {
			return err
		}
		for _, x := range ts {
			x.grad = make([]float32, len(x.val))
		}
		micro := func() {
			for _, x := range ts {
				for i := range x.grad {
					x.grad[i] += float32(r + 1) // framework accumulates
				}
			}
		}
		if err := m.NoSync(func() error { micro(); return m.Sync(ctx) }); err != nil {
			return err
		}
		if ts[0].grad[0] != float32(r+1) {
			return fmt.Errorf("Sync under NoSync changed the gradient to %v", ts[0].grad[0])
		}
		micro()
		if err := m.Sync(ctx); err != nil {
			return err
		}
		// sums: rank 0 2, rank 1 4: mean 3
		for _, x := range ts {
			for i, g := range x.grad {
				if g != 3 {
					return fmt.Errorf("%s grad[%d] = %v, want 3", x.name, i, g)
				}
			}
		}
		if s := m.Stats(); s.Syncs != 1 {
			return fmt.Errorf("Syncs = %d, want 1", s.Syncs)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestAccumulateOverwritingFramework: a framework whose backward
// overwrites the gradients (Gorgonia, GoMLX) keeps two micro-steps with
// Accumulate under NoSync; the Sync of the third reduces the sum of all
// three, averaged over ranks, and empties the kept sums, so the next
// step's Sync averages only its own gradients.
func TestAccumulateOverwritingFramework(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			pgs := world(t, n)
			ctx := ctxT(t)
			err := testrank.Ranks(n, 60*time.Second, func(r int) error {
				ts := model(r)
				m, err := ddp.Wrap(ctx, pgs[r], params(ts), ddp.Config{})
				if err != nil {
					return err
				}
				backward := func(micro int) { // overwrites: g = 10·r + micro + i
					for _, x := range ts {
						x.grad = make([]float32, len(x.val))
						for i := range x.grad {
							x.grad[i] = float32(10*r + micro + i)
						}
					}
				}
				if err := m.NoSync(func() error {
					for micro := range 2 {
						backward(micro)
						if err := m.Accumulate(); err != nil {
							return err
						}
						if err := m.Sync(ctx); err != nil { // does nothing under NoSync
							return err
						}
					}
					return nil
				}); err != nil {
					return err
				}
				backward(2)
				if err := m.Sync(ctx); err != nil {
					return err
				}
				// rank r's sum: 30·r + 3 + 3i; mean over ranks: 15(n-1) + 3 + 3i
				check := func(want func(i int) float32) error {
					for _, x := range ts {
						for i, g := range x.grad {
							if g != want(i) {
								return fmt.Errorf("%s grad[%d] = %v, want %v", x.name, i, g, want(i))
							}
						}
					}
					return nil
				}
				if err := check(func(i int) float32 { return float32(15*(n-1) + 3 + 3*i) }); err != nil {
					return err
				}
				backward(5) // next step, no accumulation: mean of 10r + 5 + i
				if err := m.Sync(ctx); err != nil {
					return err
				}
				if err := check(func(i int) float32 { return float32(5*(n-1) + 5 + i) }); err != nil {
					return fmt.Errorf("the step after: %w", err)
				}
				if s := m.Stats(); s.Accumulated != 2 || s.Syncs != 2 {
					return fmt.Errorf("Accumulated, Syncs = %d, %d, want 2, 2", s.Accumulated, s.Syncs)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestAccumulateErrorKeepsSums: a Grad callback that fails during the
// second Accumulate leaves the first micro-step's sums intact: the Sync
// that follows reduces exactly them plus its own gradients.
func TestAccumulateErrorKeepsSums(t *testing.T) {
	pgs := world(t, 1)
	ctx := ctxT(t)
	ts := model(0)
	ps := params(ts)
	fail := false
	inner := ps[1].Grad
	ps[1].Grad = func(fn func(comm.Buffer)) error {
		if fail {
			return errors.New("framework lost the gradient")
		}
		return inner(fn)
	}
	m, err := ddp.Wrap(ctx, pgs[0], ps, ddp.Config{})
	if err != nil {
		t.Fatal(err)
	}
	set := func(v float32) {
		for _, x := range ts {
			x.grad = make([]float32, len(x.val))
			for i := range x.grad {
				x.grad[i] = v
			}
		}
	}
	set(1)
	if err := m.Accumulate(); err != nil {
		t.Fatal(err)
	}
	set(100)
	fail = true
	if err := m.Accumulate(); err == nil || !strings.Contains(err.Error(), "lost the gradient") {
		t.Fatalf("Accumulate with a failing callback: %v", err)
	}
	fail = false
	set(2)
	if err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	for _, x := range ts {
		for i, g := range x.grad {
			if g != 3 {
				t.Fatalf("%s grad[%d] = %v, want 1+2 = 3", x.name, i, g)
			}
		}
	}
}

// TestJoinUnevenInputs: rank 1 runs out of data after 1 step, rank 0
// takes 3; both end with rank 0's final values and no hang.
func TestJoinUnevenInputs(t *testing.T) {
	pgs := world(t, 2)
	ctx := ctxT(t)
	finals := make([][]*tensor, 2)
	err := testrank.Ranks(2, 60*time.Second, func(r int) error {
		ts := model(r)
		finals[r] = ts
		m, err := ddp.Wrap(ctx, pgs[r], params(ts), ddp.Config{Reducer: reducer.Config{UnevenInputs: true}})
		if err != nil {
			return err
		}
		steps := 3
		if r == 1 {
			steps = 1
		}
		for range steps {
			for _, x := range ts {
				x.grad = make([]float32, len(x.val))
				for i := range x.grad {
					x.grad[i] = 1
				}
			}
			if err := m.Sync(ctx); err != nil {
				return err
			}
			for _, x := range ts { // SGD with lr 1
				for i := range x.val {
					x.val[i] -= x.grad[i]
				}
			}
		}
		return m.Join(ctx)
	})
	if err != nil {
		t.Fatal(err)
	}
	for k := range finals[0] {
		for i := range finals[0][k].val {
			if finals[0][k].val[i] != finals[1][k].val[i] {
				t.Fatalf("%s[%d]: rank 0 %v, rank 1 %v after Join", finals[0][k].name, i, finals[0][k].val[i], finals[1][k].val[i])
			}
		}
	}
	// rank 0 stepped 3 times: 1 step with mean 1, 2 steps with mean 1/2 (rank 1 contributes zeros)
	if got, want := finals[0][0].val[0], float32(0-1-0.5-0.5); got != want {
		t.Fatalf("final weight[0] = %v, want %v", got, want)
	}
}

// TestFP16Hook: with the fp16 compression hook the mean arrives rounded
// to half precision.
func TestFP16Hook(t *testing.T) {
	pgs := world(t, 2)
	ctx := ctxT(t)
	err := testrank.Ranks(2, 60*time.Second, func(r int) error {
		ts := model(r)
		m, err := ddp.Wrap(ctx, pgs[r], params(ts), ddp.Config{CommHook: reducer.FP16CompressHook()})
		if err != nil {
			return err
		}
		for _, x := range ts {
			x.grad = make([]float32, len(x.val))
			for i := range x.grad {
				x.grad[i] = 1.0/3 + float32(r)
			}
		}
		if err := m.Sync(ctx); err != nil {
			return err
		}
		got := ts[0].grad[0]
		if math.Abs(float64(got)-(1.0/3+0.5)) > 1e-3 || got == float32(1.0/3+0.5) {
			return fmt.Errorf("fp16 mean %v, want ≈%v rounded to half", got, 1.0/3+0.5)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestBroadcastState: optimizer state (float32 and float64 tensors)
// arrives from rank 0; a differing list fails on every rank.
func TestBroadcastState(t *testing.T) {
	pgs := world(t, 3)
	ctx := ctxT(t)
	err := testrank.Ranks(3, 60*time.Second, func(r int) error {
		mom := []float32{float32(r), float32(r + 1)}
		step := []float64{float64(10 * r)}
		st := []ddp.Param{
			{Name: "momentum", Shape: []int{2}, Value: func(fn func(comm.Buffer)) error { fn(comm.HostBuffer(mom)); return nil }},
			{Name: "step", DType: comm.Float64, Value: func(fn func(comm.Buffer)) error { fn(comm.HostBuffer(step)); return nil }},
		}
		if err := ddp.BroadcastState(ctx, pgs[r], st); err != nil {
			return err
		}
		if mom[0] != 0 || mom[1] != 1 || step[0] != 0 {
			return fmt.Errorf("state %v %v, want rank 0's [0 1] [0]", mom, step)
		}
		if r == 2 {
			st = st[:1]
		}
		err := ddp.BroadcastState(ctx, pgs[r], st)
		if !errors.Is(err, comm.ErrMismatch) || !strings.Contains(err.Error(), `"step"`) {
			return fmt.Errorf("differing state list: %v, want ErrMismatch naming step", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestGradCallbackError: a gradient callback failing is returned, not
// swallowed (a framework that has no gradient yet).
func TestGradCallbackError(t *testing.T) {
	pgs := world(t, 1)
	ctx := ctxT(t)
	ts := model(0)
	m, err := ddp.Wrap(ctx, pgs[0], params(ts), ddp.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Sync(ctx); err == nil || !strings.Contains(err.Error(), "no gradient yet") {
		t.Fatalf("Sync without gradients: %v", err)
	}
}
