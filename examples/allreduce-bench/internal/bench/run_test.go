package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// fakeGroup records the calls Run makes and completes each Work at once
// (with failAt's error at that call). Its AllReduce of the float64 time
// vector plays the other ranks: it takes the elementwise max with peerTimes.
type fakeGroup struct {
	rank, size int
	calls      []string
	bufs       []string // "in/out" buffer descriptions per call
	peerTimes  []float64
	failAt     int // 1-based call index to fail; 0: never
	failErr    error
	onFlag     func([]float32) // plays the peers in the warm-up agreement
	onInt64    func([]int64)   // plays the peers in RunLate's row exchange
	blocking   []bool          // per call: it had comm.Blocking
}

func (f *fakeGroup) record(name string, bufs string, opts []comm.OpOption) *comm.Work {
	f.calls = append(f.calls, name)
	f.bufs = append(f.bufs, bufs)
	f.blocking = append(f.blocking, comm.ApplyOpOptions(opts).Blocking)
	p := comm.NewPromise(comm.OpAllReduce)
	if f.failAt == len(f.calls) {
		p.Complete(f.failErr)
	} else {
		p.Complete(nil)
	}
	return p.Work()
}

func (f *fakeGroup) Rank() int { return f.rank }
func (f *fakeGroup) Size() int { return f.size }
func (f *fakeGroup) AllReduce(_ context.Context, buf comm.Buffer, red comm.ReduceOp, opts ...comm.OpOption) *comm.Work {
	if buf.DType() == comm.Float32 && red == comm.Max && buf.Len() == 1 && f.onFlag != nil {
		fl, _ := comm.AsSlice[float32](buf)
		f.onFlag(fl)
		return f.record("flag", buf.String(), opts)
	}
	if buf.DType() == comm.Float64 && red == comm.Max && f.peerTimes != nil {
		ts, _ := comm.AsSlice[float64](buf)
		for i := range ts {
			ts[i] = max(ts[i], f.peerTimes[i])
		}
		return f.record("times", buf.String(), opts)
	}
	if buf.DType() == comm.Int64 && f.onInt64 != nil {
		xs, _ := comm.AsSlice[int64](buf)
		f.onInt64(xs)
	}
	return f.record("allreduce:"+red.String(), buf.String(), opts)
}
func (f *fakeGroup) AllGatherInto(_ context.Context, out, in comm.Buffer, opts ...comm.OpOption) *comm.Work {
	return f.record("allgather", in.String()+"/"+out.String(), opts)
}
func (f *fakeGroup) Broadcast(_ context.Context, buf comm.Buffer, root int, opts ...comm.OpOption) *comm.Work {
	return f.record(fmt.Sprintf("broadcast:%d", root), buf.String(), opts)
}
func (f *fakeGroup) ReduceScatterTensor(_ context.Context, out, in comm.Buffer, red comm.ReduceOp, opts ...comm.OpOption) *comm.Work {
	return f.record("reducescatter:"+red.String(), in.String()+"/"+out.String(), opts)
}
func (f *fakeGroup) AllToAllSingle(_ context.Context, out, in comm.Buffer, os, is []int, opts ...comm.OpOption) *comm.Work {
	if os != nil || is != nil {
		panic("bench must use equal splits")
	}
	return f.record("alltoall", in.String()+"/"+out.String(), opts)
}
func (f *fakeGroup) Barrier(_ context.Context, opts ...comm.OpOption) *comm.Work {
	return f.record("barrier", "", opts)
}

// fakeClock returns times that advance by the next step on every second
// call, so iteration i (two calls: before and after) takes steps[i].
func fakeClock(steps []time.Duration) func() time.Time {
	t := time.Unix(1000, 0)
	calls := 0
	return func() time.Time {
		if calls%2 == 1 {
			t = t.Add(steps[calls/2])
		}
		calls++
		return t
	}
}

