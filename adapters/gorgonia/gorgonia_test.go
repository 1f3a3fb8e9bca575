package gorgonia_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	rtgorgonia "github.com/ranktree/ranktree/adapters/gorgonia"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu"
	"github.com/ranktree/ranktree/ddp"
	"github.com/ranktree/ranktree/internal/testrank"
)

const (
	in, hidden, out = 6, 5, 3
	globalBatch     = 8
	steps           = 4
)

// mlp is a small Gorgonia MLP with a mean cross-entropy loss over its
// batch; rank r's initial weights differ (seeded by r) so Wrap's
// broadcast matters.
type mlp struct {
	g          *G.ExprGraph
	x, y       *G.Node
	learnables G.Nodes
	vm         G.VM
}

func newMLP(t testing.TB, seed uint64, batch, hid int) *mlp {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	randT := func(shape ...int) *tensor.Dense {
		n := 1
		for _, d := range shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * 0.5)
		}
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(v))
	}
	m := &mlp{g: G.NewGraph()}
	m.x = G.NewMatrix(m.g, tensor.Float32, G.WithShape(batch, in), G.WithName("x"))
	m.y = G.NewMatrix(m.g, tensor.Float32, G.WithShape(batch, out), G.WithName("y"))
	w1 := G.NewMatrix(m.g, tensor.Float32, G.WithShape(in, hid), G.WithName("w1"), G.WithValue(randT(in, hid)))
	b1 := G.NewVector(m.g, tensor.Float32, G.WithShape(hid), G.WithName("b1"), G.WithValue(randT(hid)))
	w2 := G.NewMatrix(m.g, tensor.Float32, G.WithShape(hid, out), G.WithName("w2"), G.WithValue(randT(hid, out)))
	b2 := G.NewVector(m.g, tensor.Float32, G.WithShape(out), G.WithName("b2"), G.WithValue(randT(out)))
	m.learnables = G.Nodes{w1, b1, w2, b2}
	h := G.Must(G.Rectify(G.Must(G.BroadcastAdd(G.Must(G.Mul(m.x, w1)), b1, nil, []byte{0}))))
	logits := G.Must(G.BroadcastAdd(G.Must(G.Mul(h, w2)), b2, nil, []byte{0}))
	logp := G.Must(G.LogSoftMax(logits))
	cost := G.Must(G.Neg(G.Must(G.Mean(G.Must(G.Sum(G.Must(G.HadamardProd(logp, m.y)), 1))))))
	if _, err := G.Grad(cost, m.learnables...); err != nil {
		t.Fatal(err)
	}
	m.vm = G.NewTapeMachine(m.g, G.BindDualValues(m.learnables...))
	return m
}

// data returns the global batch of step s: inputs and one-hot labels.
func data(s int) ([]float32, []float32) {
	rng := rand.New(rand.NewPCG(uint64(s), 99))
	x := make([]float32, globalBatch*in)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	y := make([]float32, globalBatch*out)
	for i := range globalBatch {
		y[i*out+rng.IntN(out)] = 1
	}
	return x, y
}

func (m *mlp) step(t testing.TB, solver G.Solver, x, y []float32, rows int) error {
	if err := G.Let(m.x, tensor.New(tensor.WithShape(rows, in), tensor.WithBacking(x))); err != nil {
		return err
	}
	if err := G.Let(m.y, tensor.New(tensor.WithShape(rows, out), tensor.WithBacking(y))); err != nil {
		return err
	}
	if err := m.vm.RunAll(); err != nil {
		return err
	}
	defer m.vm.Reset()
	return solver.Step(G.NodesToValueGrads(m.learnables))
}

func (m *mlp) weights() [][]float32 {
	out := make([][]float32, len(m.learnables))
	for i, n := range m.learnables {
		out[i] = append([]float32(nil), n.Value().Data().([]float32)...)
	}
	return out
}

func world(t *testing.T, n int) []*comm.ProcessGroup {
	t.Helper()
	pgs, _ := testrank.LocalWorld(t, n, "cpu", cpu.Factory(cpu.Options{Transport: cpu.TransportInmem, Hub: cpu.NewInmemHub()}))
	return pgs
}

