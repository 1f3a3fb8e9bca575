package reducer

import (
	"fmt"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
)

// Default bucket sizes, as torch.nn.parallel.DistributedDataParallel's
// bucket_cap_mb=25 and dist._DEFAULT_FIRST_BUCKET_BYTES.
const (
	DefaultBucketCapBytes   = 25 << 20 // 25 MiB
	DefaultFirstBucketBytes = 1 << 20  // 1 MiB
)

// Config configures a Reducer. The zero Config is valid: validate fills the
// defaults. Fields follow the keyword arguments of DistributedDataParallel.
type Config struct {
	// BucketCapBytes caps every bucket but the first (bytes; default 25 MiB;
	// DDP bucket_cap_mb).
	BucketCapBytes int
	// FirstBucketBytes caps the first bucket of each dtype (bytes; default
	// 1 MiB), so the first allreduce starts early in backward.
	FirstBucketBytes int
	// GradientAsBucketView makes GradBuffer(i) the storage of parameter i's
	// gradient: the caller writes (or accumulates) gradients there and
	// GradReady does not copy (DDP gradient_as_bucket_view). Without it the
	// caller passes its own gradient buffers to GradReady and gets the
	// averaged values written back into them by EndBackward.
	GradientAsBucketView bool
	// FindUnusedParameters lets iterations leave parameters without a
	// gradient: those passed to PrepareForBackward, and at EndBackward every
	// parameter never marked ready, are reduced as zeros; the local-used
	// map is allreduced after the last bucket and gradients of globally
	// unused parameters are left untouched. Disables the bucket rebuild
	// (DDP find_unused_parameters).
	FindUnusedParameters bool
	// StaticGraph declares that the set of parameters receiving gradients
	// is the same every iteration: the first iteration finds the unused
	// ones, later iterations mark them ready at the start and fail with
	// ErrStaticGraphChanged if the set changes (DDP static_graph).
	StaticGraph bool
	// DelayAllReduce launches no bucket reduction during backward: every
	// bucket (through the comm hook, if one is registered) is reduced in
	// bucket order when EndBackward is called, so communication does not
	// overlap backward. Results are the same as the overlapped path. Use
	// it to keep collectives off the network while backward computes, or
	// with a hook that must see the whole iteration at once. It follows
	// c10d reducer.cpp's delay_all_reduce (what a static graph's first
	// iteration does) and DDP's delay_all_reduce_named_params covering
	// every parameter (_delay_all_reduce_all_params); torch's per-
	// parameter subset is not offered.
	DelayAllReduce bool
	// BroadcastBuffers are extra host buffers (DDP module buffers, e.g.
	// batch-norm statistics) broadcast from rank 0 by New, by SyncBuffers
	// and after Join.
	BroadcastBuffers []comm.Buffer
	// UnevenInputs enables Join (torch.distributed.algorithms.Join with
	// DDP): every synced iteration starts with an allreduce counting the
	// ranks that have not joined, which joined ranks answer with shadow
	// collectives. Every rank must set it alike.
	UnevenInputs bool
	// DivideByActiveRanks divides gradients by the number of ranks that
	// have not joined instead of the world size (Join's
	// divide_by_initial_world_size=False). Needs UnevenInputs.
	DivideByActiveRanks bool
	// BroadcastChunkBytes bounds one coalesced broadcast of parameters in
	// New and after Join (bytes; default 250 MiB, DDP's
	// _DEFAULT_BUCKET_CAP for module state sync).
	BroadcastChunkBytes int
	// Log receives the reducer's structured logs; the rank field is added.
	// The zero Logger discards everything.
	Log zerolog.Logger
}

// validate fills defaults and rejects impossible settings (errors wrap
// comm.ErrInvalidArgument).
func (c *Config) validate() error {
	if c.BucketCapBytes == 0 {
		c.BucketCapBytes = DefaultBucketCapBytes
	}
	if c.FirstBucketBytes == 0 {
		c.FirstBucketBytes = DefaultFirstBucketBytes
	}
	if c.BroadcastChunkBytes == 0 {
		c.BroadcastChunkBytes = 250 << 20
	}
	if c.BucketCapBytes < 0 || c.FirstBucketBytes < 0 || c.BroadcastChunkBytes < 0 {
		return fmt.Errorf("%w: reducer: negative size in Config (BucketCapBytes %d, FirstBucketBytes %d, BroadcastChunkBytes %d)",
			comm.ErrInvalidArgument, c.BucketCapBytes, c.FirstBucketBytes, c.BroadcastChunkBytes)
	}
	if c.DivideByActiveRanks && !c.UnevenInputs {
		return fmt.Errorf("%w: reducer: DivideByActiveRanks needs UnevenInputs", comm.ErrInvalidArgument)
	}
	for i, b := range c.BroadcastBuffers {
		if !b.Valid() || !b.IsHost() {
			return fmt.Errorf("%w: reducer: BroadcastBuffers[%d] (%v) must be a valid host buffer", comm.ErrInvalidArgument, i, b)
		}
	}
	return nil
}
