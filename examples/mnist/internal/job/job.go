// Package job is the MNIST program minus the runtime start-up: flag
// parsing, data loading, model and reducer construction, training, and the
// rank-0 report. main calls ranktree.Init and hands Run the world group;
// tests hand it an in-process group.
package job

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"

	data "github.com/ranktree/ranktree/examples/internal/mnistdata"
	"github.com/ranktree/ranktree/examples/mnist/internal/ddp"
	"github.com/ranktree/ranktree/examples/mnist/internal/model"
	"github.com/ranktree/ranktree/examples/mnist/internal/train"
	"github.com/ranktree/ranktree/reducer"
)

// DefaultBucketCapMB is --bucket-cap-mb's default. Buckets fill in reverse
// parameter order and close once they reach the cap (DDP's rule), so
// 0.125 MiB gives two buckets for the MLP: {fc3, fc2} (134 KiB), reduced
// while fc1's gradient is computed, then {fc1} (785 KiB). DDP's default of
// 25 MiB would put the whole 0.9 MiB model in one bucket, with no overlap.
const DefaultBucketCapMB = 0.125

// Options are the program's flags.
type Options struct {
	Epochs      int     // --epochs: passes over the training set
	BatchSize   int     // --batch-size: global batch, a multiple of the world size
	LR          float64 // --lr: SGD learning rate
	Momentum    float64 // --momentum: SGD momentum
	WeightDecay float64 // --weight-decay: SGD L2 penalty
	Seed        uint64  // --seed: model initialisation and shuffle seed
	BucketCapMB float64 // --bucket-cap-mb: DDP bucket cap in MiB
	TrainLimit  int     // --train-limit: train on the first N samples (0: all)
	DataDir     string  // --data-dir: MNIST folder (empty: the module cache)
	JSONOut     string  // --json-out: metrics file; "{rank}" makes every rank write one
	ParamsOut   string  // --params-out: final parameters as raw float32 little-endian; "{rank}" as for JSONOut
	// ProgressEvery is --progress-every: the interval of the plain progress
	// lines when stderr is not a terminal (0: train.DefaultProgressEvery).
	ProgressEvery time.Duration
	// ReducerStats, if set (not a flag), is called once with the DDP
	// reducer's Stats function when the reducer exists; main registers it
	// as Prometheus metrics (ranktree.Runtime.RegisterReducerMetrics).
	ReducerStats func(stats func() reducer.Stats) error
}

// ParseFlags parses args (without the program name) into Options, with
// the defaults of the main job. Usage and errors go to stderr; -h gives
// flag.ErrHelp.
func ParseFlags(args []string, stderr io.Writer) (Options, error) {
	var o Options
	fs := flag.NewFlagSet("mnist", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.Epochs, "epochs", 3, "passes over the training set")
	fs.DurationVar(&o.ProgressEvery, "progress-every", train.DefaultProgressEvery, "when stderr is not a terminal: interval of the plain progress lines (epoch, step, samples/s, loss, ETA), also printed at each epoch's end")
	fs.IntVar(&o.BatchSize, "batch-size", train.DefaultBatch, "global batch size (summed over ranks; a multiple of the world size)")
	fs.Float64Var(&o.LR, "lr", train.DefaultLR, "SGD learning rate")
	fs.Float64Var(&o.Momentum, "momentum", train.DefaultMomentum, "SGD momentum")
	fs.Float64Var(&o.WeightDecay, "weight-decay", 0, "SGD weight decay (L2 penalty)")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the model initialisation and the data shuffle")
	fs.Float64Var(&o.BucketCapMB, "bucket-cap-mb", DefaultBucketCapMB, "DDP bucket cap in MiB (the model's gradients are 0.9 MiB; the default makes two buckets, fc2+fc3 and fc1, so the first allreduce overlaps fc1's backward)")
	fs.IntVar(&o.TrainLimit, "train-limit", 0, "use only the first N training samples (0: all 60000)")
	fs.StringVar(&o.DataDir, "data-dir", "", "folder with the four MNIST idx .gz files (default: the GoMNIST module in the module cache)")
	fs.StringVar(&o.JSONOut, "json-out", "", `write the final metrics as JSON to this file on rank 0 ("{rank}" in the name: every rank writes its own)`)
	fs.StringVar(&o.ParamsOut, "params-out", "", `write the final parameters (fc1.weight [784×256], fc1.bias, ..., fc3.bias; float32 little-endian) to this file on rank 0 ("{rank}": every rank)`)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("mnist: unexpected arguments %q", fs.Args())
	}
	if !(o.BucketCapMB > 0) || o.BucketCapMB > 1<<10 {
		return o, fmt.Errorf("mnist: --bucket-cap-mb %v, want in (0, 1024]", o.BucketCapMB)
	}
	if o.TrainLimit < 0 {
		return o, fmt.Errorf("mnist: --train-limit %d, want ≥ 0", o.TrainLimit)
	}
	return o, nil
}

