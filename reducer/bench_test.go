package reducer

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu"
)

// benchLayers is the benchmark model: 10 float32 layers of 2.5 M
// parameters, 25 M parameters (100 MB) in all.
const (
	benchLayers    = 10
	benchLayerSize = 2_500_000
	benchPasses    = 6 // synthetic backward work per layer (passes over its weights)
)

// idleCompute is the per-layer backward time of the "idle" variant.
const idleCompute = 8 * time.Millisecond

// backwardLayer is a synthetic backward step for one layer: a few
// memory-bound passes computing a gradient from the weights ("cpu"), or,
// with idle, a sleep standing for an accelerator's backward kernel plus
// one pass writing the gradient: the host CPU stays free for the engine,
// as when backward runs on a GPU.
func backwardLayer(grad, w []float32, seed float32, idle bool) {
	for i := range grad {
		grad[i] = w[i]*0.5 + seed
	}
	if idle {
		time.Sleep(idleCompute)
		return
	}
	for range benchPasses - 1 {
		for i := range grad {
			grad[i] = grad[i]*0.999 + w[i]*0.001
		}
	}
}

// BenchmarkDDPStep compares, on 2 ranks of the real CPU engine (in-process
// ranks, shm transport), one training step of a 25 M-parameter float32
// model three ways: backward compute alone (nocomm), the bucket
// allreduces alone (comm), and backward with the Reducer (ddp). It
// reports the median of each in ms/step; the overlap efficiency as the share of the
// communication time hidden behind backward end to end,
// hidden-% = (nocomm + comm − ddp) / comm (negative when running the
// engine next to backward slows backward down more than the overlap
// saves, as on a small, shared CPU); stats-overlap-% = the reducer's
// AvgOverlapTime / AvgCommTime (c10d's overlap / comm time); and
// wait-ms/step, the communication tail EndBackward still waits for.
// Variants: compute cpu|idle (see backwardLayer), transport shm|tcp,
// gradients copied or in bucket views.
// Run: go test -run '^$' -bench DDPStep -benchtime 9x ./reducer/
func BenchmarkDDPStep(b *testing.B) {
	modes := []struct {
		name string
		cfg  Config
	}{
		{"copy", Config{}},
		{"view", Config{GradientAsBucketView: true}},
	}
	for _, compute := range []string{"cpu", "idle"} {
		for _, tr := range []string{"shm", "tcp"} {
			if compute == "idle" && tr == "tcp" {
				continue
			}
			for _, mode := range modes {
				b.Run(compute+"/"+tr+"/"+mode.name, func(b *testing.B) {
					benchDDPStep(b, cpu.Options{Transport: tr}, mode.cfg, compute == "idle")
				})
			}
		}
	}
}

func benchDDPStep(b *testing.B, opts cpu.Options, cfg Config, idle bool) {
	const n = 2
	groups := newCPUGroupsWith(b, n, opts)
	type rankState struct {
		red   *Reducer
		data  [][]float32
		grads [][]float32
	}
	ranks := make([]*rankState, n)
	sizes := make([]int, benchLayers)
	for i := range sizes {
		sizes[i] = benchLayerSize
	}
	// Build the reducers (New is a collective) and run one warm-up
	// iteration so the one-time rebuild is not measured.
	runRanks(b, groups, func(rank int, g Group) error {
		m := newModel(sizes...)
		red, err := New(bg, g, m.params, cfg)
		if err != nil {
			return err
		}
		ranks[rank] = &rankState{red: red, data: m.data, grads: m.grads}
		return ddpStep(red, m.data, m.grads, cfg.GradientAsBucketView, rank, idle)
	})
	var nocomm, commOnly, ddp []time.Duration
	phase := func(fn func(rank int) error) time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		errs := make([]error, n)
		for r := range n {
			wg.Add(1)
			go func() { defer wg.Done(); errs[r] = fn(r) }()
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				b.Fatalf("rank %d: %v", r, err)
			}
		}
		return time.Since(start)
	}
	b.ResetTimer()
	for range b.N {
		nocomm = append(nocomm, phase(func(rank int) error {
			s := ranks[rank]
			for p := benchLayers - 1; p >= 0; p-- {
				backwardLayer(s.grads[p], s.data[p], float32(rank), idle)
			}
			return nil
		}))
		commOnly = append(commOnly, phase(func(rank int) error {
			s := ranks[rank]
			s.red.mu.Lock()
			bufs := append([]comm.Buffer(nil), s.red.bufs...)
			s.red.mu.Unlock()
			works := make([]*comm.Work, len(bufs))
			for i, buf := range bufs {
				works[i] = groups[rank].AllReduce(bg, buf, comm.Sum)
			}
			for _, w := range works {
				if err := w.Wait(bg); err != nil {
					return err
				}
			}
			return nil
		}))
		ddp = append(ddp, phase(func(rank int) error {
			s := ranks[rank]
			return ddpStep(s.red, s.data, s.grads, cfg.GradientAsBucketView, rank, idle)
		}))
	}
	b.StopTimer()
	// Medians per phase: robust to a noisy, shared machine.
	med := func(ds []time.Duration) time.Duration {
		ds = slices.Clone(ds)
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	nc, cm, dp := med(nocomm), med(commOnly), med(ddp)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
	b.ReportMetric(ms(nc), "nocomm-ms/step")
	b.ReportMetric(ms(cm), "comm-ms/step")
	b.ReportMetric(ms(dp), "ddp-ms/step")
	if cm > 0 {
		b.ReportMetric(100*float64(nc+cm-dp)/float64(cm), "hidden-%")
	}
	st := ranks[0].red.Stats()
	if st.AvgCommTime > 0 {
		b.ReportMetric(100*float64(st.AvgOverlapTime)/float64(st.AvgCommTime), "stats-overlap-%")
	}
	b.ReportMetric(float64(st.AvgWaitTime.Microseconds())/1e3, "wait-ms/step")
	b.Logf("buckets %d %v; avg compute %v comm %v overlap %v wait %v", len(st.BucketSizes), st.BucketSizes,
		st.AvgComputeTime.Round(time.Millisecond), st.AvgCommTime.Round(time.Millisecond),
		st.AvgOverlapTime.Round(time.Millisecond), st.AvgWaitTime.Round(time.Millisecond))
}

