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
	"fmt"
	"io"
	"os"
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

	rtgomlx "github.com/ranktree/ranktree/adapters/gomlx"
	"github.com/ranktree/ranktree/ddp"
	"github.com/ranktree/ranktree/examples/internal/mnistdata"
	"github.com/ranktree/ranktree/examples/internal/mnistjob"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	fs, o := mnistjob.NewFlagSet("gomlx-mnist", 0.001, "Adam learning rate", "simplego parallelism and GOMAXPROCS per rank (0: CPUs / local ranks)")
	return mnistjob.Main(fs, o, args, func(ctx stdctx.Context) error { return trainMNIST(ctx, o) })
}

// mlp is the model function: 784-256-128-10 with ReLU, returning logits.
func mlp(ctx *context.Context, _ any, inputs []*graph.Node) []*graph.Node {
	ctx = ctx.In("model")
	h := activations.Relu(layers.Dense(ctx.In("fc1"), inputs[0], true, 256))
	h = activations.Relu(layers.Dense(ctx.In("fc2"), h, true, 128))
	return []*graph.Node{layers.Dense(ctx.In("fc3"), h, true, mnistdata.NumClasses)}
}

// shardDataset is a train.Dataset over one rank's shard of a split: local
// batches of [n, 784] float32 images and [n, 1] int32 labels; io.EOF at
// the end of the epoch.
type shardDataset struct {
	name    string
	set     *mnistdata.Set
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
	x, labels := d.set.Gather(d.idx[d.pos:d.pos+n], make([]float32, n*mnistdata.Pixels), make([]uint8, n))
	y := make([]int32, n)
	for i, l := range labels {
		y[i] = int32(l)
	}
	d.pos += n
	return nil, []*tensors.Tensor{tensors.FromFlatDataAndDimensions(x, n, mnistdata.Pixels)},
		[]*tensors.Tensor{tensors.FromFlatDataAndDimensions(y, n, 1)}, nil
}

func trainMNIST(ctx stdctx.Context, o *mnistjob.Options) error {
	rt, err := ddp.Init(ctx) // ranktree: join the job (or run as one process)
	if err != nil {
		return err
	}
	defer rt.Close(stdctx.WithoutCancel(ctx)) // ranktree: leave it

	job, err := o.Setup(rt.Rank(), rt.WorldSize(), rt.LocalWorldSize())
	if err != nil {
		return err
	}
	local := job.LocalBatch
	backend, err := simplego.New(fmt.Sprintf("parallelism=%d", job.Threads))
	if err != nil {
		return err
	}
	mlctx := context.New()
	if err := mlctx.SetRNGStateFromSeed(int64(o.Seed)); err != nil {
		return err
	}
	accuracy := metrics.NewSparseCategoricalAccuracy("Mean Accuracy", "#acc")
	trainer, err := rtgomlx.NewTrainer(ctx, rt.World(), ddp.Config{}, // ranktree: in place of train.NewTrainer(
		backend, mlctx, mlp, losses.SparseCategoricalCrossEntropyLogits,
		optimizers.Adam().LearningRate(o.LR).Done(), nil, []metrics.Interface{accuracy})
	if err != nil {
		return err
	}
	sampler, err := ddp.NewDistributedSampler(ddp.SamplerConfig{Len: job.Train.Len(), Rank: rt.Rank(), Size: rt.WorldSize(), Shuffle: true, Seed: o.Seed, DropLast: true}) // ranktree: this rank's shard
	if err != nil {
		return err
	}
	trainDS := &shardDataset{name: "mnist-train", set: job.Train, batch: local, sampler: sampler}

	steps, lastLoss := 0, 0.0
	start := time.Now()
	for epoch := 0; epoch < o.Epochs; epoch++ {
		trainDS.Reset()
		bar := job.NewBar(o, epoch, len(trainDS.idx)/local)
		n, err := trainer.Train(trainDS, func(step int, mets []*tensors.Tensor) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			lastLoss = float64(tensors.ToScalar[float32](mets[0]))
			bar.Step(lastLoss)
			return nil
		})
		steps += n
		if err != nil {
			return err
		}
		bar.Finish()
	}
	trainSecs := time.Since(start).Seconds()
	tm := trainer.Times()

	testIdx := make([]int, job.Test.Len())
	for i := range testIdx {
		testIdx[i] = i
	}
	evalRes, err := trainer.Eval(&shardDataset{name: "mnist-test", set: job.Test, idx: testIdx, batch: 1000})
	if err != nil {
		return err
	}
	rep := job.NewReport(o, steps, trainSecs)
	rep.Accuracy = float64(tensors.ToScalar[float32](evalRes[len(evalRes)-1]))
	rep.FinalLoss = lastLoss
	rep.ForwardSeconds, rep.SyncSeconds, rep.ApplySeconds = tm.Forward.Seconds(), tm.Sync.Seconds(), tm.Apply.Seconds()
	rep.CommFraction = tm.Sync.Seconds() / trainSecs
	if rep.ParamHash, err = paramHash(mlctx); err != nil {
		return err
	}
	return rep.Emit(o)
}

// paramHash is an FNV-64a hash of every trainable variable's float32 bits
// in the context's order, so ranks can be compared.
func paramHash(c *context.Context) (string, error) {
	h := mnistjob.NewParamHash()
	for v := range c.IterVariables() {
		if !v.Trainable {
			continue
		}
		val, err := v.Value()
		if err != nil {
			return "", err
		}
		h.Add(tensors.MustCopyFlatData[float32](val))
	}
	return h.String(), nil
}