// Report is the --json-out document: the options that shaped the run and
// train.Result's fields.
type Report struct {
	Rank        int     `json:"rank"`
	WallSeconds float64 `json:"wall_seconds"` // from Run's start to the end of training and checks
	LR          float64 `json:"lr"`
	Momentum    float64 `json:"momentum"`
	Seed        uint64  `json:"seed"`
	BucketCapMB float64 `json:"bucket_cap_mb"`
	*train.Result
}

// Run is one rank of the job over group g: it loads MNIST, builds the model
// from o.Seed, builds the DDP reducer (a collective that broadcasts rank
// 0's parameters), trains, evaluates, checks that all ranks hold identical
// parameters, and on rank 0 draws progress bars on stderr, prints a summary
// line on stdout and writes o.JSONOut and o.ParamsOut. Errors name the rank; a parameter
// divergence is a train.ErrParamMismatch on every rank.
func Run(ctx context.Context, o Options, g reducer.Group, log zerolog.Logger, stdout, stderr io.Writer) (*Report, error) {
	start := time.Now()
	rank := g.Rank()
	trainSet, testSet, err := data.Load(o.DataDir)
	if err != nil {
		return nil, fmt.Errorf("mnist: rank %d: %w", rank, err)
	}
	trainSet = trainSet.Head(o.TrainLimit)
	m, err := model.New(model.MNISTSizes, o.Seed)
	if err != nil {
		return nil, err
	}
	sync, err := ddp.New(ctx, g, m, int(o.BucketCapMB*(1<<20)), log)
	if err != nil {
		return nil, err
	}
	if o.ReducerStats != nil {
		if err := o.ReducerStats(sync.Reducer().Stats); err != nil {
			return nil, err
		}
	}
	cfg := train.Config{
		Epochs: o.Epochs, GlobalBatch: o.BatchSize, Seed: o.Seed,
		LR: float32(o.LR), Momentum: float32(o.Momentum), WeightDecay: float32(o.WeightDecay),
		Log: log,
	}
	if rank == 0 {
		cfg.Progress = stderr
		// A bar on a terminal; plain lines in files, pipes and under
		// rankrunner (whose ranks write to pipes).
		if f, ok := stderr.(*os.File); ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd())) {
			cfg.ProgressTTY = true
		}
		cfg.ProgressEvery = o.ProgressEvery
	}
	res, err := train.Run(ctx, cfg, m, trainSet, testSet, sync)
	if err != nil {
		return nil, err
	}
	rep := &Report{Rank: rank, WallSeconds: time.Since(start).Seconds(), LR: o.LR, Momentum: o.Momentum,
		Seed: o.Seed, BucketCapMB: o.BucketCapMB, Result: res}
	log.Debug().Int("rank", rank).Float64("accuracy", res.Accuracy).Float64("samples_per_sec", res.SamplesPerSec).
		Str("param_hash", res.ParamHash).Msg("mnist done")
	if rank == 0 {
		fmt.Fprintf(stdout, "test accuracy %.2f%% (%d/%d) | %d ranks, global batch %d, %d steps | %.0f samples/s | train %.1fs, wall %.1fs | params fnv64a %s\n",
			100*res.Accuracy, res.Correct, res.TestSamples, res.WorldSize, res.GlobalBatch, res.Steps,
			res.SamplesPerSec, res.TrainSeconds, rep.WallSeconds, res.ParamHash)
	}
	if path := outPath(o.JSONOut, rank); path != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err == nil {
			err = os.WriteFile(path, append(b, '\n'), 0o644)
		}
		if err != nil {
			return nil, fmt.Errorf("mnist: rank %d: writing %s: %w", rank, path, err)
		}
	}
	if path := outPath(o.ParamsOut, rank); path != "" {
		b := make([]byte, 0, 4*len(m.Params))
		for _, v := range m.Params {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			return nil, fmt.Errorf("mnist: rank %d: writing %s: %w", rank, path, err)
		}
	}
	return rep, nil
}

// outPath is the file rank writes for an output flag: the flag with
// "{rank}" replaced, on every rank if the flag has "{rank}", else on rank 0
// only; "" for none.
func outPath(flagValue string, rank int) string {
	if flagValue == "" || (rank != 0 && !strings.Contains(flagValue, "{rank}")) {
		return ""
	}
	return strings.ReplaceAll(flagValue, "{rank}", strconv.Itoa(rank))
}
