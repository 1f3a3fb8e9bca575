package bench

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// Group is what Run needs of a process group; *comm.ProcessGroup has it.
type Group interface {
	Rank() int
	Size() int
	AllReduce(ctx context.Context, buf comm.Buffer, red comm.ReduceOp, opts ...comm.OpOption) *comm.Work
	AllGatherInto(ctx context.Context, out, in comm.Buffer, opts ...comm.OpOption) *comm.Work
	Broadcast(ctx context.Context, buf comm.Buffer, root int, opts ...comm.OpOption) *comm.Work
	ReduceScatterTensor(ctx context.Context, out, in comm.Buffer, red comm.ReduceOp, opts ...comm.OpOption) *comm.Work
	AllToAllSingle(ctx context.Context, out, in comm.Buffer, outSplits, inSplits []int, opts ...comm.OpOption) *comm.Work
	Barrier(ctx context.Context, opts ...comm.OpOption) *comm.Work
}

var _ Group = (*comm.ProcessGroup)(nil)

// DefaultSizes is nccl-tests' usual sweep scaled to host memory: 4 B to
// 64 MiB, doubling.
var DefaultSizes = func() []int64 {
	var s []int64
	for v := int64(4); v <= 64<<20; v *= 2 {
		s = append(s, v)
	}
	return s
}()

// Config describes one benchmark run. The same Config must be used on every
// rank. Zero fields take the defaults named; validate checks the rest.
type Config struct {
	Collective Collective    // required
	Op         comm.ReduceOp // reduction of allreduce/reducescatter; zero: comm.Sum
	DType      comm.DType    // element type; zero: comm.Float32
	Sizes      []int64       // message sizes in bytes (see the package doc); empty: DefaultSizes
	Iters      int           // timed iterations per size; 0: 20
	Warmup     int           // untimed iterations before them (0: none; negative is an error)
	Root       int           // root rank of broadcast
	// WarmupBytes is the size in bytes of one float32 sum allreduce run
	// once before the first size, so that every page of the shm rings
	// (default 4 MiB per direction; an allreduce of S bytes moves at least
	// S bytes over each link) has been touched before anything is timed
	// and no size pays first-touch page faults. 0: 8 MiB; negative: none.
	WarmupBytes int64
	// WarmupTime is how long every rank keeps issuing 4-byte allreduces
	// (in batches of 100, the ranks agreeing after each batch whether to go
	// on) before the first size, after the WarmupBytes allreduce: the
	// first ~200 ms after ranktree.Init show millisecond stalls (Init's
	// background work settling) that a benchmark of the steady state must
	// not time. 0: 500 ms; negative: none.
	WarmupTime time.Duration
	// Placement, if set, is called on every rank after timed iterations
	// 0, PlacementEvery, 2×PlacementEvery, ... and returns the CPU the
	// caller runs on (-1 if unknown). nil: CurrentCPU.
	Placement func() int
	// PlacementEvery is the stride of the placement samples: a sample
	// sits between one op and the next and delays this rank's next launch
	// (CurrentCPU is a system call, about 0.3 µs), which its peers wait
	// for, so sampling every iteration would inflate small-op times.
	// 0: 64; negative is an error.
	PlacementEvery int
	// Blocking issues every collective of the run (the measured ones, the
	// warm-up, the barriers and the allreduces that combine the results)
	// in its blocking form, comm.Blocking: the call returns once the op
	// has completed, as MPI_Allreduce and torch.distributed's default
	// all_reduce (async_op=False) do, and a small op allocates nothing.
	// false times AllReduce(...).Wait, the async form.
	Blocking bool
	Now      func() time.Time // clock; nil: MonoNow (tests pass a fake)
	opts     []comm.OpOption  // the ops' options (Blocking), set by validate
}

// monoBase is MonoNow's origin, read once.
var monoBase = time.Now()

