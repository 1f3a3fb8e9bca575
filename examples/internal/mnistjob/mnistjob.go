// Package mnistjob is what the framework MNIST examples (gomlx-mnist,
// gorgonia-mnist) share besides their model and training loop: the
// command-line flags, the threads-per-rank rule, the data split, the
// per-epoch progress bar and the end-of-run report. Each example stays an
// ordinary single-process training program; this package only keeps the
// scaffolding in one place.
package mnistjob

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash"
	"hash/fnv"
	"io"
	"math"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/ranktree/ranktree/examples/internal/mnistdata"
)

// Options are the flags every example takes.
type Options struct {
	// Name is the program's name (flag set, error prefix).
	Name string
	// Epochs is the number of passes over the training set (--epochs, ≥ 1).
	Epochs int
	// Batch is the global batch (--batch-size, ≥ 1), split evenly over the ranks.
	Batch int
	// LR is the learning rate (--lr, > 0).
	LR float64
	// Seed seeds the shuffle (--seed), and GoMLX's initial weights.
	Seed uint64
	// TrainLimit keeps the first N training samples (--train-limit; 0: all 60,000).
	TrainLimit int
	// Threads is each rank's GOMAXPROCS and framework parallelism
	// (--threads; 0: CPUs / ranks on this node).
	Threads int
	// DataDir is the folder with the MNIST .gz files (--data-dir; "": the module cache).
	DataDir string
	// JSONOut is the --json-out path ("{rank}" in it: every rank writes).
	JSONOut string
}

// NewFlagSet returns a flag set named name with the common flags bound to
// the returned Options; lrUsage and threadsUsage describe --lr (default
// defaultLR) and --threads for this framework. Add the program's own
// flags to the set before Main parses it.
func NewFlagSet(name string, defaultLR float64, lrUsage, threadsUsage string) (*flag.FlagSet, *Options) {
	o := &Options{Name: name}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.IntVar(&o.Epochs, "epochs", 3, "passes over the training set")
	fs.IntVar(&o.Batch, "batch-size", 128, "global batch size (a multiple of the world size)")
	fs.Float64Var(&o.LR, "lr", defaultLR, lrUsage)
	fs.Uint64Var(&o.Seed, "seed", 1, "shuffle seed (GoMLX also seeds its initial weights with it; Gorgonia draws them from Go's global source, and rank 0's are broadcast)")
	fs.IntVar(&o.TrainLimit, "train-limit", 0, "train on the first N samples (0: all)")
	fs.IntVar(&o.Threads, "threads", 0, threadsUsage)
	fs.StringVar(&o.DataDir, "data-dir", "", "folder with the MNIST .gz files (default: module cache)")
	fs.StringVar(&o.JSONOut, "json-out", "", `write metrics as JSON ("{rank}": every rank)`)
	return fs, o
}

// Parse parses args into fs and checks the common options. It returns
// flag.ErrHelp for -h.
func (o *Options) Parse(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case o.Epochs < 1:
		return fmt.Errorf("%s: --epochs %d, want ≥ 1", o.Name, o.Epochs)
	case o.Batch < 1:
		return fmt.Errorf("%s: --batch-size %d, want ≥ 1", o.Name, o.Batch)
	case o.LR <= 0:
		return fmt.Errorf("%s: --lr %v, want > 0", o.Name, o.LR)
	case o.Threads < 0 || o.TrainLimit < 0:
		return fmt.Errorf("%s: --threads and --train-limit must be ≥ 0", o.Name)
	}
	return nil
}

// Main parses args, runs train under a context cancelled by SIGINT or
// SIGTERM, and returns the exit status: 0 on success (and for -h), 1 when
// train fails (the error is printed), 2 for bad flags.
func Main(fs *flag.FlagSet, o *Options, args []string, train func(context.Context) error) int {
	return Run(o.Name, func() error { return o.Parse(fs, args, os.Stderr) }, train)
}

