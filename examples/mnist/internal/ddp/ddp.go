// Package ddp binds the MNIST training loop to ranktree: it registers the
// model's parameters with a DDP reducer (reducer.Reducer) and implements
// train.Sync on top of it and the process group.
//
// Caller's duties:
//  1. Build the model on every rank (any initial values: New broadcasts
//     rank 0's parameters, as DistributedDataParallel's constructor does).
//  2. Call New on every rank with the same bucket cap; it is a collective.
//  3. Hand the Sync to train.Run.
package ddp

import (
	"context"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/examples/mnist/internal/model"
	"github.com/ranktree/ranktree/reducer"
)

// Sync implements train.Sync with a reducer.Reducer for gradients and the
// group's AllReduce for the loop's int64 reductions. It belongs to the
// training goroutine.
type Sync struct {
	g   reducer.Group
	red *reducer.Reducer
}

// New builds a Reducer over g for m's parameters (one reducer.Param per
// tensor, named fc1.weight, fc1.bias, ..., viewing m.Params in place) and
// returns the Sync. Buckets hold at most bucketCapBytes (DDP
// bucket_cap_mb); the first bucket gets the same cap (at most 1 MiB, DDP's
// first-bucket size), so a small model still spreads over several buckets
// and its first allreduce overlaps the rest of backward. On return every
// rank holds rank 0's parameters. Errors come from reducer.New (e.g.
// reducer.ErrModelMismatch when ranks built different models).
func New(ctx context.Context, g reducer.Group, m *model.MLP, bucketCapBytes int, log zerolog.Logger) (*Sync, error) {
	if bucketCapBytes < 1 {
		return nil, fmt.Errorf("%w: mnist: bucket cap %d bytes, want ≥ 1", comm.ErrInvalidArgument, bucketCapBytes)
	}
	list := m.ParamList()
	params := make([]reducer.Param, len(list))
	for i, p := range list {
		params[i] = reducer.Param{Name: p.Name, Data: comm.HostBuffer(m.View(m.Params, i)), Shape: p.Shape}
	}
	red, err := reducer.New(ctx, g, params, reducer.Config{
		BucketCapBytes:   bucketCapBytes,
		FirstBucketBytes: min(bucketCapBytes, reducer.DefaultFirstBucketBytes),
		Log:              log,
	})
	if err != nil {
		return nil, fmt.Errorf("mnist: rank %d: building the DDP reducer: %w", g.Rank(), err)
	}
	return &Sync{g: g, red: red}, nil
}

// Reducer is the underlying reducer (for its Stats).
func (s *Sync) Reducer() *reducer.Reducer { return s.red }

// Rank is this rank in the group.
func (s *Sync) Rank() int { return s.g.Rank() }

// Size is the group's size.
func (s *Sync) Size() int { return s.g.Size() }

// GradReady passes param's gradient to the reducer (Reducer.GradReady),
// which copies it into its bucket and launches the bucket's allreduce once
// the bucket is complete.
func (s *Sync) GradReady(param int, grad []float32) error {
	return s.red.GradReady(param, comm.HostBuffer(grad))
}

// EndBackward waits for every bucket (Reducer.EndBackward); the gradient
// slices passed to GradReady then hold the mean over ranks.
func (s *Sync) EndBackward(ctx context.Context) error { return s.red.EndBackward(ctx) }

// AllReduceInt64 reduces x in place across the group with op and waits.
func (s *Sync) AllReduceInt64(ctx context.Context, x []int64, op comm.ReduceOp) error {
	return s.g.AllReduce(ctx, comm.HostBuffer(x), op).Wait(ctx)
}