// sameWeights fails unless every rank's weights (got[rank]) are those of
// the single-rank reference (want) within float tolerance.
func sameWeights(t *testing.T, ref *mlp, got [][][]float32, want [][]float32) {
	t.Helper()
	for r := range got {
		for p := range want {
			for i := range want[p] {
				if d := math.Abs(float64(got[r][p][i] - want[p][i])); d > 1e-5 {
					t.Fatalf("rank %d %s[%d] = %v, single rank on the whole batch %v", r, ref.learnables[p].Name(), i, got[r][p][i], want[p][i])
				}
			}
		}
	}
}

// TestParityWithSingleRank is the DDP parity test (torch's
// test_DistributedDataParallel: DDP on n ranks against the local model on
// the concatenated batch): training on 2 ranks with half the global batch
// each gives the same weights as one rank on the whole batch, for plain
// SGD and for momentum, within float tolerance.
func TestParityWithSingleRank(t *testing.T) {
	solvers := map[string]func() G.Solver{
		"sgd":      func() G.Solver { return G.NewVanillaSolver(G.WithLearnRate(0.1)) },
		"momentum": func() G.Solver { return G.NewMomentum(G.WithLearnRate(0.1), G.WithMomentum(0.9)) },
	}
	for name, mk := range solvers {
		t.Run(name, func(t *testing.T) {
			ref := newMLP(t, 0, globalBatch, hidden)
			refSolver := mk()
			for s := range steps {
				x, y := data(s)
				if err := ref.step(t, refSolver, x, y, globalBatch); err != nil {
					t.Fatal(err)
				}
			}
			want := ref.weights()

			const n = 2
			pgs := world(t, n)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			got := make([][][]float32, n)
			err := testrank.Ranks(n, 60*time.Second, func(r int) error {
				m := newMLP(t, uint64(r), globalBatch/n, hidden) // rank 1 starts from other weights
				dp, err := rtgorgonia.Wrap(ctx, pgs[r], m.learnables, ddp.Config{})
				if err != nil {
					return err
				}
				solver := dp.Solver(mk())
				per := globalBatch / n
				for s := range steps {
					x, y := data(s)
					if err := m.step(t, solver, x[r*per*in:(r+1)*per*in], y[r*per*out:(r+1)*per*out], per); err != nil {
						return err
					}
				}
				got[r] = m.weights()
				if st := dp.Model().Stats(); st.Syncs != steps {
					return fmt.Errorf("Syncs = %d, want %d", st.Syncs, steps)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			sameWeights(t, ref, got, want)
		})
	}
}

// TestAccumulateParity: gradient accumulation under NoSync. Two ranks,
// each running two micro-batches of a quarter of the global batch (the
// first under NoSync without a Step: RunAll adds to the gradients; the
// second RunAll then Step outside it), reduce
// the sum of the two micro-steps' mean gradients: twice the global
// batch's mean gradient. With half the learning rate they end with the
// weights of one rank stepping on the whole batch, for SGD and momentum.
func TestAccumulateParity(t *testing.T) {
	solvers := map[string]func(lr float64) G.Solver{
		"sgd":      func(lr float64) G.Solver { return G.NewVanillaSolver(G.WithLearnRate(lr)) },
		"momentum": func(lr float64) G.Solver { return G.NewMomentum(G.WithLearnRate(lr), G.WithMomentum(0.9)) },
	}
	for name, mk := range solvers {
		t.Run(name, func(t *testing.T) {
			ref := newMLP(t, 0, globalBatch, hidden)
			refSolver := mk(0.1)
			for s := range steps {
				x, y := data(s)
				if err := ref.step(t, refSolver, x, y, globalBatch); err != nil {
					t.Fatal(err)
				}
			}
			want := ref.weights()

			const n, micro = 2, 2
			pgs := world(t, n)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			got := make([][][]float32, n)
			err := testrank.Ranks(n, 60*time.Second, func(r int) error {
				per := globalBatch / n / micro
				m := newMLP(t, uint64(r), per, hidden)
				dp, err := rtgorgonia.Wrap(ctx, pgs[r], m.learnables, ddp.Config{})
				if err != nil {
					return err
				}
				solver := dp.Solver(mk(0.1 / micro))
				for s := range steps {
					x, y := data(s)
					lo := r * micro // this rank's first micro-batch
					xs := func(k int) []float32 { return x[(lo+k)*per*in : (lo+k+1)*per*in] }
					ys := func(k int) []float32 { return y[(lo+k)*per*out : (lo+k+1)*per*out] }
					if err := dp.Model().NoSync(func() error {
						if err := G.Let(m.x, tensor.New(tensor.WithShape(per, in), tensor.WithBacking(xs(0)))); err != nil {
							return err
						}
						if err := G.Let(m.y, tensor.New(tensor.WithShape(per, out), tensor.WithBacking(ys(0)))); err != nil {
							return err
						}
						if err := m.vm.RunAll(); err != nil {
							return err
						}
						m.vm.Reset()
						return nil
					}); err != nil {
						return err
					}
					if err := m.step(t, solver, xs(1), ys(1), per); err != nil {
						return err
					}
				}
				got[r] = m.weights()
				if st := dp.Model().Stats(); st.Syncs != steps {
					return fmt.Errorf("Syncs = %d, want %d", st.Syncs, steps)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			sameWeights(t, ref, got, want)
		})
	}
}

// TestWrapMismatchedModel: a rank with another hidden size fails on every
// rank with ErrMismatch naming the first differing learnable (w1).
func TestWrapMismatchedModel(t *testing.T) {
	pgs := world(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errs := make([]error, 2)
	_ = testrank.Ranks(2, 60*time.Second, func(r int) error {
		m := newMLP(t, 0, 4, hidden+r)
		_, errs[r] = rtgorgonia.Wrap(ctx, pgs[r], m.learnables, ddp.Config{})
		return nil
	})
	for r, err := range errs {
		var me *ddp.MismatchError
		if !errors.Is(err, comm.ErrMismatch) || !errors.As(err, &me) || me.Name != "w1" {
			t.Errorf("rank %d: %v, want ErrMismatch naming w1", r, err)
		}
	}
}

// TestStepWithoutGradients: stepping before the VM ran reports the
// missing gradient and does not step.
func TestStepWithoutGradients(t *testing.T) {
	pgs := world(t, 1)
	m := newMLP(t, 0, 4, hidden)
	dp, err := rtgorgonia.Wrap(context.Background(), pgs[0], m.learnables, ddp.Config{})
	if err != nil {
		t.Fatal(err)
	}
	before := m.weights()
	err = dp.Solver(G.NewVanillaSolver()).Step(G.NodesToValueGrads(m.learnables))
	if err == nil {
		t.Fatal("Step before RunAll succeeded")
	}
	if after := m.weights(); after[0][0] != before[0][0] {
		t.Fatal("weights changed by a failed Step")
	}
}

// TestStepInsideNoSync: the wrapped solver refuses to step inside NoSync
// (it would apply un-averaged gradients) and leaves the weights alone.
func TestStepInsideNoSync(t *testing.T) {
	pgs := world(t, 1)
	m := newMLP(t, 0, 4, hidden)
	dp, err := rtgorgonia.Wrap(context.Background(), pgs[0], m.learnables, ddp.Config{})
	if err != nil {
		t.Fatal(err)
	}
	before := m.weights()
	x, y := data(0)
	err = dp.Model().NoSync(func() error {
		return m.step(t, dp.Solver(G.NewVanillaSolver(G.WithLearnRate(0.1))), x[:4*in], y[:4*out], 4)
	})
	if !errors.Is(err, comm.ErrUnsupported) {
		t.Fatalf("Step inside NoSync: %v, want ErrUnsupported", err)
	}
	if after := m.weights(); after[0][0] != before[0][0] {
		t.Fatal("weights changed by a refused Step")
	}
}
