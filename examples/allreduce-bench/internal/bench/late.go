package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ranktree/ranktree/comm"
)

// Late configures the late-arrival mode (--late-rank, --late-us): in every
// timed iteration rank Rank sleeps Delay before it launches the
// collective, as a rank whose step ran long does in training, and the
// others, launching at once, wait for it. It measures what waiting costs
// the ranks that wait: the CPU they burn while they wait (which the
// training step's compute on their cores loses) and how late they wake
// after the late rank arrived (issue 15: goals at most 10% of a core and
// 20 µs for a 5 ms delay).
type Late struct {
	Rank  int           // the late rank
	Delay time.Duration // how late it launches; > 0
	// Skew is how the delay varies from iteration to iteration
	// (--late-skew): LateFixed (the zero value) every time, LateAlternate
	// Delay and 0 in turn, LateRandom uniform in [0, Delay] (a fixed seed).
	Skew LateSkew
	// Busy makes the late rank spend its delay busy, in a loop reading
	// the clock as a rank computing its step would keep its CPU
	// (--late-busy), instead of sleeping (time.Sleep). A sleeping late
	// rank idles its CPU (on a VM the vCPU halts) and launches from cold
	// caches and a waking CPU, which puts its own slower op into WakeUs
	// (LateOpUs: 23-38 µs asleep against 9-23 busy on the development VM,
	// 2026-11-27, 4 B to 32 KiB).
	Busy bool
	// CPUTime returns the CPU time this process has used (all threads);
	// nil: CLOCK_PROCESS_CPUTIME_ID. Tests pass a fake.
	CPUTime func() time.Duration
}

// LateSkew is how a late rank's delay varies between iterations (see
// Late.Skew).
type LateSkew uint8

const (
	LateFixed     LateSkew = iota // Delay every iteration, as a rank late by the same time every step
	LateAlternate                 // Delay, 0, Delay, 0, ...
	LateRandom                    // uniform in [0, Delay]
)

// ParseLateSkew parses fixed, alternate or random.
func ParseLateSkew(s string) (LateSkew, error) {
	for k, name := range lateSkewNames {
		if s == name {
			return LateSkew(k), nil
		}
	}
	return 0, fmt.Errorf("late skew %q: want fixed, alternate or random", s)
}

var lateSkewNames = [...]string{"fixed", "alternate", "random"}

// String is the skew's name as ParseLateSkew reads it.
func (k LateSkew) String() string {
	if int(k) < len(lateSkewNames) {
		return lateSkewNames[k]
	}
	return fmt.Sprintf("LateSkew(%d)", k)
}

// delays returns the delay of each of n iterations under skew k.
func (l Late) delays(n int) []time.Duration {
	d := make([]time.Duration, n)
	rng := rand.New(rand.NewPCG(15, uint64(l.Delay)))
	for i := range d {
		switch l.Skew {
		case LateAlternate:
			if i%2 == 0 {
				d[i] = l.Delay
			}
		case LateRandom:
			d[i] = time.Duration(rng.Int64N(int64(l.Delay) + 1))
		default:
			d[i] = l.Delay
		}
	}
	return d
}

// pass spends the late rank's delay d: asleep, or busy (Late.Busy).
func (l Late) pass(d time.Duration) {
	if !l.Busy {
		time.Sleep(d)
		return
	}
	for t0 := time.Now(); time.Since(t0) < d; {
	}
}

