package gomlx_test

import (
	stdctx "context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/layers/activations"
	"github.com/gomlx/gomlx/pkg/ml/train"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"

	rtgomlx "github.com/ranktree/ranktree/adapters/gomlx"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu"
	"github.com/ranktree/ranktree/ddp"
	"github.com/ranktree/ranktree/internal/testrank"
)

const (
	in, out     = 6, 3
	globalBatch = 8
	steps       = 4
)

func modelFn(hidden int) train.ModelFn {
	return func(ctx *context.Context, _ any, inputs []*graph.Node) []*graph.Node {
		ctx = ctx.In("model")
		h := activations.Relu(layers.Dense(ctx.In("fc1"), inputs[0], true, hidden))
		return []*graph.Node{layers.Dense(ctx.In("fc2"), h, true, out)}
	}
}

func backend(t testing.TB) backends.Backend {
	t.Helper()
	b, err := simplego.New("")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mlContext(t testing.TB, seed int64) *context.Context {
	t.Helper()
	c := context.New()
	if err := c.SetRNGStateFromSeed(seed); err != nil {
		t.Fatal(err)
	}
	return c
}

// batch returns step s's global batch rows [lo, hi): inputs [n, in] and
// sparse labels [n, 1].
func batch(s, lo, hi int) (*tensors.Tensor, *tensors.Tensor) {
	rng := rand.New(rand.NewPCG(uint64(s), 5))
	x := make([]float32, globalBatch*in)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	y := make([]int32, globalBatch)
	for i := range y {
		y[i] = int32(rng.IntN(out))
	}
	return tensors.FromFlatDataAndDimensions(x[lo*in:hi*in], hi-lo, in), tensors.FromFlatDataAndDimensions(y[lo:hi], hi-lo, 1)
}

// weights copies every trainable variable, by name.
func weights(t testing.TB, c *context.Context) map[string][]float32 {
	t.Helper()
	w := map[string][]float32{}
	for v := range c.IterVariables() {
		if !v.Trainable {
			continue
		}
		val, err := v.Value()
		if err != nil {
			t.Fatal(err)
		}
		w[v.ScopeAndName()] = append([]float32(nil), tensors.MustCopyFlatData[float32](val)...)
	}
	return w
}

func world(t *testing.T, n int) []*comm.ProcessGroup {
	t.Helper()
	pgs, _ := testrank.LocalWorld(t, n, "cpu", cpu.Factory(cpu.Options{Transport: cpu.TransportInmem, Hub: cpu.NewInmemHub()}))
	return pgs
}

func optimizer(name string) optimizers.Interface {
	if name == "adam" {
		return optimizers.Adam().LearningRate(0.01).Done()
	}
	return optimizers.StochasticGradientDescent().WithLearningRate(0.1)
}

// trainDDP trains on n ranks (rank r starting from seed r) and returns
// every rank's final weights.
func trainDDP(t *testing.T, n int, opt string) []map[string][]float32 {
	pgs := world(t, n)
	ctx, cancel := stdctx.WithTimeout(stdctx.Background(), 2*time.Minute)
	defer cancel()
	res := make([]map[string][]float32, n)
	err := testrank.Ranks(n, 2*time.Minute, func(r int) error {
		mc := mlContext(t, int64(r+1))
		tr, err := rtgomlx.NewTrainer(ctx, pgs[r], ddp.Config{}, backend(t), mc, modelFn(5),
			losses.SparseCategoricalCrossEntropyLogits, optimizer(opt), nil, nil)
		if err != nil {
			return err
		}
		per := globalBatch / n
		for s := range steps {
			x, y := batch(s, r*per, (r+1)*per)
			if _, err := tr.TrainStep(nil, []*tensors.Tensor{x}, []*tensors.Tensor{y}); err != nil {
				return fmt.Errorf("step %d: %w", s, err)
			}
		}
		if st := tr.Model().Stats(); st.Syncs != steps {
			return fmt.Errorf("Syncs = %d, want %d", st.Syncs, steps)
		}
		res[r] = weights(t, mc)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func compare(t *testing.T, what string, got, want map[string][]float32, tol float64) {
	t.Helper()
	if len(got) != len(want) || len(want) == 0 {
		t.Fatalf("%s: %d variables, want %d", what, len(got), len(want))
	}
	for name, w := range want {
		g := got[name]
		if len(g) != len(w) {
			t.Fatalf("%s: %s has %d values, want %d", what, name, len(g), len(w))
		}
		for i := range w {
			if math.Abs(float64(g[i]-w[i])) > tol {
				t.Fatalf("%s: %s[%d] = %v, want %v", what, name, i, g[i], w[i])
			}
		}
	}
}

// TestParityWithSingleRank is the DDP parity test: 2 ranks with half the
// global batch each end with the same weights as 1 rank on the whole
// batch (SGD and Adam), and the 1-rank two-graph step matches GoMLX's own
// train.Trainer on the same data and seed.
func TestParityWithSingleRank(t *testing.T) {
	for _, opt := range []string{"sgd", "adam"} {
		t.Run(opt, func(t *testing.T) {
			one := trainDDP(t, 1, opt)[0]
			two := trainDDP(t, 2, opt)
			compare(t, "rank 0 of 2 vs 1 rank", two[0], one, 1e-5)
			compare(t, "rank 1 of 2 vs 1 rank", two[1], one, 1e-5)

			mc := mlContext(t, 1)
			stock := train.NewTrainer(backend(t), mc, modelFn(5), losses.SparseCategoricalCrossEntropyLogits, optimizer(opt), nil, nil)
			for s := range steps {
				x, y := batch(s, 0, globalBatch)
				if _, err := stock.TrainStep(nil, []*tensors.Tensor{x}, []*tensors.Tensor{y}); err != nil {
					t.Fatal(err)
				}
			}
			compare(t, "1 rank vs GoMLX train.Trainer", one, weights(t, mc), 1e-5)
		})
	}
}

// TestMismatchedModel: ranks with different hidden sizes fail at the
// first TrainStep (where the variables come to exist) with ErrMismatch
// naming the first differing variable, on every rank.
func TestMismatchedModel(t *testing.T) {
	pgs := world(t, 2)
	ctx, cancel := stdctx.WithTimeout(stdctx.Background(), time.Minute)
	defer cancel()
	errs := make([]error, 2)
	_ = testrank.Ranks(2, time.Minute, func(r int) error {
		tr, err := rtgomlx.NewTrainer(ctx, pgs[r], ddp.Config{}, backend(t), mlContext(t, 1), modelFn(5+r),
			losses.SparseCategoricalCrossEntropyLogits, optimizer("sgd"), nil, nil)
		if err != nil {
			errs[r] = err
			return nil
		}
		x, y := batch(0, r*4, r*4+4)
		_, errs[r] = tr.TrainStep(nil, []*tensors.Tensor{x}, []*tensors.Tensor{y})
		return nil
	})
	for r, err := range errs {
		var me *ddp.MismatchError
		if !errors.Is(err, comm.ErrMismatch) || !errors.As(err, &me) || me.Name != "/model/fc1/dense/weights" {
			t.Errorf("rank %d: %v, want ErrMismatch naming /model/fc1/dense/weights", r, err)
		}
	}
}

// TestNoSyncAccumulates is gradient accumulation (DDP no_sync): 2 ranks,
// each taking its half of the global batch in two micro-batches (the
// first TrainStep inside NoSync keeps its gradients, the second applies
// the sum) with half the learning rate, end with the weights of 1 rank
// training with SGD on the whole batch. Wrap comes first so that NoSync
// is usable from step 0. Inside NoSync the variables do not move.
func TestNoSyncAccumulates(t *testing.T) {
	one := trainDDP(t, 1, "sgd")[0]

	const n, micro = 2, 2
	pgs := world(t, n)
	ctx, cancel := stdctx.WithTimeout(stdctx.Background(), 2*time.Minute)
	defer cancel()
	res := make([]map[string][]float32, n)
	err := testrank.Ranks(n, 2*time.Minute, func(r int) error {
		mc := mlContext(t, int64(r+1))
		tr, err := rtgomlx.NewTrainer(ctx, pgs[r], ddp.Config{}, backend(t), mc, modelFn(5),
			losses.SparseCategoricalCrossEntropyLogits, optimizers.StochasticGradientDescent().WithLearningRate(0.1/micro), nil, nil)
		if err != nil {
			return err
		}
		per := globalBatch / n
		mb := per / micro
		step := func(s, lo, hi int) error {
			x, y := batch(s, lo, hi)
			_, err := tr.TrainStep(nil, []*tensors.Tensor{x}, []*tensors.Tensor{y})
			return err
		}
		x, y := batch(0, r*per, r*per+mb)
		if err := tr.Wrap(nil, []*tensors.Tensor{x}, []*tensors.Tensor{y}); err != nil {
			return err
		}
		for s := range steps {
			lo := r * per
			if err := tr.Model().NoSync(func() error {
				before := weights(t, mc)
				if err := step(s, lo, lo+mb); err != nil {
					return err
				}
				for name, w := range weights(t, mc) {
					if w[0] != before[name][0] {
						return fmt.Errorf("%s moved inside NoSync", name)
					}
				}
				return nil
			}); err != nil {
				return fmt.Errorf("step %d under NoSync: %w", s, err)
			}
			if err := step(s, lo+mb, lo+per); err != nil {
				return fmt.Errorf("step %d: %w", s, err)
			}
		}
		if st := tr.Model().Stats(); st.Accumulated != steps || st.Syncs != steps {
			return fmt.Errorf("Accumulated, Syncs = %d, %d, want %d, %d", st.Accumulated, st.Syncs, steps, steps)
		}
		if tm := tr.Times(); tm.Steps != steps {
			return fmt.Errorf("Times().Steps = %d, want %d", tm.Steps, steps)
		}
		res[r] = weights(t, mc)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	compare(t, "rank 0 of 2 with accumulation vs 1 rank", res[0], one, 1e-5)
	compare(t, "rank 1 of 2 with accumulation vs 1 rank", res[1], one, 1e-5)
}
