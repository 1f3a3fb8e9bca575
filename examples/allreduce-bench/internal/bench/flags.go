package bench

import (
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// Options are allreduce-bench's parsed command line.
type Options struct {
	Config    Config // what to measure
	Transport string // "auto", "shm" or "tcp": the CPU engine's transport
	JSON      bool   // print JSON lines instead of the table
	// Late is the late-arrival mode (--late-rank, --late-us), or nil.
	Late *Late
	// C2CProbe (--c2c-probe): measure the cache line's round trip
	// between CPUs 0 and 1 (CoreToCore), print it as one JSON object and
	// exit, without joining a job.
	C2CProbe bool
}

// ParseArgs parses the command line (without the program name).
// defaultTransport is the --transport default (main passes
// $RANKTREE_TRANSPORT, or "auto"). Usage and errors go to stderr; -h gives
// flag.ErrHelp. Bad values return an error naming the flag.
func ParseArgs(args []string, defaultTransport string, stderr io.Writer) (Options, error) {
	fs := flag.NewFlagSet("allreduce-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	collective := fs.String("collective", "allreduce", "allreduce | allgather | broadcast | reducescatter | alltoall")
	op := fs.String("op", "sum", "reduction: sum | avg | prod | min | max | band | bor | bxor")
	dtype := fs.String("dtype", "float32", "element type: float32 | float64 | float16 | bfloat16 | int8 | uint8 | int32 | int64 | bool | complex64 | complex128")
	sizes := fs.String("sizes", "4..64MiB", "comma-separated message sizes (4, 4KiB, 64MiB; A..B doubles from A to B)")
	iters := fs.Int("iters", 20, "timed iterations per size")
	warmup := fs.Int("warmup", 5, "untimed warm-up iterations per size")
	root := fs.Int("root", 0, "broadcast root rank")
	warmTime := fs.Duration("warmup-time", 500*time.Millisecond, "before the first size, keep issuing 4-byte allreduces this long, past the stalls of the first moments after Init; 0 skips it")
	lap := fs.String("warmup-bytes", "8MiB", "one float32 sum allreduce of this size before the sweep, so that every shm ring page has been touched (one lap of the default 4 MiB rings); 0 skips it")
	if defaultTransport == "" {
		defaultTransport = "auto"
	}
	transport := fs.String("transport", defaultTransport, "CPU engine transport: auto | shm | tcp")
	asJSON := fs.Bool("json", false, "print one JSON object per size instead of the table")
	lateRank := fs.Int("late-rank", -1, "late-arrival mode: this rank launches every timed iteration --late-us late; reports the waiting ranks' CPU use and wake latency (see RunLate)")
	lateUs := fs.Int("late-us", 5000, "with --late-rank: the delay in µs")
	blocking := fs.Bool("blocking", true, "issue every collective in its blocking form (comm.Blocking: the call returns once the op completed, as MPI_Allreduce and torch's default all_reduce); false: time AllReduce(...).Wait, the async form")
	lateBusy := fs.Bool("late-busy", false, "with --late-rank: the late rank spends its delay busy (as a rank computing its step) instead of asleep, whose idle CPU makes its own launch slower")
	lateSkew := fs.String("late-skew", "fixed", "with --late-rank: fixed (--late-us every iteration) | alternate (--late-us and 0 in turn) | random (uniform 0..--late-us)")
	c2c := fs.Bool("c2c-probe", false, "measure the round trip of a cache line between CPUs 0 and 1 (5 samples of 2000), print it as JSON and exit, outside any job: the host's state, which moves every shared-memory time (scripts/bench-compare.sh records it before each run)")
	placeEvery := fs.Int("placement-every", 64, "sample each rank's CPU after every Nth timed iteration (a getcpu system call between two ops delays the next launch)")
	if err := fs.Parse(args); err != nil {
		return Options{}, err
	}
	if fs.NArg() > 0 {
		return Options{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var o Options
	var err error
	if o.Config.Collective, err = ParseCollective(*collective); err != nil {
		return Options{}, fmt.Errorf("--collective: %w", err)
	}
	if o.Config.Op, err = comm.ParseReduceOp(*op); err != nil {
		return Options{}, fmt.Errorf("--op: %w", err)
	}
	if o.Config.DType, err = comm.ParseDType(*dtype); err != nil {
		return Options{}, fmt.Errorf("--dtype: %w", err)
	}
	if o.Config.Collective.Reduces() {
		if err := o.Config.Op.Check(o.Config.DType); err != nil {
			return Options{}, fmt.Errorf("--op %v with --dtype %v: %w", o.Config.Op, o.Config.DType, err)
		}
	}
	if o.Config.Sizes, err = ParseSizes(*sizes); err != nil {
		return Options{}, fmt.Errorf("--sizes: %w", err)
	}
	if *iters < 1 || *warmup < 0 || *root < 0 {
		return Options{}, fmt.Errorf("--iters must be at least 1, --warmup and --root at least 0 (got %d, %d, %d)", *iters, *warmup, *root)
	}
	o.Config.Iters, o.Config.Warmup, o.Config.Root = *iters, *warmup, *root
	if *placeEvery < 1 {
		return Options{}, fmt.Errorf("--placement-every %d must be at least 1", *placeEvery)
	}
	o.Config.PlacementEvery = *placeEvery
	o.Config.Blocking = *blocking
	if err := setWarmups(&o.Config, *warmTime, *lap); err != nil {
		return Options{}, err
	}
	switch *transport {
	case "auto", "shm", "tcp":
		o.Transport = *transport
	default:
		return Options{}, fmt.Errorf("--transport %q: want auto, shm or tcp", *transport)
	}
	o.JSON = *asJSON
	o.C2CProbe = *c2c
	if *lateRank >= 0 {
		if *lateUs <= 0 {
			return Options{}, fmt.Errorf("--late-us %d must be positive", *lateUs)
		}
		o.Late = &Late{Rank: *lateRank, Delay: time.Duration(*lateUs) * time.Microsecond, Busy: *lateBusy}
		if o.Late.Skew, err = ParseLateSkew(*lateSkew); err != nil {
			return Options{}, fmt.Errorf("--late-skew: %w", err)
		}
	}
	return o, nil
}

// setWarmups sets c's warm-up before the first size from --warmup-time and
// --warmup-bytes (0 in either skips that part).
func setWarmups(c *Config, warmTime time.Duration, lap string) error {
	if warmTime < 0 {
		return fmt.Errorf("--warmup-time %v is negative", warmTime)
	}
	c.WarmupTime = warmTime
	if warmTime == 0 {
		c.WarmupTime = -1
	}
	if lap == "0" {
		c.WarmupBytes = -1
		return nil
	}
	sz, err := ParseSize(lap)
	if err != nil {
		return fmt.Errorf("--warmup-bytes %q: want one size such as 8MiB, or 0: %w", lap, err)
	}
	c.WarmupBytes = sz
	return nil
}