// ddpStep is one synced iteration: layers' gradients in reverse order.
func ddpStep(red *Reducer, data, grads [][]float32, view bool, rank int, idle bool) error {
	for p := len(data) - 1; p >= 0; p-- {
		g := grads[p]
		if view {
			g = mustSlice[float32](red.GradBuffer(p))
		}
		backwardLayer(g, data[p], float32(rank), idle)
		if err := red.GradReady(p, comm.HostBuffer(g)); err != nil {
			return fmt.Errorf("GradReady(%d): %w", p, err)
		}
	}
	return red.EndBackward(bg)
}

// BenchmarkDivInto measures the pre-division copy of 2.5 M float32
// gradients into a bucket (c10d copy_grad_to_bucket): world size 2 takes
// the SIMD path (exact reciprocal), 3 the scalar IEEE division.
func BenchmarkDivInto(b *testing.B) {
	src := make([]float32, benchLayerSize)
	dst := make([]float32, benchLayerSize)
	for _, div := range []int{2, 3} {
		b.Run(fmt.Sprintf("n=%d", div), func(b *testing.B) {
			b.SetBytes(int64(4 * benchLayerSize))
			for range b.N {
				if err := divInto(comm.HostBuffer(dst), comm.HostBuffer(src), div); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// nullGroup is a benchmark stand-in whose collectives complete at once
// without moving data (AllGatherInto replicates the input so New's model
// check passes): what remains of a DDP step is the reducer's own cost.
type nullGroup struct{ rank, size int }

func (g nullGroup) Rank() int { return g.rank }
func (g nullGroup) Size() int { return g.size }
func (g nullGroup) AllReduce(context.Context, comm.Buffer, comm.ReduceOp, ...comm.OpOption) *comm.Work {
	return comm.FailedWork(comm.OpAllReduce, nil)
}
func (g nullGroup) Broadcast(context.Context, comm.Buffer, int, ...comm.OpOption) *comm.Work {
	return comm.FailedWork(comm.OpBroadcast, nil)
}
func (g nullGroup) AllGatherInto(_ context.Context, out, in comm.Buffer, _ ...comm.OpOption) *comm.Work {
	for r := range g.size {
		comm.CopyBuffer(out.Slice(r*in.Len(), in.Len()), in)
	}
	return comm.FailedWork(comm.OpAllGather, nil)
}

// BenchmarkReducerOverhead is one 25 M-parameter step of one rank of 2
// with collectives that cost nothing and no backward compute: the
// reducer's own cost (pre-division copy into buckets, launches, copy back
// of results; in place with bucket views).
func BenchmarkReducerOverhead(b *testing.B) {
	for _, view := range []bool{false, true} {
		b.Run(fmt.Sprintf("view=%v", view), func(b *testing.B) {
			sizes := make([]int, benchLayers)
			for i := range sizes {
				sizes[i] = benchLayerSize
			}
			m := newModel(sizes...)
			red, err := New(bg, nullGroup{0, 2}, m.params, Config{GradientAsBucketView: view})
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(4 * benchLayers * benchLayerSize)
			b.ResetTimer()
			for range b.N {
				for p := benchLayers - 1; p >= 0; p-- {
					g := comm.HostBuffer(m.grads[p])
					if view {
						g = red.GradBuffer(p)
					}
					if err := red.GradReady(p, g); err != nil {
						b.Fatal(err)
					}
				}
				if err := red.EndBackward(bg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