func TestRunAllReduceTimesAndCalls(t *testing.T) {
	g := &fakeGroup{rank: 0, size: 4, peerTimes: []float64{2, 9, 2, 2, 50}}
	cfg := Config{
		Collective: AllReduce, Op: comm.Avg, DType: comm.Float32, Sizes: []int64{4096},
		Iters: 5, Warmup: 2, WarmupBytes: -1, WarmupTime: -1, Placement: func() int { return 1 },
		// local iteration times 5, 1, 3, 4, 2 µs; the peer's 2, 9, 2, 2, 50 →
		// slowest per iteration 5, 9, 3, 4, 50 → median 5 µs.
		Now: fakeClock([]time.Duration{5 * time.Microsecond, time.Microsecond, 3 * time.Microsecond, 4 * time.Microsecond, 2 * time.Microsecond}),
	}
	var got []Result
	if err := Run(context.Background(), g, cfg, func(r Result) error { got = append(got, r); return nil }); err != nil {
		t.Fatal(err)
	}
	wantCalls := []string{"allreduce:avg", "allreduce:avg", "barrier", "allreduce:avg", "allreduce:avg", "allreduce:avg", "allreduce:avg", "allreduce:avg", "times", "allreduce:sum"}
	if fmt.Sprint(g.calls) != fmt.Sprint(wantCalls) {
		t.Fatalf("calls = %v, want %v", g.calls, wantCalls)
	}
	if g.bufs[0] != "float32×1024" || g.bufs[8] != "float64×5" {
		t.Errorf("buffers = %v", g.bufs)
	}
	if len(got) != 1 {
		t.Fatalf("results = %v", got)
	}
	r := got[0]
	if r.Bytes != 4096 || r.Count != 1024 || r.Type != "float32" || r.RedOp != "avg" || r.TimeUs != 5 {
		t.Errorf("result = %+v", r)
	}
	// 5, 9, 3, 4, 50: mean 14.2, median 5, p90 (nearest rank 5 of 5) 50.
	if math.Abs(r.MeanUs-14.2) > 1e-9 || r.P50Us != 5 || r.P90Us != 50 {
		t.Errorf("mean/p50/p90 = %v/%v/%v, want 14.2/5/50", r.MeanUs, r.P50Us, r.P90Us)
	}
	// Only this rank's row of the placement is filled (the fake group does
	// not add the peers'): CPU 1 for rank 0, unknown for the others.
	if fmt.Sprint(r.Placement.CPUs) != "[1 -1 -1 -1]" || r.Placement.SharedFrac != 0 {
		t.Errorf("placement = %+v", r.Placement)
	}
	if g.bufs[9] != "int32×4" || r.Placement.Samples != 1 {
		t.Errorf("placement buffer = %q (%d samples), want int32×4 (4 ranks × 1 sample: iteration 0 of 5, stride 64)", g.bufs[9], r.Placement.Samples)
	}
	if math.Abs(r.AlgBwGBps-4096/5e-6/1e9) > 1e-9 || math.Abs(r.BusBwGBps-r.AlgBwGBps*1.5) > 1e-9 {
		t.Errorf("bandwidths = %v / %v", r.AlgBwGBps, r.BusBwGBps)
	}
}

