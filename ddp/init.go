package ddp

import (
	"context"
	"os"

	"github.com/ranktree/ranktree"
	"github.com/ranktree/ranktree/store"
)

// Standalone reports whether this process was started without rankrunner
// (the RANK environment variable is unset), in which case Init runs it as
// a single rank.
func Standalone() bool {
	_, ok := os.LookupEnv(ranktree.EnvRank)
	return !ok
}

// Init joins the job like ranktree.Init, with one documented fallback:
// when the process was not started by rankrunner (Standalone: RANK is
// unset) it runs as rank 0 of a world of 1 with an in-memory store (no
// NATS, no network), so the same training program runs with `go run .`
// and under `rankrunner --nproc-per-node N`. In a world of 1, Wrap still
// copies values and Sync still runs the reducer (the average over one
// rank is the gradient itself), so the code path is the same. opts are
// appended after the fallback's, so they override it. Errors are
// ranktree.Init's.
func Init(ctx context.Context, opts ...ranktree.Option) (*ranktree.Runtime, error) {
	if Standalone() {
		base := []ranktree.Option{
			ranktree.WithRank(0), ranktree.WithWorldSize(1), ranktree.WithLocalRank(0),
			ranktree.WithLocalWorldSize(1), ranktree.WithNodeRank(0), ranktree.WithStore(store.NewMemStore()),
		}
		opts = append(base, opts...)
	}
	return ranktree.Init(ctx, opts...)
}