// LateResult is one size's late-arrival measurement; its JSON keys are
// those of the fields. Per iteration, the worst waiting rank counts: the
// one that burnt the most CPU per second waited, and the one that woke
// last.
type LateResult struct {
	Collective string  `json:"collective"` // as Result.Collective
	ReqBytes   int64   `json:"req_bytes"`  // the size asked for (as Result.ReqBytes)
	Bytes      int64   `json:"bytes"`      // message size (as Result.Bytes)
	Count      int     `json:"count"`      // elements
	LateRank   int     `json:"late_rank"`  // the rank that launches late
	LateUs     float64 `json:"late_us"`    // its delay, µs
	// WaitCPUPct is the median over iterations of the waiting ranks'
	// process CPU time from launch to Wait's return divided by that wall
	// time, in % of one core; WaitCPUPctMax the largest.
	WaitCPUPct    float64 `json:"wait_cpu_pct"`
	WaitCPUPctMax float64 `json:"wait_cpu_pct_max"`
	// WaitCPUPctAll is the waiting ranks' CPU time over all iterations
	// divided by their wall time from launch to Wait's return, in % of
	// one core (the worst waiting rank): with a delay that varies
	// (Late.Skew), what waiting cost in all.
	WaitCPUPctAll float64 `json:"wait_cpu_pct_all"`
	// WakeUs is the median over iterations of the time from the late
	// rank's launch to the last waiting rank's Wait returning, µs (the
	// op's own latency is in it: compare with the op's time_us without a
	// late rank); WakeUsMin and WakeUsMax the extremes.
	WakeUs    float64 `json:"wake_us"`
	WakeUsMin float64 `json:"wake_us_min"`
	WakeUsMax float64 `json:"wake_us_max"`
	// LagUs is the median over iterations of the time from the late
	// rank's own Wait returning to the last waiting rank's, µs: the wake-up
	// delay without the launch path the two share (can be negative).
	LagUs float64 `json:"lag_us"`
	// LagUsMin is the smallest of those lags.
	LagUsMin float64 `json:"lag_us_min"`
	// LateOpUs is the median over iterations of the late rank's own op,
	// from its launch to its Wait returning, µs: WakeUs is about LateOpUs
	// plus LagUs, the late rank's own path (after its delay) plus the
	// waiting rank's wake-up.
	LateOpUs float64 `json:"late_op_us"`
	// Skew is Late.Skew's name.
	Skew string `json:"skew"`
	// Blocking: the ops ran in their blocking form (Config.Blocking).
	Blocking bool `json:"blocking"`
	// Busy: the late rank spent its delay busy, not asleep (Late.Busy).
	Busy bool `json:"late_busy"`
}

// processCPU is the CPU time of this process, all threads.
func processCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// RunLate measures cfg.Collective on g for every size in cfg.Sizes with
// one late rank (see Late) and calls emit with each LateResult. Every rank
// must call it with the same cfg and late. Before the first size it warms
// up as Run does (cfg.WarmupBytes, cfg.WarmupTime); per size, cfg.Warmup
// untimed iterations (not late) precede cfg.Iters late ones, each after a
// Barrier.
// Timestamps are compared across ranks, so the ranks must share a clock
// (one host). Errors as Run's, and a late rank outside the group.
func RunLate(ctx context.Context, g Group, cfg Config, late Late, emit func(LateResult) error) error {
	if err := cfg.validate(g.Size()); err != nil {
		return err
	}
	n := g.Size()
	if late.Rank < 0 || late.Rank >= n || n < 2 {
		return fmt.Errorf("bench: late rank %d is not a rank of a group of %d (at least 2)", late.Rank, n)
	}
	if late.Delay <= 0 {
		return fmt.Errorf("bench: late delay %v must be positive", late.Delay)
	}
	if late.Skew > LateRandom {
		return fmt.Errorf("bench: unknown late skew %v", late.Skew)
	}
	if late.CPUTime == nil {
		late.CPUTime = processCPU
	}
	if err := warmUp(ctx, g, &cfg); err != nil {
		return err
	}
	for _, size := range cfg.Sizes {
		r, err := measureLate(ctx, g, &cfg, late, size)
		if err != nil {
			return fmt.Errorf("bench: late %v of %s on rank %d: %w", cfg.Collective, FormatSize(size), g.Rank(), err)
		}
		if err := emit(r); err != nil {
			return err
		}
	}
	return nil
}