// MonoNow is the benchmark's default clock: the time now, from the
// monotonic clock alone. time.Now reads the wall clock too, about 50 ns
// a call on the development VM against 25 ns; the timed loop reads the
// clock twice per op, as Open MPI's and Gloo's scripts do with
// time.perf_counter_ns, which is monotonic too. Its UnixNano is the wall
// clock at monoBase plus the monotonic time since, which stays comparable
// across the ranks of one host (the late-arrival figures) unless the wall
// clock is stepped during the run.
func MonoNow() time.Time { return monoBase.Add(time.Since(monoBase)) }

// validate fills defaults and checks c against a group of n ranks.
func (c *Config) validate(n int) error {
	if c.Collective < AllReduce || c.Collective > AllToAll {
		return fmt.Errorf("bench: invalid collective %v", c.Collective)
	}
	if c.Op == (comm.ReduceOp{}) {
		c.Op = comm.Sum
	}
	if c.DType == 0 {
		c.DType = comm.Float32
	}
	if !c.DType.Valid() {
		return fmt.Errorf("bench: invalid dtype %v", c.DType)
	}
	if c.Collective.Reduces() {
		if err := c.Op.Check(c.DType); err != nil {
			return fmt.Errorf("bench: --op %v with --dtype %v: %w", c.Op, c.DType, err)
		}
	}
	if len(c.Sizes) == 0 {
		c.Sizes = DefaultSizes
	}
	for _, s := range c.Sizes {
		if s <= 0 {
			return fmt.Errorf("bench: size %d is not positive", s)
		}
	}
	if c.Iters == 0 {
		c.Iters = 20
	}
	if c.Iters < 0 || c.Warmup < 0 {
		return fmt.Errorf("bench: iters %d and warmup %d must not be negative", c.Iters, c.Warmup)
	}
	if c.Root < 0 || c.Root >= n {
		return fmt.Errorf("bench: root %d is not a rank of a group of %d", c.Root, n)
	}
	if c.Now == nil {
		c.Now = MonoNow
	}
	if c.WarmupBytes == 0 {
		c.WarmupBytes = 8 << 20
	}
	if c.Placement == nil {
		c.Placement = CurrentCPU
	}
	if c.PlacementEvery == 0 {
		c.PlacementEvery = 64
	}
	if c.PlacementEvery < 0 {
		return fmt.Errorf("bench: placement stride %d must not be negative", c.PlacementEvery)
	}
	if c.WarmupTime == 0 {
		c.WarmupTime = 500 * time.Millisecond
	}
	c.opts = nil
	if c.Blocking {
		c.opts = []comm.OpOption{comm.Blocking()}
	}
	return nil
}

// Run measures cfg.Collective on g for every size in cfg.Sizes and calls
// emit with each Result as soon as it is known. Every rank of g must call
// Run with the same cfg: it issues collectives, and the timings are
// combined across ranks, so every rank receives the same Results (print
// them on rank 0). Buffers are allocated per size, zero-filled (so repeated
// in-place reductions stay finite), and freed afterwards.
//
// Per size: cfg.Warmup untimed iterations, a Barrier, then cfg.Iters timed
// iterations back to back, each from launch to Work.Wait's return (with
// cfg.Blocking, the call returns a completed Work: the time is the
// call's). A Max
// allreduce of the per-iteration times gives the slowest rank's time, and
// the reported times are their mean, median and 90th percentile. Each
// rank also samples the CPU it runs on after every cfg.PlacementEvery-th
// timed iteration (outside the timed region); the Result says which CPU
// each rank ran on most and how often two ranks shared one (see
// Placement).
//
// Errors: a bad cfg; the first failed Work (wrapped, naming the collective
// and size; it unwraps to the comm sentinel); ctx's error; emit's error.
func Run(ctx context.Context, g Group, cfg Config, emit func(Result) error) error {
	if err := cfg.validate(g.Size()); err != nil {
		return err
	}
	if err := warmUp(ctx, g, &cfg); err != nil {
		return err
	}
	for _, size := range cfg.Sizes {
		r, err := measure(ctx, g, &cfg, size)
		if err != nil {
			return fmt.Errorf("bench: %v of %s (%v) on rank %d: %w", cfg.Collective, FormatSize(size), cfg.DType, g.Rank(), err)
		}
		if err := emit(r); err != nil {
			return err
		}
	}
	return nil
}

