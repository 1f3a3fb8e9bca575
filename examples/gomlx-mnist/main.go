// Command gomlx-mnist trains the 784-256-128-10 MLP on MNIST with GoMLX
// (github.com/gomlx/gomlx v0.26.0, pure-Go simplego backend),
// data-parallel over ranktree through adapters/gomlx. From the
// repository root:
//
//	go run ./cmd/rankrunner --nproc-per-node 2 ./examples/gomlx-mnist
//	go run ./examples/gomlx-mnist          # one process, no rankrunner
//
// The program is an ordinary GoMLX program (context, layers, loss,
// optimizer, a train.Dataset, eval metrics); the lines marked "ranktree:"
// are what makes it data-parallel: Init, Close, rtgomlx.NewTrainer in
// place of train.NewTrainer, and the sampler giving each rank its shard.
//
// The global batch (--batch-size) is split evenly across ranks, so n
// ranks compute the same update as one rank on the whole batch. Rank 0
// draws a progress bar per epoch on stderr and prints the test accuracy
// and samples/s on stdout. GoMLX's simplego backend is slow on CPU: a
// full run takes minutes.
//
// Flags:
//
//	--epochs N        passes over the training set (default 3)
//	--batch-size N    global batch, a multiple of the world size (default 128)
//	--lr F            Adam learning rate (default 0.001)
//	--seed N          shuffle and initialisation seed (default 1); weights come from rank 0
//	--train-limit N   train on the first N samples only (0: all 60,000)
//	--threads N       simplego parallelism and GOMAXPROCS of each rank (default: CPUs / ranks on this node)
//	--data-dir DIR    folder with the four MNIST .gz files (default: module cache)
//	--json-out FILE   write the metrics as JSON ("{rank}" in FILE: every rank)
//
// Exit status: 0 on success, 1 on error, 2 for bad flags.
package main

import (
	stdctx "context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
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

	"github.com/gomlx/gomlx/backends/simplego" // the pure-Go backend only: XLA would download its plugin
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	"github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/layers"
	"github.com/gomlx/gomlx/pkg/ml/layers/activations"
	"github.com/gomlx/gomlx/pkg/ml/train/losses"
	"github.com/gomlx/gomlx/pkg/ml/train/metrics"
	"github.com/gomlx/gomlx/pkg/ml/train/optimizers"
	"github.com/schollz/progressbar/v3"

	rtgomlx "github.com/ranktree/ranktree/adapters/gomlx"
	"github.com/ranktree/ranktree/ddp"
)

type options struct {
	epochs, batch, trainLimit, threads int
	lr                                 float64
	seed                               uint64
	dataDir, jsonOut                   string
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("gomlx-mnist", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.epochs, "epochs", 3, "passes over the training set")
	fs.IntVar(&o.batch, "batch-size", 128, "global batch size (a multiple of the world size)")
	fs.Float64Var(&o.lr, "lr", 0.001, "Adam learning rate")
	fs.Uint64Var(&o.seed, "seed", 1, "shuffle and initialisation seed")
	fs.IntVar(&o.trainLimit, "train-limit", 0, "train on the first N samples (0: all)")
	fs.IntVar(&o.threads, "threads", 0, "simplego parallelism and GOMAXPROCS per rank (0: CPUs / local ranks)")
	fs.StringVar(&o.dataDir, "data-dir", "", "folder with the MNIST .gz files (default: module cache)")
	fs.StringVar(&o.jsonOut, "json-out", "", `write metrics as JSON ("{rank}": every rank)`)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case o.epochs < 1:
		return o, fmt.Errorf("gomlx-mnist: --epochs %d, want ≥ 1", o.epochs)
	case o.batch < 1:
		return o, fmt.Errorf("gomlx-mnist: --batch-size %d, want ≥ 1", o.batch)
	case o.lr <= 0:
		return o, fmt.Errorf("gomlx-mnist: --lr %v, want > 0", o.lr)
	case o.threads < 0 || o.trainLimit < 0:
		return o, errors.New("gomlx-mnist: --threads and --train-limit must be ≥ 0")
	}
	return o, nil
}