func measureLate(ctx context.Context, g Group, cfg *Config, late Late, size int64) (LateResult, error) {
	n, me := g.Size(), g.Rank()
	geo, launch := launcher(ctx, g, cfg, size)
	for i := 0; i < cfg.Warmup; i++ {
		if err := launch().Wait(ctx); err != nil {
			return LateResult{}, fmt.Errorf("warm-up iteration %d: %w", i, err)
		}
	}
	// Per iteration, each rank fills its row of [launch ns, end ns, cpu
	// ns] (wall clock, for comparison across processes) and a Sum
	// allreduce gathers the rows.
	rows := make([]int64, 3*n)
	delays := late.delays(cfg.Iters)
	cpuSum, wallSum := make([]int64, n), make([]int64, n)
	cpuPct := make([]float64, 0, cfg.Iters)
	wake := make([]float64, 0, cfg.Iters)
	lag := make([]float64, 0, cfg.Iters)
	lateOp := make([]float64, 0, cfg.Iters)
	for i := 0; i < cfg.Iters; i++ {
		if err := g.Barrier(ctx, cfg.opts...).Wait(ctx); err != nil {
			return LateResult{}, fmt.Errorf("barrier before iteration %d: %w", i, err)
		}
		if me == late.Rank {
			late.pass(delays[i])
		}
		c0 := late.CPUTime()
		t0 := cfg.Now()
		if err := launch().Wait(ctx); err != nil {
			return LateResult{}, fmt.Errorf("iteration %d: %w", i, err)
		}
		t1 := cfg.Now()
		c1 := late.CPUTime()
		clear(rows)
		rows[3*me], rows[3*me+1], rows[3*me+2] = t0.UnixNano(), t1.UnixNano(), int64(c1-c0)
		if err := g.AllReduce(ctx, comm.HostBuffer(rows), comm.Sum, cfg.opts...).Wait(ctx); err != nil {
			return LateResult{}, fmt.Errorf("combining iteration %d across ranks: %w", i, err)
		}
		arrived, lateEnd := rows[3*late.Rank], rows[3*late.Rank+1]
		worstCPU, lastWake := 0.0, 0.0
		for r := range n {
			if r == late.Rank {
				continue
			}
			start, end, cpu := rows[3*r], rows[3*r+1], rows[3*r+2]
			if wall := end - start; wall > 0 {
				worstCPU = max(worstCPU, 100*float64(cpu)/float64(wall))
				cpuSum[r] += cpu
				wallSum[r] += wall
			}
			lastWake = max(lastWake, float64(end-arrived)/1e3)
		}
		cpuPct = append(cpuPct, worstCPU)
		wake = append(wake, lastWake)
		own := float64(lateEnd-arrived) / 1e3 // the late rank's own op
		lag = append(lag, lastWake-own)
		lateOp = append(lateOp, own)
	}
	r := LateResult{Collective: cfg.Collective.String(), ReqBytes: size,
		Bytes: int64(geo.Count) * int64(cfg.DType.Size()), Count: geo.Count, LateRank: late.Rank,
		LateUs: float64(late.Delay.Nanoseconds()) / 1e3, Skew: late.Skew.String(), Blocking: cfg.Blocking, Busy: late.Busy}
	if len(wake) > 0 {
		r.WaitCPUPct, r.WaitCPUPctMax = Median(cpuPct), slices.Max(cpuPct)
		r.WakeUs, r.WakeUsMin, r.WakeUsMax = Median(wake), slices.Min(wake), slices.Max(wake)
		r.LagUs, r.LagUsMin = Median(lag), slices.Min(lag)
		r.LateOpUs = Median(lateOp)
	}
	for q := range n {
		if wallSum[q] > 0 {
			r.WaitCPUPctAll = max(r.WaitCPUPctAll, 100*float64(cpuSum[q])/float64(wallSum[q]))
		}
	}
	return r, nil
}

// FormatLateHeader is the comment lines above the late-arrival table.
func FormatLateHeader() string {
	return fmt.Sprintf("# %12s %12s %6s %10s %10s %10s %10s %10s %10s %10s %10s %10s %10s\n# %12s %12s %6s %10s %10s %10s %10s %10s %10s %10s %10s %10s %10s\n",
		"size", "count", "late", "delay", "wait_cpu", "cpu_max", "cpu_all", "wake", "wake_min", "wake_max", "lag", "lag_min", "late_op",
		"(B)", "(elements)", "(rank)", "(us)", "(%core)", "(%core)", "(%core)", "(us)", "(us)", "(us)", "(us)", "(us)", "(us)")
}

// FormatLateRow is one line of the late-arrival table.
func FormatLateRow(r LateResult) string {
	return fmt.Sprintf("  %12d %12d %6d %10.0f %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f\n",
		r.Bytes, r.Count, r.LateRank, r.LateUs, r.WaitCPUPct, r.WaitCPUPctMax, r.WaitCPUPctAll, r.WakeUs, r.WakeUsMin, r.WakeUsMax, r.LagUs, r.LagUsMin, r.LateOpUs)
}