// TestRunCollectiveBuffers checks the buffers each collective is given and
// the redop reported.
func TestRunCollectiveBuffers(t *testing.T) {
	cases := []struct {
		c         Collective
		call, buf string
		redop     string
		count     int
	}{
		{AllGather, "allgather", "bfloat16×1536/bfloat16×3072", "none", 3072},
		{Broadcast, "broadcast:2", "bfloat16×3072", "none", 3072},
		{ReduceScatter, "reducescatter:max", "bfloat16×3072/bfloat16×1536", "max", 3072},
		{AllToAll, "alltoall", "bfloat16×3072/bfloat16×3072", "none", 3072},
	}
	for _, c := range cases {
		g := &fakeGroup{size: 2}
		cfg := Config{Collective: c.c, Op: comm.Max, DType: comm.BFloat16, Sizes: []int64{6 << 10}, Iters: 1, WarmupBytes: -1, WarmupTime: -1, Now: fakeClock([]time.Duration{time.Microsecond})}
		if c.c == Broadcast {
			g.size, cfg.Root = 3, 2
		}
		var r Result
		if err := Run(context.Background(), g, cfg, func(x Result) error { r = x; return nil }); err != nil {
			t.Fatalf("%v: %v", c.c, err)
		}
		if g.calls[1] != c.call || g.bufs[1] != c.buf {
			t.Errorf("%v: call %q on %q, want %q on %q", c.c, g.calls[1], g.bufs[1], c.call, c.buf)
		}
		if r.RedOp != c.redop || r.Count != c.count || r.Bytes != int64(2*c.count) || r.ReqBytes != 6<<10 || r.Collective != c.c.String() {
			t.Errorf("%v: result %+v", c.c, r)
		}
	}
	// The layout rounds 4 B of allgather on 3 ranks up to one float32 per
	// rank; the result keeps the size asked for apart from the one used.
	g := &fakeGroup{size: 3}
	cfg := Config{Collective: AllGather, Sizes: []int64{4, 8}, Iters: 1, WarmupBytes: -1, WarmupTime: -1, Now: fakeClock([]time.Duration{1, 1})}
	var rs []Result
	if err := Run(context.Background(), g, cfg, func(x Result) error { rs = append(rs, x); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].Bytes != 12 || rs[0].ReqBytes != 4 || rs[1].Bytes != 12 || rs[1].ReqBytes != 8 {
		t.Errorf("allgather of 4 and 8 B on 3 ranks: %+v", rs)
	}
}

// TestRunPlacementStride: the CPU is sampled after iterations 0, every,
// 2×every, ... only (a sample between two ops delays the next launch),
// and the placement buffer holds one row of samples per rank.
func TestRunPlacementStride(t *testing.T) {
	for _, c := range []struct {
		every, iters int
		want         []int // iterations after which the CPU is sampled
	}{
		{0, 130, []int{0, 64, 128}}, // default stride 64
		{64, 64, []int{0}},
		{1, 3, []int{0, 1, 2}},
		{5, 11, []int{0, 5, 10}},
	} {
		g := &fakeGroup{size: 2}
		clockCalls := 0
		var sampled []int
		cfg := Config{Collective: AllReduce, Sizes: []int64{4}, Iters: c.iters, PlacementEvery: c.every, WarmupBytes: -1, WarmupTime: -1,
			Now:       func() time.Time { clockCalls++; return time.Unix(0, int64(clockCalls)*1000) },
			Placement: func() int { sampled = append(sampled, clockCalls/2-1); return 3 }}
		var r Result
		if err := Run(context.Background(), g, cfg, func(x Result) error { r = x; return nil }); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(sampled) != fmt.Sprint(c.want) {
			t.Errorf("every %d, %d iterations: sampled after %v, want %v", c.every, c.iters, sampled, c.want)
		}
		if last := g.bufs[len(g.bufs)-1]; last != fmt.Sprintf("int32×%d", 2*len(c.want)) {
			t.Errorf("every %d: placement buffer %q, want 2 ranks × %d samples", c.every, last, len(c.want))
		}
		if r.Placement.Samples != len(c.want) || r.Placement.CPUs[0] != 3 {
			t.Errorf("every %d: placement %+v", c.every, r.Placement)
		}
	}
}

func TestRunErrors(t *testing.T) {
	ctx := context.Background()
	emit := func(Result) error { return nil }
	bad := []Config{
		{},                                     // no collective
		{Collective: AllReduce, Op: comm.BAnd}, // bitwise op on float32
		{Collective: ReduceScatter, Op: comm.Avg, DType: comm.Int32},
		{Collective: AllReduce, Iters: -1},
		{Collective: AllReduce, Warmup: -1},
		{Collective: Broadcast, Root: 4},
		{Collective: AllReduce, Sizes: []int64{0}},
		{Collective: AllReduce, DType: comm.DType(99)},
		{Collective: AllReduce, PlacementEvery: -1},
	}
	for i, cfg := range bad {
		g := &fakeGroup{size: 4}
		if err := Run(ctx, g, cfg, emit); err == nil {
			t.Errorf("config %d (%+v): want an error", i, cfg)
		} else if len(g.calls) != 0 {
			t.Errorf("config %d: issued %v before rejecting", i, g.calls)
		}
	}
	// A bitwise op is fine for allgather, which does not reduce.
	if err := Run(ctx, &fakeGroup{size: 2}, Config{Collective: AllGather, Op: comm.BAnd, Sizes: []int64{64}, Iters: 1, WarmupTime: -1}, emit); err != nil {
		t.Errorf("allgather ignores --op: %v", err)
	}
	// A failed Work stops the run with an error naming the size that
	// unwraps to the engine's sentinel; emit is not called for it.
	g := &fakeGroup{size: 2, failAt: 4, failErr: &comm.EngineError{Engine: "cpu", Msg: "boom"}}
	emitted := 0
	err := Run(ctx, g, Config{Collective: AllReduce, Sizes: []int64{1 << 20}, Iters: 3, Warmup: 1, WarmupBytes: -1, WarmupTime: -1}, func(Result) error { emitted++; return nil })
	if !errors.Is(err, comm.ErrEngine) || emitted != 0 {
		t.Fatalf("err = %v (emitted %d), want ErrEngine and nothing emitted", err, emitted)
	}
	if want := "allreduce of 1MiB (float32) on rank 0: iteration 1"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	// emit's error stops the run.
	stop := errors.New("stop")
	g = &fakeGroup{size: 2}
	if err := Run(ctx, g, Config{Collective: AllReduce, Sizes: []int64{4, 8}, Iters: 1, WarmupTime: -1}, func(Result) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("emit error: got %v", err)
	}
}

// TestRunWarmupLap checks the one ring-lap allreduce before the sweep: its
// size, that it comes first and once, and that one rank skips it.
func TestRunWarmupLap(t *testing.T) {
	g := &fakeGroup{size: 2}
	cfg := Config{Collective: Broadcast, Sizes: []int64{64, 128}, Iters: 1, WarmupTime: -1}
	if err := Run(context.Background(), g, cfg, func(Result) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if g.calls[0] != "allreduce:sum" || g.bufs[0] != "float32×2097152" {
		t.Errorf("first call %q on %q, want the default 8 MiB float32 sum allreduce", g.calls[0], g.bufs[0])
	}
	n := 0
	for _, b := range g.bufs {
		if b == "float32×2097152" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d lap allreduces, want 1: %v", n, g.calls)
	}
	g = &fakeGroup{size: 1}
	if err := Run(context.Background(), g, Config{Collective: AllReduce, Sizes: []int64{4}, Iters: 1, WarmupBytes: 1 << 10, WarmupTime: -1}, func(Result) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if g.bufs[0] == "float32×256" {
		t.Errorf("a one-rank group ran the lap warm-up: %v", g.calls)
	}
	// A failing lap names itself.
	g = &fakeGroup{size: 2, failAt: 1, failErr: &comm.EngineError{Engine: "cpu", Msg: "boom"}}
	err := Run(context.Background(), g, Config{Collective: AllReduce, Sizes: []int64{4}, Iters: 1, WarmupTime: -1}, func(Result) error { return nil })
	if !errors.Is(err, comm.ErrEngine) || !strings.Contains(err.Error(), "warm-up allreduce of 8MiB") {
		t.Errorf("err = %v", err)
	}
}

// TestRunWarmupTime: batches of 100 4-byte allreduces, each followed by the
// ranks' agreement, until the clock passes WarmupTime; a peer still warming
// (its flag, Max-reduced in) keeps this rank going.
func TestRunWarmupTime(t *testing.T) {
	now := time.Unix(0, 0)
	clock := func() time.Time { return now }
	g := &fakeGroup{size: 2}
	batches := 0
	g.onFlag = func(flag []float32) {
		batches++
		if batches == 2 {
			now = now.Add(time.Second) // this rank is done after batch 2...
		}
		if batches == 3 {
			flag[0] = 1 // ...but the peer still warms in batch 3
		}
	}
	cfg := Config{Collective: AllReduce, Sizes: []int64{4}, Iters: 1, WarmupBytes: -1, WarmupTime: 500 * time.Millisecond, Now: clock}
	if err := Run(context.Background(), g, cfg, func(Result) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if batches != 4 {
		t.Errorf("%d warm-up batches, want 4 (done on this rank after 2, on the peer after 4)", batches)
	}
	if n := len(g.calls); n != 4*101+4 {
		t.Errorf("%d calls, want 4 batches of 100 + a flag, then a barrier, one iteration and the two combines", n)
	}
}

// TestRunBlocking: with Config.Blocking every collective of the run (the
// warm-up, the measured ops, the barrier and the allreduces that combine
// the results) is issued in its blocking form, and the result says so;
// without it none is.
func TestRunBlocking(t *testing.T) {
	for _, blocking := range []bool{true, false} {
		for _, c := range []Collective{AllReduce, AllGather, Broadcast, ReduceScatter, AllToAll} {
			g := &fakeGroup{rank: 0, size: 2, onFlag: func(f []float32) { f[0] = 0 }}
			cfg := Config{Collective: c, Sizes: []int64{64}, Iters: 3, Warmup: 1, WarmupBytes: 1 << 10,
				WarmupTime: time.Millisecond, Blocking: blocking}
			var got []Result
			if err := Run(context.Background(), g, cfg, func(r Result) error { got = append(got, r); return nil }); err != nil {
				t.Fatal(err)
			}
			for i, b := range g.blocking {
				if b != blocking {
					t.Fatalf("%v, blocking %v: call %d (%s) blocking %v", c, blocking, i, g.calls[i], b)
				}
			}
			if len(got) != 1 || got[0].Blocking != blocking {
				t.Fatalf("%v, blocking %v: results %+v", c, blocking, got)
			}
		}
		g := &fakeGroup{rank: 0, size: 2, onInt64: func([]int64) {}}
		var late []LateResult
		cfg := Config{Collective: AllReduce, Sizes: []int64{64}, Iters: 2, WarmupBytes: -1, WarmupTime: -1, Blocking: blocking}
		if err := RunLate(context.Background(), g, cfg, Late{Rank: 1, Delay: time.Microsecond}, func(r LateResult) error { late = append(late, r); return nil }); err != nil {
			t.Fatal(err)
		}
		for i, b := range g.blocking {
			if b != blocking {
				t.Fatalf("late, blocking %v: call %d (%s) blocking %v", blocking, i, g.calls[i], b)
			}
		}
		if len(late) != 1 || late[0].Blocking != blocking {
			t.Fatalf("late, blocking %v: results %+v", blocking, late)
		}
	}
}

// TestMonoNow: the default clock moves forward with the monotonic clock
// and stays within a millisecond of the wall clock.
func TestMonoNow(t *testing.T) {
	a := MonoNow()
	time.Sleep(2 * time.Millisecond)
	b := MonoNow()
	if d := b.Sub(a); d < 2*time.Millisecond || d > time.Second {
		t.Fatalf("MonoNow advanced %v over a 2 ms sleep", d)
	}
	if d := time.Since(b); d < 0 || d > time.Second {
		t.Fatalf("MonoNow is %v from time.Now", d)
	}
	if d := time.Now().UnixNano() - MonoNow().UnixNano(); d < -int64(time.Millisecond) || d > int64(time.Millisecond) {
		t.Fatalf("MonoNow's wall clock is %v ns from time.Now's", d)
	}
}

// TestRunCollectsAfterWarmUp: Run collects the heap once before the first
// size (debug.FreeOSMemory, a forced collection), so that the set-up's
// garbage is not collected inside a timed loop.
func TestRunCollectsAfterWarmUp(t *testing.T) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	cfg := Config{Collective: AllReduce, Sizes: []int64{4}, Iters: 1, WarmupBytes: -1, WarmupTime: -1, Now: fakeClock([]time.Duration{time.Microsecond})}
	if err := Run(context.Background(), &fakeGroup{size: 2}, cfg, func(Result) error { return nil }); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if after.NumForcedGC == before.NumForcedGC {
		t.Error("no forced collection between the warm-up and the first size")
	}
}