// report is the --json-out document.
type report struct {
	Rank           int     `json:"rank"`
	WorldSize      int     `json:"world_size"`
	GlobalBatch    int     `json:"global_batch"`
	Epochs         int     `json:"epochs"`
	Steps          int     `json:"steps"`
	Threads        int     `json:"threads"`
	TrainSamples   int     `json:"train_samples"`
	Accuracy       float64 `json:"accuracy"`
	SamplesPerSec  float64 `json:"samples_per_sec"` // global samples per second of training
	TrainSeconds   float64 `json:"train_seconds"`
	ForwardSeconds float64 `json:"forward_seconds"` // graph 1: model, loss, gradients
	SyncSeconds    float64 `json:"sync_seconds"`    // ddp Sync (copies + allreduce)
	ApplySeconds   float64 `json:"apply_seconds"`   // graph 2: optimizer
	CommFraction   float64 `json:"comm_fraction"`   // sync_seconds / train_seconds
	FinalLoss      float64 `json:"final_loss"`
	ParamHash      string  `json:"param_hash"`
}

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	o, err := parseFlags(args, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(stdctx.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := trainMNIST(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "gomlx-mnist:", err)
		return 1
	}
	return 0
}

// mlp is the model function: 784-256-128-10 with ReLU, returning logits.
func mlp(ctx *context.Context, _ any, inputs []*graph.Node) []*graph.Node {
	ctx = ctx.In("model")
	h := activations.Relu(layers.Dense(ctx.In("fc1"), inputs[0], true, 256))
	h = activations.Relu(layers.Dense(ctx.In("fc2"), h, true, 128))
	return []*graph.Node{layers.Dense(ctx.In("fc3"), h, true, classes)}
}

// shardDataset is a train.Dataset over one rank's shard of a split: local
// batches of [n, 784] float32 images and [n, 1] int32 labels; io.EOF at
// the end of the epoch.
type shardDataset struct {
	name    string
	set     *dataset
	idx     []int
	batch   int
	pos     int
	sampler *ddp.DistributedSampler // nil: the whole split in order (evaluation)
	epoch   int
}

func (d *shardDataset) Name() string { return d.name }

// Reset starts the next epoch (a new permutation from the sampler).
func (d *shardDataset) Reset() {
	d.pos = 0
	if d.sampler != nil {
		d.sampler.SetEpoch(d.epoch)
		d.idx = d.sampler.Indices()
		d.epoch++
	}
}

func (d *shardDataset) Yield() (any, []*tensors.Tensor, []*tensors.Tensor, error) {
	n := min(d.batch, len(d.idx)-d.pos)
	if n <= 0 || (d.sampler != nil && n < d.batch) { // training drops a partial last batch
		return nil, nil, nil, io.EOF
	}
	x := make([]float32, n*pixels)
	y := make([]int32, n)
	for i, s := range d.idx[d.pos : d.pos+n] {
		copy(x[i*pixels:(i+1)*pixels], d.set.x[s*pixels:(s+1)*pixels])
		y[i] = int32(d.set.y[s])
	}
	d.pos += n
	return nil, []*tensors.Tensor{tensors.FromFlatDataAndDimensions(x, n, pixels)},
		[]*tensors.Tensor{tensors.FromFlatDataAndDimensions(y, n, 1)}, nil
}

