package train

import (
	"bytes"
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	data "github.com/ranktree/ranktree/examples/internal/mnistdata"
	"github.com/ranktree/ranktree/examples/mnist/internal/model"
)

var (
	loadOnce          sync.Once
	trainSet, testSet *data.Set
	loadErr           error
)

func mnist(t testing.TB) (*data.Set, *data.Set) {
	t.Helper()
	loadOnce.Do(func() { trainSet, testSet, loadErr = data.Load("") })
	if loadErr != nil {
		t.Fatal(loadErr)
	}
	return trainSet, testSet
}

func baseConfig() Config {
	return Config{Epochs: 1, GlobalBatch: 96, LR: 0.05, Momentum: 0.9, Seed: 1}
}

// runSim trains n simulated ranks in lockstep and returns each rank's
// result, error and final parameters.
func runSim(t *testing.T, n int, cfg Config, tr, te *data.Set, tamper func(int, [][]float32)) ([]*Result, []error, [][]float32) {
	t.Helper()
	g := newSimGroup(n)
	g.tamper = tamper
	res := make([]*Result, n)
	errs := make([]error, n)
	params := make([][]float32, n)
	var wg sync.WaitGroup
	for r := range n {
		m, err := model.New(model.MNISTSizes, 11)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[r], errs[r] = Run(context.Background(), cfg, m, tr, te, &simRank{g: g, rank: r})
			params[r] = m.Params
		}()
	}
	wg.Wait()
	return res, errs, params
}

func relDiff(a, b []float32) float64 {
	var d, n float64
	for i := range a {
		d += (float64(a[i]) - float64(b[i])) * (float64(a[i]) - float64(b[i]))
		n += float64(b[i]) * float64(b[i])
	}
	return math.Sqrt(d / n)
}

// TestShardGradientsAverageToGlobalBatch: the mean of n ranks' gradients on
// their shards of a global batch equals the gradient of the whole batch on
// one rank, to 1e-5 relative — the identity DDP rests on.
func TestShardGradientsAverageToGlobalBatch(t *testing.T) {
	tr, _ := mnist(t)
	m, _ := model.New(model.MNISTSizes, 5)
	const global = 120
	idx := rand.New(rand.NewPCG(1, 2)).Perm(tr.Len())[:global]
	x := make([]float32, global*data.Pixels)
	y := make([]uint8, global)
	x, y = tr.Gather(idx, x, y)
	full := make([]float32, m.NumParams())
	if _, _, err := m.LossAndGrad(m.NewWorkspace(global), x, y, full, nil); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{2, 3, 4} {
		b := global / n
		avg := make([]float32, m.NumParams())
		g := make([]float32, m.NumParams())
		ws := m.NewWorkspace(b)
		for r := range n { // rank r's shard: positions r, r+n, ... as the sampler deals them
			var sidx []int
			for i := r; i < global; i += n {
				sidx = append(sidx, idx[i])
			}
			xs, ys := tr.Gather(sidx, make([]float32, b*data.Pixels), make([]uint8, b))
			if _, _, err := m.LossAndGrad(ws, xs, ys, g, nil); err != nil {
				t.Fatal(err)
			}
			for i, v := range g {
				avg[i] += v / float32(n)
			}
		}
		if d := relDiff(avg, full); d > 1e-5 {
			t.Errorf("%d ranks: averaged shard gradients differ from the global-batch gradient by %.3g relative", n, d)
		}
	}
}

// TestNRanksEqualOneRank trains 1, 2 and 3 simulated ranks with the same
// global batch: final parameters agree to 1e-5 relative, every rank of a
// run is bit-identical (the hash check passes), and the gradients reach
// the Sync in reverse parameter order.
func TestNRanksEqualOneRank(t *testing.T) {
	tr, te := mnist(t)
	tr, te = tr.Head(960), te.Head(600)
	cfg := baseConfig()
	one, errs, p1 := runSim(t, 1, cfg, tr, te, nil)
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	init, _ := model.New(model.MNISTSizes, 11)
	if d := relDiff(p1[0], init.Params); d < 1e-3 {
		t.Fatalf("training moved the parameters by only %.3g relative", d)
	}
	for _, n := range []int{2, 3} {
		res, errs, ps := runSim(t, n, cfg, tr, te, nil)
		for r := range n {
			if errs[r] != nil {
				t.Fatalf("%d ranks, rank %d: %v", n, r, errs[r])
			}
			if res[r].ParamHash != res[0].ParamHash || res[r].Correct != res[0].Correct {
				t.Fatalf("%d ranks: rank %d result %+v differs from rank 0's %+v", n, r, res[r], res[0])
			}
		}
		if d := relDiff(ps[0], p1[0]); d > 1e-5 {
			t.Errorf("%d ranks: final parameters differ from 1 rank's by %.3g relative", n, d)
		}
		if res[0].Steps != one[0].Steps || res[0].Steps != 10 {
			t.Errorf("%d ranks took %d steps, 1 rank %d, want 10", n, res[0].Steps, one[0].Steps)
		}
		if res[0].TestSamples != 600 {
			t.Errorf("%d ranks evaluated %d test samples, want 600", n, res[0].TestSamples)
		}
		if diff := res[0].Correct - one[0].Correct; diff < -3 || diff > 3 {
			t.Errorf("%d ranks: %d correct, 1 rank %d", n, res[0].Correct, one[0].Correct)
		}
	}
}

