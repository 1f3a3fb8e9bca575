package bench

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"
)

// TestRunLate: rank 0 waits for rank 1, which launches late. The fake
// clock moves 100 µs per reading and the fake CPU clock 5 µs, so rank 0's
// wait is 100 µs wall for 5 µs CPU (5%); rank 1's row says it launched
// 40 µs before rank 0's Wait returned.
func TestRunLate(t *testing.T) {
	base := time.Unix(1000, 0)
	clock := base
	cpu := time.Duration(0)
	var lastEnd int64
	g := &fakeGroup{rank: 0, size: 2}
	g.onInt64 = func(rows []int64) {
		lastEnd = rows[1]
		rows[3], rows[4], rows[5] = lastEnd-40_000, lastEnd-30_000, 999_000
	}
	cfg := Config{Collective: AllReduce, Sizes: []int64{64}, Iters: 3, WarmupBytes: -1, WarmupTime: -1,
		Now: func() time.Time { clock = clock.Add(100 * time.Microsecond); return clock }}
	late := Late{Rank: 1, Delay: 5 * time.Millisecond, CPUTime: func() time.Duration { cpu += 5 * time.Microsecond; return cpu }}
	var got []LateResult
	if err := RunLate(context.Background(), g, cfg, late, func(r LateResult) error { got = append(got, r); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("%d results", len(got))
	}
	r := got[0]
	if r.Bytes != 64 || r.ReqBytes != 64 || r.Collective != "allreduce" || r.Count != 16 || r.LateRank != 1 || r.LateUs != 5000 {
		t.Fatalf("result %+v", r)
	}
	if math.Abs(r.WaitCPUPct-5) > 1e-9 || math.Abs(r.WaitCPUPctMax-5) > 1e-9 {
		t.Fatalf("wait CPU %v%% (max %v%%), want 5%%", r.WaitCPUPct, r.WaitCPUPctMax)
	}
	if r.WakeUs != 40 || r.WakeUsMin != 40 || r.WakeUsMax != 40 {
		t.Fatalf("wake %v (%v..%v) µs, want 40", r.WakeUs, r.WakeUsMin, r.WakeUsMax)
	}
	if r.LagUs != 30 || r.LagUsMin != 30 || r.LateOpUs != 10 {
		t.Fatalf("lag %v µs (min %v), late op %v µs, want 30 and 10 (rank 1 returned 10 µs after it launched)", r.LagUs, r.LagUsMin, r.LateOpUs)
	}
	if math.Abs(r.WaitCPUPctAll-5) > 1e-9 || r.Skew != "fixed" {
		t.Fatalf("wait CPU over all iterations %v%%, skew %q; want 5%%, fixed", r.WaitCPUPctAll, r.Skew)
	}
	if row := FormatLateRow(r); !strings.Contains(row, "5.00") || !strings.Contains(row, "40.00") {
		t.Fatalf("row %q", row)
	}
	// RunLate warms up as Run does: the ring lap comes first.
	g = &fakeGroup{rank: 0, size: 2, onInt64: g.onInt64}
	cfg.WarmupBytes = 1 << 10
	if err := RunLate(context.Background(), g, cfg, late, func(LateResult) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if g.calls[0] != "allreduce:sum" || g.bufs[0] != "float32×256" {
		t.Errorf("first call %q on %q, want the 1 KiB lap allreduce", g.calls[0], g.bufs[0])
	}
	for _, bad := range []Late{{Rank: 2, Delay: time.Millisecond}, {Rank: 1}, {Rank: 1, Delay: time.Millisecond, Skew: LateRandom + 1}} {
		if err := RunLate(context.Background(), g, cfg, bad, func(LateResult) error { return nil }); err == nil {
			t.Fatalf("RunLate(%+v) accepted", bad)
		}
	}
}

// TestLateSkew: the late rank's delay per iteration under each skew.
func TestLateSkew(t *testing.T) {
	ms := time.Millisecond
	for _, name := range []string{"fixed", "alternate", "random"} {
		k, err := ParseLateSkew(name)
		if err != nil || k.String() != name {
			t.Fatalf("ParseLateSkew(%q) = %v, %v", name, k, err)
		}
	}
	if _, err := ParseLateSkew("sometimes"); err == nil {
		t.Fatal("ParseLateSkew accepted sometimes")
	}
	if d := (Late{Delay: 5 * ms}).delays(3); d[0] != 5*ms || d[1] != 5*ms || d[2] != 5*ms {
		t.Fatalf("fixed: %v", d)
	}
	if d := (Late{Delay: 5 * ms, Skew: LateAlternate}).delays(4); d[0] != 5*ms || d[1] != 0 || d[2] != 5*ms || d[3] != 0 {
		t.Fatalf("alternate: %v", d)
	}
	d := (Late{Delay: 5 * ms, Skew: LateRandom}).delays(200)
	lo, hi := d[0], d[0]
	for _, x := range d {
		lo, hi = min(lo, x), max(hi, x)
	}
	if lo < 0 || hi > 5*ms || hi-lo < 4*ms {
		t.Fatalf("random: delays span %v..%v, want most of 0..5ms", lo, hi)
	}
}

// TestLatePass: the late rank's delay is spent asleep, or busy on its CPU
// (Late.Busy), and lasts at least the delay either way; the result says
// which (LateResult.Busy).
func TestLatePass(t *testing.T) {
	const d = 20 * time.Millisecond
	for _, busy := range []bool{false, true} {
		l := Late{Rank: 1, Delay: d, Busy: busy}
		c0, t0 := processCPU(), time.Now()
		l.pass(d)
		el, cpu := time.Since(t0), processCPU()-c0
		if el < d {
			t.Errorf("busy %v: the delay lasted %v, want at least %v", busy, el, d)
		}
		// A busy delay runs on the CPU; how much of it the scheduler
		// grants depends on the machine's load, so only the sleeping
		// delay's bound is strict: it must not spin.
		if !busy && cpu > d/2 {
			t.Errorf("asleep: used %v of CPU in a %v delay", cpu, el)
		}
		if busy && cpu == 0 {
			t.Errorf("busy: used no CPU in a %v delay", el)
		}
		g := &fakeGroup{rank: 0, size: 2}
		cfg := Config{Collective: AllReduce, Sizes: []int64{64}, Iters: 1, WarmupBytes: -1, WarmupTime: -1}
		var got LateResult
		if err := RunLate(context.Background(), g, cfg, l, func(r LateResult) error { got = r; return nil }); err != nil {
			t.Fatal(err)
		}
		if got.Busy != busy {
			t.Errorf("result busy %v, want %v", got.Busy, busy)
		}
	}
}
