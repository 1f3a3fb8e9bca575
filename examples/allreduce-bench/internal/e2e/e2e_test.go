package e2e

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu"
	"github.com/ranktree/ranktree/examples/allreduce-bench/internal/bench"
	"github.com/ranktree/ranktree/internal/testrank"
	"github.com/ranktree/ranktree/store"
)

var (
	sweep      = flag.String("sweep", "", "sizes for TestSweep (bench.ParseSizes); empty skips it")
	sweepRanks = flag.Int("ranks", 2, "ranks for TestSweep")
	sweepTrans = flag.String("transport", "shm", "transport for TestSweep: auto, shm or tcp")
	sweepIters = flag.Int("iters", 20, "timed iterations for TestSweep")
	sweepColl  = flag.String("collective", "allreduce", "collective for TestSweep")
	sweepDType = flag.String("dtype", "float32", "dtype for TestSweep")
)

// world creates the world group of n in-process ranks on the CPU engine.
func world(t testing.TB, n int, transport string) []*comm.ProcessGroup {
	t.Helper()
	st := store.NewMemStore(store.WithMemTimeout(30 * time.Second))
	f := testrank.BackendFactoryFactory(testrank.QuietSystem(), "cpu", cpu.Factory(cpu.Options{Transport: transport}), st, zerolog.Nop())
	pgs := make([]*comm.ProcessGroup, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { pgs[r], errs[r] = f.World(context.Background(), r, n) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("world rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, pg := range pgs {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_ = pg.Destroy(ctx)
			cancel()
		}
	})
	return pgs
}

// runAll runs bench.Run on every rank concurrently and returns each rank's Results.
func runAll(t testing.TB, pgs []*comm.ProcessGroup, cfg bench.Config) [][]bench.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out := make([][]bench.Result, len(pgs))
	errs := make([]error, len(pgs))
	var wg sync.WaitGroup
	for r, pg := range pgs {
		wg.Go(func() {
			errs[r] = bench.Run(ctx, pg, cfg, func(res bench.Result) error { out[r] = append(out[r], res); return nil })
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return out
}

// TestRunOverCPUEngine runs every collective for a few sizes on 3 ranks
// (not a power of two) over TCP and 2 ranks over shm, and checks that every
// rank reports the same Results with consistent bandwidths.
func TestRunOverCPUEngine(t *testing.T) {
	for _, tc := range []struct {
		n         int
		transport string
	}{{3, "tcp"}, {2, "shm"}} {
		t.Run(fmt.Sprintf("%d-%s", tc.n, tc.transport), func(t *testing.T) {
			pgs := world(t, tc.n, tc.transport)
			for c := bench.AllReduce; c <= bench.AllToAll; c++ {
				cfg := bench.Config{Collective: c, Op: comm.Sum, DType: comm.Float32, Sizes: []int64{4, 4 << 10, 300 << 10}, Iters: 3, Warmup: 1}
				res := runAll(t, pgs, cfg)
				for r := 1; r < tc.n; r++ {
					if fmt.Sprint(res[r]) != fmt.Sprint(res[0]) {
						t.Fatalf("%v: rank %d results %v differ from rank 0's %v", c, r, res[r], res[0])
					}
				}
				if len(res[0]) != 3 {
					t.Fatalf("%v: %d results, want 3", c, len(res[0]))
				}
				for _, x := range res[0] {
					want := c.Layout(x.Bytes, 4, tc.n)
					if x.TimeUs <= 0 || x.Count != want.Count || x.Bytes != int64(4*x.Count) || x.Type != "float32" {
						t.Errorf("%v: result %+v", c, x)
					}
					alg := float64(x.Bytes) / x.TimeUs / 1e3
					if d := x.AlgBwGBps - alg; d > 1e-9*alg || d < -1e-9*alg || x.BusBwGBps != x.AlgBwGBps*c.BusFactor(tc.n) {
						t.Errorf("%v: bandwidths %+v", c, x)
					}
				}
			}
		})
	}
}

// TestSweep prints the benchmark table for -sweep (skipped without it).
func TestSweep(t *testing.T) {
	if *sweep == "" {
		t.Skip("no -sweep given")
	}
	sizes, err := bench.ParseSizes(*sweep)
	if err != nil {
		t.Fatal(err)
	}
	coll, err := bench.ParseCollective(*sweepColl)
	if err != nil {
		t.Fatal(err)
	}
	dt, err := comm.ParseDType(*sweepDType)
	if err != nil {
		t.Fatal(err)
	}
	pgs := world(t, *sweepRanks, *sweepTrans)
	res := runAll(t, pgs, bench.Config{Collective: coll, DType: dt, Sizes: sizes, Iters: *sweepIters, Warmup: 3})
	s := fmt.Sprintf("\n# %v, %d in-process ranks, %s\n", coll, *sweepRanks, *sweepTrans) + bench.FormatHeader()
	for _, r := range res[0] {
		s += bench.FormatRow(r)
	}
	t.Log(s)
}
