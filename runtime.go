package ranktree

import (
	"context"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/internal/bootstrap"
	"github.com/ranktree/ranktree/reducer"
	"github.com/ranktree/ranktree/store"
)

// InitBarrierKey is the store-based barrier Init passes (under the
// per-restart prefix), so that every rank of the attempt is present.
const InitBarrierKey = bootstrap.InitBarrierKey

// Runtime is one rank's membership in a job: its identity, the job's store
// and its process groups. Create it with Init; it is safe for concurrent
// use. (internal/bootstrap builds and tears it down.)
type Runtime struct{ in *bootstrap.Rank }

// Init joins the job described by the env contract (see the package doc),
// with opts overriding variables. It connects to the job's store (NATS
// JetStream KV bucket for RANKTREE_JOB, unless WithStore), scopes it to
// "restart/<RANKTREE_RESTART_COUNT>/", and passes the store-based barrier
// "init" so that all WORLD_SIZE ranks are present (c10d's
// _store_based_barrier). While it waits for the other ranks it watches the
// attempt's dead-rank records (DeadRankPrefix, written by rankrunner when a
// rank process fails), so a rank that died makes Init fail at once instead
// of at the timeout. Errors: *OptionError (ErrInvalidOption), *EnvError
// (ErrEnv), store.ErrUnavailable (NATS unreachable), *InitError naming the
// ranks concerned, which wraps ErrRankDead (a rank died: Dead) or
// *store.BarrierError (store.ErrTimeout: ranks Missing after the timeout).
// A failing Init writes its error to $RANKTREE_ERROR_FILE when set.
func Init(ctx context.Context, opts ...Option) (*Runtime, error) {
	in := make([]bootstrap.Option, len(opts))
	for i, o := range opts {
		in[i] = o
	}
	r, err := bootstrap.Start(ctx, os.LookupEnv, in...)
	if err != nil {
		return nil, err
	}
	return &Runtime{r}, nil
}

// Rank is the global rank, 0 ≤ Rank < WorldSize.
func (r *Runtime) Rank() int { return r.in.Rank }

// WorldSize is the number of ranks in the job.
func (r *Runtime) WorldSize() int { return r.in.WorldSize }

// LocalRank is the rank within this node (device index by convention).
func (r *Runtime) LocalRank() int { return r.in.LocalRank }

// LocalWorldSize is the number of ranks on this node.
func (r *Runtime) LocalWorldSize() int { return r.in.LocalWorldSize }

// NodeRank is the index of this rank's node among the job's nodes
// (torchrun's GROUP_RANK; rankrunner's --node-rank). It is not a rank in a
// process group: comm.ProcessGroup.Rank is that.
func (r *Runtime) NodeRank() int { return r.in.NodeRank }

// Job is the job id.
func (r *Runtime) Job() string { return r.in.Job }

// RestartCount is the restart attempt (0 for the first).
func (r *Runtime) RestartCount() int { return r.in.RestartCount }

// Timeout is the store and init-barrier timeout.
func (r *Runtime) Timeout() time.Duration { return r.in.Timeout }

// Store is the job store scoped to this attempt ("restart/<n>/"): keys of
// a previous attempt are invisible, so a restarted job never reads stale
// rendezvous data.
func (r *Runtime) Store() store.Store { return r.in.Store }

// JobStore is the job's whole (unprefixed) store, shared by all attempts.
func (r *Runtime) JobStore() store.Store { return r.in.JobStore }

// NATS is the control-plane connection (for event publishing); nil when
// Init was given WithStore.
func (r *Runtime) NATS() *nats.Conn { return r.in.NATS }

// Logger is the rank's logger, with job, rank, world_size, local_rank and
// restart fields.
func (r *Runtime) Logger() zerolog.Logger { return r.in.Log }

// Incarnation is how many times this process had already initialized the
// same job and rank before this Runtime (0 for the first Init).
func (r *Runtime) Incarnation() uint32 { return r.in.Incarnation }

// Close leaves the job: it runs the registered teardown (process groups),
// then closes the store view and, if Init opened it, the NATS store and
// connection. It is idempotent and bounded: it returns by ctx's deadline
// (30 s if ctx has none) even if teardown hangs, with an error saying so;
// later calls return the first call's result.
func (r *Runtime) Close(ctx context.Context) error { return r.in.Close(ctx) }

// RegisterReducerMetrics adds a DDP reducer's figures to this rank's
// Prometheus metrics (docs/metrics.md: ranktree_reducer_buckets,
// ranktree_reducer_bucket_bytes, ranktree_reducer_iterations_total,
// ranktree_reducer_overlap_ratio: the fraction of allreduce time hidden
// behind backward, ranktree_reducer_wait_seconds), read from stats
// (pass (*reducer.Reducer).Stats) at each scrape. Without
// RANKTREE_METRICS_ADDR it does nothing and returns nil; a second reducer
// on the same rank is an error.
func (r *Runtime) RegisterReducerMetrics(stats func() reducer.Stats) error {
	return r.in.RegisterReducerMetrics(stats)
}