func trainMNIST(ctx stdctx.Context, o options) error {
	rt, err := ddp.Init(ctx) // ranktree: join the job (or run as one process)
	if err != nil {
		return err
	}
	defer rt.Close(stdctx.WithoutCancel(ctx)) // ranktree: leave it

	rank, size := rt.Rank(), rt.WorldSize()
	threads := o.threads
	if threads == 0 {
		threads = max(1, runtime.NumCPU()/max(1, rt.LocalWorldSize()))
	}
	runtime.GOMAXPROCS(threads)
	if o.batch%size != 0 {
		return fmt.Errorf("--batch-size %d is not a multiple of the world size %d", o.batch, size)
	}
	local := o.batch / size
	trainSet, testSet, err := loadMNIST(o.dataDir)
	if err != nil {
		return err
	}
	trainSet = trainSet.head(o.trainLimit)

	backend, err := simplego.New(fmt.Sprintf("parallelism=%d", threads))
	if err != nil {
		return err
	}
	mlctx := context.New()
	if err := mlctx.SetRNGStateFromSeed(int64(o.seed)); err != nil {
		return err
	}
	accuracy := metrics.NewSparseCategoricalAccuracy("Mean Accuracy", "#acc")
	trainer, err := rtgomlx.NewTrainer(ctx, rt.World(), ddp.Config{}, // ranktree: in place of train.NewTrainer(
		backend, mlctx, mlp, losses.SparseCategoricalCrossEntropyLogits,
		optimizers.Adam().LearningRate(o.lr).Done(), nil, []metrics.Interface{accuracy})
	if err != nil {
		return err
	}
	sampler, err := ddp.NewDistributedSampler(ddp.SamplerConfig{Len: trainSet.len(), Rank: rank, Size: size, Shuffle: true, Seed: o.seed, DropLast: true}) // ranktree: this rank's shard
	if err != nil {
		return err
	}
	trainDS := &shardDataset{name: "mnist-train", set: trainSet, batch: local, sampler: sampler}

	start := time.Now()
	steps, lastLoss, err := trainEpochs(ctx, o, trainer, trainDS, rank, local)
	if err != nil {
		return err
	}
	trainSecs := time.Since(start).Seconds()
	tm := trainer.Times()

	acc, err := testAccuracy(trainer, testSet)
	if err != nil {
		return err
	}
	hash, err := paramHash(mlctx)
	if err != nil {
		return err
	}
	rep := report{
		Rank: rank, WorldSize: size, GlobalBatch: o.batch, Epochs: o.epochs, Steps: steps, Threads: threads,
		TrainSamples: trainSet.len(), Accuracy: acc, TrainSeconds: trainSecs,
		SamplesPerSec:  float64(steps*o.batch) / trainSecs,
		ForwardSeconds: tm.Forward.Seconds(), SyncSeconds: tm.Sync.Seconds(), ApplySeconds: tm.Apply.Seconds(),
		CommFraction: tm.Sync.Seconds() / trainSecs, FinalLoss: lastLoss, ParamHash: hash,
	}
	if rank == 0 {
		fmt.Printf("test accuracy %.2f%% | %d ranks × %d threads, global batch %d, %d steps | %.0f samples/s | sync %.1f%% of training | train %.1fs | params fnv64a %s\n",
			100*acc, size, threads, o.batch, steps, rep.SamplesPerSec, 100*rep.CommFraction, trainSecs, rep.ParamHash)
	}
	if path := o.jsonOut; path != "" && (rank == 0 || strings.Contains(path, "{rank}")) {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(strings.ReplaceAll(path, "{rank}", strconv.Itoa(rank)), append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// trainEpochs runs o.epochs epochs of trainer over this rank's shard
// (local samples per step) and returns the steps taken and the last loss.
func trainEpochs(ctx stdctx.Context, o options, trainer *rtgomlx.Trainer, trainDS *shardDataset, rank, local int) (steps int, lastLoss float64, err error) {
	for epoch := 0; epoch < o.epochs; epoch++ {
		trainDS.Reset()
		nb := len(trainDS.idx) / local
		bar := epochBar(rank, nb*o.batch, epoch, o.epochs)
		epochStart := time.Now()
		n, err := trainer.Train(trainDS, func(step int, mets []*tensors.Tensor) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			lastLoss = float64(tensors.ToScalar[float32](mets[0]))
			if bar != nil {
				rate := float64(step*o.batch) / time.Since(epochStart).Seconds()
				bar.Describe(fmt.Sprintf("epoch %d/%d loss %.4f %6.0f samples/s", epoch+1, o.epochs, lastLoss, rate))
				_ = bar.Add(o.batch)
			}
			return nil
		})
		steps += n
		if err != nil {
			return steps, lastLoss, err
		}
		if bar != nil {
			_ = bar.Finish()
		}
	}
	return steps, lastLoss, nil
}

// testAccuracy evaluates trainer's model on the whole test set, 1000
// images at a time.
func testAccuracy(trainer *rtgomlx.Trainer, testSet *dataset) (float64, error) {
	testIdx := make([]int, testSet.len())
	for i := range testIdx {
		testIdx[i] = i
	}
	evalRes, err := trainer.Eval(&shardDataset{name: "mnist-test", set: testSet, idx: testIdx, batch: 1000})
	if err != nil {
		return 0, err
	}
	return float64(tensors.ToScalar[float32](evalRes[len(evalRes)-1])), nil
}

// epochBar is rank 0's progress bar over n samples of one epoch (nil on
// other ranks).
func epochBar(rank, n, epoch, epochs int) *progressbar.ProgressBar {
	if rank != 0 {
		return nil
	}
	return progressbar.NewOptions(n, progressbar.OptionSetWriter(os.Stderr),
		progressbar.OptionSetDescription(fmt.Sprintf("epoch %d/%d", epoch+1, epochs)),
		progressbar.OptionShowCount(), progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(200*time.Millisecond), progressbar.OptionShowElapsedTimeOnFinish(),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(os.Stderr) }))
}

// paramHash is an FNV-64a hash of every trainable variable's float32 bits
// in the context's order, so ranks can be compared.
func paramHash(c *context.Context) (string, error) {
	h := fnv.New64a()
	var b [4]byte
	for v := range c.IterVariables() {
		if !v.Trainable {
			continue
		}
		val, err := v.Value()
		if err != nil {
			return "", err
		}
		for _, x := range tensors.MustCopyFlatData[float32](val) {
			binary.LittleEndian.PutUint32(b[:], math.Float32bits(x))
			h.Write(b[:])
		}
	}
	return fmt.Sprintf("%016x", h.Sum64()), nil
}