// measure runs one size and returns its Result.
func measure(ctx context.Context, g Group, cfg *Config, size int64) (Result, error) {
	n, dt := g.Size(), cfg.DType
	geo, launch := launcher(ctx, g, cfg, size)
	times := make([]float64, cfg.Iters) // µs
	// cpus[r*samples+j] is 1 + the CPU rank r ran on after iteration
	// j*every (0: unknown); each rank fills its row and a Sum allreduce
	// gathers them.
	every := cfg.PlacementEvery
	samples := (cfg.Iters + every - 1) / every
	cpus := make([]int32, n*samples)
	mine := cpus[g.Rank()*samples : (g.Rank()+1)*samples]
	settle(times)
	for i := 0; i < cfg.Warmup; i++ {
		if err := launch().Wait(ctx); err != nil {
			return Result{}, fmt.Errorf("warm-up iteration %d: %w", i, err)
		}
	}
	if err := g.Barrier(ctx, cfg.opts...).Wait(ctx); err != nil {
		return Result{}, fmt.Errorf("barrier before the timed iterations: %w", err)
	}
	for i := range times {
		t0 := cfg.Now()
		if err := launch().Wait(ctx); err != nil {
			return Result{}, fmt.Errorf("iteration %d: %w", i, err)
		}
		times[i] = float64(cfg.Now().Sub(t0).Nanoseconds()) / 1e3
		if i%every == 0 {
			mine[i/every] = int32(cfg.Placement() + 1)
		}
	}
	if n > 1 && len(times) > 0 {
		if err := g.AllReduce(ctx, comm.HostBuffer(times), comm.Max, cfg.opts...).Wait(ctx); err != nil {
			return Result{}, fmt.Errorf("combining the times across ranks: %w", err)
		}
		if err := g.AllReduce(ctx, comm.HostBuffer(cpus), comm.Sum, cfg.opts...).Wait(ctx); err != nil {
			return Result{}, fmt.Errorf("combining the CPU placement across ranks: %w", err)
		}
	}
	redop := "none"
	if cfg.Collective.Reduces() {
		redop = cfg.Op.String()
	}
	bytes := int64(geo.Count) * int64(dt.Size())
	r := NewResult(cfg.Collective, n, bytes, geo.Count, dt.String(), redop, Median(times))
	r.ReqBytes = size
	r.MeanUs, r.P50Us, r.P90Us, r.P99Us = Summarize(times)
	r.Placement = NewPlacement(cpus, n, samples)
	r.Blocking = cfg.Blocking
	return r, nil
}

// settle readies a size's timed loop once its buffers and records are
// allocated, so that the loop times the collective, not the benchmark's
// own memory: it writes every page of times (a fresh allocation whose
// pages the kernel maps at first touch: several µs a page on the 2-core
// VM, whose hypervisor keeps shadow page tables, taken once every 512
// iterations), and it
// collects the heap (runtime.GC, as testing.B does before each
// benchmark), whose growth by those allocations otherwise set off a
// collection in the loop. With GOMAXPROCS=1 its background mark worker
// holds the rank's only thread for milliseconds while the peers wait
// (stalls of 4-byte allreduces of up to 2 ms in a profile, 2026-12-06).
// The warm-up iterations that follow bring the caches back.
func settle(times []float64) {
	for i := range times {
		times[i] = 0
	}
	runtime.GC()
}

