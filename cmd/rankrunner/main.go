// Command rankrunner launches, supervises and observes ranktree jobs: the
// Go counterpart of torchrun, plus `rankrunner events` (a live view of a
// job's events) and `rankrunner diagnose` (flight-recorder analysis).
//
//	rankrunner --nproc-per-node 4 ./cmd/train --epochs 3
//	rankrunner --nnodes 2 --node-rank 0 --nats-listen 0.0.0.0:4222 --job-id j1 ./cmd/train
//	rankrunner --nnodes 2 --node-rank 1 --nats nats://node0:4222 --job-id j1 ./cmd/train
//	rankrunner events --job j1 --nats nats://node0:4222
package main

import (
	"context"
	"os"

	"github.com/ranktree/ranktree/cmd/rankrunner/internal/cli"
)

func main() {
	os.Exit(cli.Main(context.Background(), cli.Env{Args: os.Args[1:], Stdout: os.Stdout, Stderr: os.Stderr, LimitProcs: true}))
}