// Run is the exit-status skeleton every MNIST example shares: it calls
// parse (flag.ErrHelp gives 0; any other error is printed and gives 2),
// then train under a context cancelled by SIGINT or SIGTERM (an error is
// printed as "name: err" and gives 1; success gives 0).
func Run(name string, parse func() error, train func(context.Context) error) int {
	err := parse()
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := train(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}

// Job is one rank's share of the run, from Setup.
type Job struct {
	Rank, WorldSize int
	// Threads is the rank's GOMAXPROCS (already set) and framework parallelism.
	Threads int
	// LocalBatch is Batch / WorldSize, this rank's part of each step.
	LocalBatch int
	// Train (cut to TrainLimit) and Test are the MNIST splits.
	Train, Test *mnistdata.Set
}

// Setup sets GOMAXPROCS to Threads, splits the global batch over
// worldSize ranks and loads the data. Threads 0 takes the rank's
// share of the node's CPUs, so that the ranks of one node do not fight
// over cores: the GOMAXPROCS that rankrunner sets (the runner's CPUs /
// local ranks), else CPUs / localWorldSize. The environment wins because
// rankrunner binds each rank to its own block of CPUs, and a bound
// rank's runtime.NumCPU is already its share: dividing it again by the
// local ranks would halve the rank's threads on any machine with more
// CPUs than ranks.
//
// Errors: a global batch that is not a multiple of worldSize; those of
// mnistdata.Load (wrapping mnistdata.ErrDataNotFound when the files are
// missing).
func (o *Options) Setup(rank, worldSize, localWorldSize int) (*Job, error) {
	j := &Job{Rank: rank, WorldSize: worldSize, Threads: o.Threads}
	if j.Threads == 0 {
		j.Threads = defaultThreads(os.Getenv("GOMAXPROCS"), runtime.NumCPU(), localWorldSize)
	}
	runtime.GOMAXPROCS(j.Threads)
	if o.Batch%worldSize != 0 {
		return nil, fmt.Errorf("--batch-size %d is not a multiple of the world size %d", o.Batch, worldSize)
	}
	j.LocalBatch = o.Batch / worldSize
	train, test, err := mnistdata.Load(o.DataDir)
	if err != nil {
		return nil, err
	}
	j.Train, j.Test = train.Head(o.TrainLimit), test
	return j, nil
}

// Bar is rank 0's progress bar for one epoch (on stderr); on other ranks
// its methods do nothing.
type Bar struct {
	bar          *progressbar.ProgressBar
	start        time.Time
	epoch, total int
	batch, done  int
}

// NewBar starts the bar of epoch (from 0) of epochs, steps steps of the
// global batch; only rank 0 draws it.
func (j *Job) NewBar(o *Options, epoch, steps int) *Bar {
	b := &Bar{start: time.Now(), epoch: epoch + 1, total: o.Epochs, batch: o.Batch}
	if j.Rank == 0 {
		b.bar = progressbar.NewOptions(steps*o.Batch, progressbar.OptionSetWriter(os.Stderr),
			progressbar.OptionSetDescription(fmt.Sprintf("epoch %d/%d", b.epoch, b.total)),
			progressbar.OptionShowCount(), progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(200*time.Millisecond), progressbar.OptionShowElapsedTimeOnFinish(),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(os.Stderr) }))
	}
	return b
}

// Step records one finished step with its loss.
func (b *Bar) Step(loss float64) {
	if b.bar == nil {
		return
	}
	b.done++
	rate := float64(b.done*b.batch) / time.Since(b.start).Seconds()
	b.bar.Describe(fmt.Sprintf("epoch %d/%d loss %.4f %6.0f samples/s", b.epoch, b.total, loss, rate))
	_ = b.bar.Add(b.batch)
}

// Finish completes the bar.
func (b *Bar) Finish() {
	if b.bar != nil {
		_ = b.bar.Finish()
	}
}