// launcher allocates the buffers of one size and returns their geometry
// and a function that launches the collective on them (in its blocking
// form with cfg.Blocking: it returns once the op has completed).
func launcher(ctx context.Context, g Group, cfg *Config, size int64) (Geometry, func() *comm.Work) {
	geo := cfg.Collective.Layout(size, cfg.DType.Size(), g.Size())
	in := comm.NewHostBuffer(cfg.DType, geo.InCount)
	var out comm.Buffer
	if geo.OutCount > 0 {
		out = comm.NewHostBuffer(cfg.DType, geo.OutCount)
	}
	opts := cfg.opts
	return geo, func() *comm.Work {
		switch cfg.Collective {
		case AllReduce:
			return g.AllReduce(ctx, in, cfg.Op, opts...)
		case AllGather:
			return g.AllGatherInto(ctx, out, in, opts...)
		case Broadcast:
			return g.Broadcast(ctx, in, cfg.Root, opts...)
		case ReduceScatter:
			return g.ReduceScatterTensor(ctx, out, in, cfg.Op, opts...)
		default:
			return g.AllToAllSingle(ctx, out, in, nil, nil, opts...)
		}
	}
}

// warmUp runs the warm-up before the first size: one allreduce of
// cfg.WarmupBytes (a lap of the shm rings), then cfg.WarmupTime of 4-byte
// allreduces (a one-rank group skips both). Last it collects the heap and
// returns its free memory to the OS (debug.FreeOSMemory), as testing.B
// collects before each benchmark: the garbage of the set-up (the lap's
// buffer, Init's) otherwise sets off a collection about half a second
// after start, which can fall into the first sizes' timed loops, where
// the runtime's background scavenger would also return the memory.
// On the 2-core VM, 2026-11-27 23:02–23:07 UTC, 2 ranks over shm,
// 1000 ops a size as bench-compare.sh runs them, 240 alternating rounds
// of scripts/bench-ab.sh against the build without it, near state
// (about 200 runs each), mean µs per op, median over runs: 4 B 0.78
// against 0.85, 8–32 B 0.74–0.76 against 0.79; it won 155 of the 240
// rounds at 4 B and 135–137 at 8–32 B.
func warmUp(ctx context.Context, g Group, cfg *Config) error {
	defer debug.FreeOSMemory()
	if g.Size() < 2 {
		return nil
	}
	if cfg.WarmupBytes > 0 {
		lap := comm.NewHostBuffer(comm.Float32, int(cfg.WarmupBytes/4))
		if err := g.AllReduce(ctx, lap, comm.Sum, cfg.opts...).Wait(ctx); err != nil {
			return fmt.Errorf("bench: warm-up allreduce of %s (one lap of the rings) on rank %d: %w", FormatSize(cfg.WarmupBytes), g.Rank(), err)
		}
	}
	if cfg.WarmupTime > 0 {
		if err := warmFor(ctx, g, cfg); err != nil {
			return fmt.Errorf("bench: warm-up for %v on rank %d: %w", cfg.WarmupTime, g.Rank(), err)
		}
	}
	return nil
}

// warmFor issues batches of 100 4-byte float32 sum allreduces until every
// rank has spent cfg.WarmupTime in it: after each batch a Max allreduce of
// "still warming" flags makes every rank stop after the same batch, so all
// ranks issue the same ops.
func warmFor(ctx context.Context, g Group, cfg *Config) error {
	one := comm.NewHostBuffer(comm.Float32, 1)
	flag := make([]float32, 1)
	start := cfg.Now()
	for {
		for i := 0; i < 100; i++ {
			if err := g.AllReduce(ctx, one, comm.Sum, cfg.opts...).Wait(ctx); err != nil {
				return err
			}
		}
		flag[0] = 0
		if cfg.Now().Sub(start) < cfg.WarmupTime {
			flag[0] = 1
		}
		if err := g.AllReduce(ctx, comm.HostBuffer(flag), comm.Max, cfg.opts...).Wait(ctx); err != nil {
			return err
		}
		if flag[0] == 0 {
			return nil
		}
	}
}
