package ddp

import (
	"context"
	"math"
	"slices"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	data "github.com/ranktree/ranktree/examples/internal/mnistdata"
	"github.com/ranktree/ranktree/examples/mnist/internal/memgroup"
	"github.com/ranktree/ranktree/examples/mnist/internal/model"
	"github.com/ranktree/ranktree/examples/mnist/internal/train"
)

var (
	loadOnce          sync.Once
	trainSet, testSet *data.Set
	loadErr           error
)

func mnist(t *testing.T) (*data.Set, *data.Set) {
	t.Helper()
	loadOnce.Do(func() { trainSet, testSet, loadErr = data.Load("") })
	if loadErr != nil {
		t.Fatal(loadErr)
	}
	return trainSet, testSet
}

// runDDP trains n ranks in one process through the real reducer over the
// test group; rank r's model is built with seed 100+r, so only New's
// broadcast makes the replicas equal.
func runDDP(t *testing.T, n int, cfg train.Config, capBytes int, tr, te *data.Set) ([]*train.Result, [][]float32, *memgroup.World, []*Sync) {
	t.Helper()
	w := memgroup.New(n)
	res := make([]*train.Result, n)
	params := make([][]float32, n)
	syncs := make([]*Sync, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := model.New(model.MNISTSizes, uint64(100+r))
			if err != nil {
				errs[r] = err
				return
			}
			s, err := New(context.Background(), w.Group(r), m, capBytes, zerolog.Nop())
			if err != nil {
				errs[r] = err
				return
			}
			syncs[r] = s
			res[r], errs[r] = train.Run(context.Background(), cfg, m, tr, te, s)
			params[r] = m.Params
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("%d ranks, rank %d: %v", n, r, err)
		}
	}
	return res, params, w, syncs
}

func relDiff(a, b []float32) float64 {
	var d, s float64
	for i := range a {
		d += (float64(a[i]) - float64(b[i])) * (float64(a[i]) - float64(b[i]))
		s += float64(b[i]) * float64(b[i])
	}
	return math.Sqrt(d / s)
}

// TestReducerTwoRanksEqualOneRank trains through the real DDP reducer:
// 2 ranks with different initial models end bit-identical (hash check),
// with rank 0's start, and equal to 1 rank with the same global batch to
// 1e-5 relative. A 128 KiB bucket cap (the job's default) makes two
// buckets: {fc3, fc2} and {fc1}.
func TestReducerTwoRanksEqualOneRank(t *testing.T) {
	tr, te := mnist(t)
	tr, te = tr.Head(1280), te.Head(500)
	cfg := train.Config{Epochs: 1, GlobalBatch: 128, LR: 0.02, Momentum: 0.9, Seed: 3}
	one, p1, _, _ := runDDP(t, 1, cfg, 128<<10, tr, te)
	two, p2, w, syncs := runDDP(t, 2, cfg, 128<<10, tr, te)
	if two[0].ParamHash != two[1].ParamHash {
		t.Fatalf("ranks' hashes %s and %s differ", two[0].ParamHash, two[1].ParamHash)
	}
	for i := range p2[0] {
		if p2[0][i] != p2[1][i] {
			t.Fatalf("parameter %d: rank 0 %v, rank 1 %v", i, p2[0][i], p2[1][i])
		}
	}
	if d := relDiff(p2[0], p1[0]); d > 1e-5 {
		t.Errorf("2 ranks differ from 1 rank by %.3g relative", d)
	}
	if two[0].Steps != 10 || one[0].Steps != 10 {
		t.Errorf("steps: 2 ranks %d, 1 rank %d, want 10", two[0].Steps, one[0].Steps)
	}
	if two[0].TestSamples != 500 || two[0].Correct != two[1].Correct {
		t.Errorf("evaluation: %+v vs %+v", two[0], two[1])
	}
	// Each step reduces several buckets: more collectives than steps.
	if w.Ops(0) < 2*two[0].Steps {
		t.Errorf("only %d collectives for %d steps: the model fit in one bucket", w.Ops(0), two[0].Steps)
	}
	if st := syncs[0].Reducer().Stats(); st.Iterations != 10 || !slices.Equal(st.BucketSizes, []int{136744, 803840}) {
		t.Errorf("reducer stats: %d iterations, buckets %v bytes; want 10 and [136744 803840]", st.Iterations, st.BucketSizes)
	}
}