func TestGradientsAnnouncedInReverse(t *testing.T) {
	tr, te := mnist(t)
	m, _ := model.New(model.MNISTSizes, 1)
	s := &simRank{g: newSimGroup(1)}
	cfg := baseConfig()
	if _, err := Run(context.Background(), cfg, m, tr.Head(96), te.Head(10), s); err != nil {
		t.Fatal(err)
	}
	if want := []int{5, 4, 3, 2, 1, 0}; len(s.order) != len(want) || s.order[0] != 5 || s.order[5] != 0 {
		t.Fatalf("GradReady order %v, want %v", s.order, want)
	}
}

// TestDivergedReplicasFail perturbs rank 1's gradient once: every rank
// must report ErrParamMismatch.
func TestDivergedReplicasFail(t *testing.T) {
	tr, te := mnist(t)
	var once sync.Once
	tamper := func(rank int, views [][]float32) {
		if rank == 1 {
			once.Do(func() { views[0][0] += 1e-3 })
		}
	}
	_, errs, _ := runSim(t, 2, baseConfig(), tr.Head(192), te.Head(100), tamper)
	for r, err := range errs {
		var pm *ParamMismatchError
		if !errors.Is(err, ErrParamMismatch) || !errors.As(err, &pm) || pm.Rank != r {
			t.Errorf("rank %d: err = %v, want *ParamMismatchError for rank %d", r, err, r)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	tr, te := mnist(t)
	m, _ := model.New(model.MNISTSizes, 1)
	for name, mod := range map[string]func(*Config){
		"zero epochs":     func(c *Config) { c.Epochs = 0 },
		"batch not split": func(c *Config) { c.GlobalBatch = 97 },
		"zero lr":         func(c *Config) { c.LR = 0 },
	} {
		cfg := baseConfig()
		mod(&cfg)
		if _, err := Run(context.Background(), cfg, m, tr.Head(96), te.Head(10), &simRank{g: newSimGroup(2)}); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	small, _ := model.New([]int{data.Pixels, 5}, 1)
	if _, err := Run(context.Background(), baseConfig(), small, tr.Head(96), te.Head(10), &simRank{g: newSimGroup(1)}); err == nil {
		t.Error("a model with 5 outputs was accepted")
	}
}

func TestProgressBarShowsLossAndRate(t *testing.T) {
	tr, te := mnist(t)
	m, _ := model.New(model.MNISTSizes, 1)
	var buf bytes.Buffer
	cfg := baseConfig()
	cfg.Progress = &buf
	cfg.ProgressTTY = true
	if _, err := Run(context.Background(), cfg, m, tr.Head(960), te.Head(10), &simRank{g: newSimGroup(1)}); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"epoch 1/1", "loss", "samples/s", "960/960"} {
		if !strings.Contains(out, want) {
			t.Errorf("progress output lacks %q:\n%s", want, out)
		}
	}
}

// TestShortTrainingAccuracy: one epoch on 10k samples reaches 90% test
// accuracy (a quick floor; the full run is TestFullTraining97).
func TestShortTrainingAccuracy(t *testing.T) {
	tr, te := mnist(t)
	m, _ := model.New(model.MNISTSizes, 1)
	cfg := baseConfig()
	cfg.GlobalBatch = 64
	res, err := Run(context.Background(), cfg, m, tr.Head(10000), te, &simRank{g: newSimGroup(1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("1 epoch on 10k samples: accuracy %.4f, %.0f samples/s", res.Accuracy, res.SamplesPerSec)
	if res.Accuracy < 0.90 {
		t.Fatalf("test accuracy %.4f after one epoch on 10k samples, want ≥ 0.90", res.Accuracy)
	}
}

// TestFullTraining97 is the acceptance run on one process: 3
// epochs over all 60k samples with the job's default flags reach 97% test
// accuracy. Skipped under -short.
func TestFullTraining97(t *testing.T) {
	if testing.Short() {
		t.Skip("full 3-epoch training skipped in -short mode")
	}
	tr, te := mnist(t)
	m, _ := model.New(model.MNISTSizes, 1)
	cfg := Config{Epochs: 3, GlobalBatch: DefaultBatch, LR: DefaultLR, Momentum: DefaultMomentum, Seed: 1}
	start := time.Now()
	res, err := Run(context.Background(), cfg, m, tr, te, &simRank{g: newSimGroup(1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("3 epochs: accuracy %.4f, %.0f samples/s, training %.1fs, wall %.1fs, losses %v",
		res.Accuracy, res.SamplesPerSec, res.TrainSeconds, time.Since(start).Seconds(), res.Epochs)
	if res.Accuracy < 0.97 {
		t.Fatalf("test accuracy %.4f after 3 epochs, want ≥ 0.97", res.Accuracy)
	}
}
