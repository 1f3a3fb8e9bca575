package cpu

import (
	"context"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/store"
)

// benchAllReduce measures a float32 Sum allreduce of nbytes on 2 ranks (as
// goroutines in this process) over transport tr. It reports algbw (GB/s,
// bytes / median time) and the median latency in µs.
func benchAllReduce(b *testing.B, tr string, nbytes int) {
	benchAllReduceN(b, 2, Options{Transport: tr}, nbytes)
}

// benchAllReduceN is benchAllReduce on n ranks with opts.
func benchAllReduceN(b *testing.B, n int, opts Options, nbytes int) {
	g := newGroup(b, n, opts)
	count := nbytes / 4
	bufs := make([]comm.Buffer, n)
	for r := range n {
		bufs[r] = comm.NewHostBuffer(comm.Float32, count)
	}
	iter := func() {
		g.seq++
		var wg sync.WaitGroup
		for r, e := range g.engines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				fp := comm.Fingerprint{Group: comm.GroupHash(g.name), Seq: g.seq, Op: comm.OpAllReduce, DType: comm.Float32, Count: int64(count), Root: -1, RedOp: comm.RedSum}
				p := comm.NewPromise(comm.OpAllReduce)
				e.Launch(&comm.Op{FP: fp, Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{bufs[r]}}, p)
				if err := p.Work().Wait(context.Background()); err != nil {
					b.Error(err)
				}
			}()
		}
		wg.Wait()
	}
	for range 3 {
		iter()
	}
	times := make([]time.Duration, 0, b.N)
	b.SetBytes(int64(nbytes))
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		iter()
		times = append(times, time.Since(t0))
	}
	b.StopTimer()
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	med := times[len(times)/2]
	b.ReportMetric(float64(med.Nanoseconds())/1e3, "median_us")
	b.ReportMetric(float64(nbytes)/med.Seconds()/1e9, "algbw_GBps")
}

// BenchmarkAllReduce: 2 ranks, float32 sum: 4 B (latency) and 64 MiB
// (bandwidth) over shm and tcp. Goals: 64 MiB algbw >= 2.1 GB/s; 4 B median
// <= 10 µs (shm) and <= 60 µs (tcp).
func BenchmarkAllReduce(b *testing.B) {
	for _, tr := range []string{TransportSHM, TransportTCP} {
		for _, size := range []int{4, 64 << 20} {
			b.Run(fmt.Sprintf("%s/%dB", tr, size), func(b *testing.B) { benchAllReduce(b, tr, size) })
		}
	}
}

// BenchmarkAllReduceFlat compares the one-step shared-memory allreduce
// (allreduce_flat.go) with the message-based algorithms (FlatThreshold
// -1: recursive doubling below RingThreshold) over shm, 2-4 ranks as
// goroutines of this process, 4 B to 256 KiB: the crossover sets the
// default FlatThreshold (docs/algorithms.md).
func BenchmarkAllReduceFlat(b *testing.B) {
	for _, n := range []int{2, 3, 4} {
		for size := 4; size <= 256<<10; size *= 4 {
			for _, alg := range []string{"flat", "msg"} {
				opts := Options{Transport: TransportSHM, FlatThreshold: 1 << 20, RingThreshold: 1 << 20}
				if alg == "msg" {
					opts.FlatThreshold = -1
				}
				b.Run(fmt.Sprintf("n=%d/%dB/%s", n, size, alg), func(b *testing.B) { benchAllReduceN(b, n, opts, size) })
			}
		}
	}
}

// BenchmarkAllReduceMixed: 4 ranks on two simulated hosts (HostIDs A, A, B,
// B: shm within a host, tcp across, as a multi-node job), 4 B float32 sum,
// with GOMAXPROCS=1 as rankrunner gives two ranks on two cores. Reports the
// median latency in µs.
func BenchmarkAllReduceMixed(b *testing.B) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	st := store.NewMemStore(store.WithMemTimeout(30 * time.Second))
	const n = 4
	g := &group{t: b, name: "g", engines: make([]*Engine, n)}
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			host := []string{"A", "A", "B", "B"}[r]
			cfg := comm.BackendConfig{Group: g.name, Rank: r, Size: n, Store: st, Device: -1, Timeout: 30 * time.Second, Log: zerolog.Nop()}
			var err error
			if g.engines[r], err = New(context.Background(), cfg, Options{HostID: host}); err != nil {
				b.Error(err)
			}
		}()
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	b.Cleanup(func() {
		for _, e := range g.engines {
			_ = e.Close()
		}
	})
	bufs := make([]comm.Buffer, n)
	for r := range n {
		bufs[r] = comm.NewHostBuffer(comm.Float32, 1)
	}
	times := make([]time.Duration, 0, b.N)
	for b.Loop() {
		t0 := time.Now()
		g.mustRun("allreduce", func(r int, fp fpFunc) *comm.Op {
			return &comm.Op{FP: fp(comm.OpAllReduce, comm.Float32, 1, -1, comm.Sum), Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{bufs[r]}}
		})
		times = append(times, time.Since(t0))
	}
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	b.ReportMetric(float64(times[len(times)/2].Nanoseconds())/1e3, "median_us")
}