// Report is the --json-out document (scripts/bench-frameworks.sh reads
// samples_per_sec and comm_fraction). Times are seconds of wall time.
type Report struct {
	Rank          int     `json:"rank"`
	WorldSize     int     `json:"world_size"`
	GlobalBatch   int     `json:"global_batch"`
	Epochs        int     `json:"epochs"`
	Steps         int     `json:"steps"`
	Threads       int     `json:"threads"`
	TrainSamples  int     `json:"train_samples"`
	Accuracy      float64 `json:"accuracy"`        // on the 10,000 test images
	SamplesPerSec float64 `json:"samples_per_sec"` // global samples per second of training
	TrainSeconds  float64 `json:"train_seconds"`
	// ForwardSeconds and ApplySeconds are GoMLX's graph 1 (model, loss,
	// gradients) and graph 2 (optimizer); zero elsewhere.
	ForwardSeconds float64 `json:"forward_seconds,omitempty"`
	SyncSeconds    float64 `json:"sync_seconds"` // inside ddp's Sync (copies + allreduce)
	ApplySeconds   float64 `json:"apply_seconds,omitempty"`
	CommSeconds    float64 `json:"comm_seconds,omitempty"` // waiting on the allreduces, where measured
	CommFraction   float64 `json:"comm_fraction"`          // sync_seconds / train_seconds
	FinalLoss      float64 `json:"final_loss"`
	ParamHash      string  `json:"param_hash"` // FNV-64a of the parameters' float32 bits: equal on every rank
}

// NewReport fills the fields that come from the options and the job;
// steps of the global batch took trainSecs.
func (j *Job) NewReport(o *Options, steps int, trainSecs float64) Report {
	return Report{
		Rank: j.Rank, WorldSize: j.WorldSize, GlobalBatch: o.Batch, Epochs: o.Epochs, Steps: steps,
		Threads: j.Threads, TrainSamples: j.Train.Len(), TrainSeconds: trainSecs,
		SamplesPerSec: float64(steps*o.Batch) / trainSecs,
	}
}

// Emit prints the summary line on rank 0 (stdout) and writes the JSON
// report to o.JSONOut (rank 0 only, unless the path holds "{rank}").
func (r *Report) Emit(o *Options) error {
	if r.Rank == 0 {
		fmt.Printf("test accuracy %.2f%% | %d ranks × %d threads, global batch %d, %d steps | %.0f samples/s | sync %.1f%% of training | train %.1fs | params fnv64a %s\n",
			100*r.Accuracy, r.WorldSize, r.Threads, r.GlobalBatch, r.Steps, r.SamplesPerSec, 100*r.CommFraction, r.TrainSeconds, r.ParamHash)
	}
	path := o.JSONOut
	if path == "" || (r.Rank != 0 && !strings.Contains(path, "{rank}")) {
		return nil
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(strings.ReplaceAll(path, "{rank}", strconv.Itoa(r.Rank)), append(b, '\n'), 0o644)
}

// ParamHash hashes float32 parameters in order (FNV-64a of their bits),
// so that ranks can compare their models.
type ParamHash struct{ h hash.Hash64 }

// NewParamHash returns an empty hash.
func NewParamHash() *ParamHash { return &ParamHash{h: fnv.New64a()} }

// Add hashes the values of one parameter.
func (p *ParamHash) Add(vals []float32) {
	var b [4]byte
	for _, v := range vals {
		binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
		p.h.Write(b[:])
	}
}

// String is the hash as 16 hex digits.
func (p *ParamHash) String() string { return fmt.Sprintf("%016x", p.h.Sum64()) }

// defaultThreads is a rank's thread count when --threads is 0: env (the
// GOMAXPROCS variable, as rankrunner sets it) when it is a positive
// integer, else cpus / localWorldSize, at least 1.
func defaultThreads(env string, cpus, localWorldSize int) int {
	if n, err := strconv.Atoi(env); err == nil && n > 0 {
		return n
	}
	return max(1, cpus/max(1, localWorldSize))
}
