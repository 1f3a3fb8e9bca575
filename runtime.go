package ranktree

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/internal/groups"
	"github.com/ranktree/ranktree/internal/metrics"
	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/store/natsstore"
)

// InitBarrierKey is the store-based barrier Init passes (under the
// per-restart prefix), so that every rank of the attempt is present.
const InitBarrierKey = "init"

// defaultCloseBound bounds Close when its ctx has no deadline.
const defaultCloseBound = 30 * time.Second

// Runtime is one rank's membership in a job: its identity, the job's store
// and (added by the process-group code) its groups. Create it with Init;
// it is safe for concurrent use.
type Runtime struct {
	rank, worldSize, localRank, localWorldSize, nodeRank, restartCount int
	job                                                                string
	timeout                                                            time.Duration
	log                                                                zerolog.Logger

	jobStore  store.Store        // the job's whole key space
	st        *store.PrefixStore // jobStore under "restart/<n>/"
	ownsStore bool               // Init connected jobStore; Close closes it
	nc        *nats.Conn         // nil when WithStore was used

	closeMu  sync.Mutex
	closers  []func(context.Context) error // run in reverse order by Close, before the store closes
	closed   bool
	closeErr error
	done     chan struct{} // closed when teardown finished

	// grp owns the rank's process groups (internal/groups): set by Init,
	// closed by Close. incarnation counts this process's earlier Inits of
	// the same job and rank (groups.go).
	grp         *groups.Manager
	incarnation uint32

	metrics    *metrics.Rank   // nil unless RANKTREE_METRICS_ADDR (metrics.go)
	metricsSrv *metrics.Server // serves metrics; closed with the store
}

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
	r, err := initRuntime(ctx, opts...)
	if err != nil {
		recordError(err)
	}
	return r, err
}

// initRuntime is Init without the error file.
func initRuntime(ctx context.Context, opts ...Option) (*Runtime, error) {
	c := &config{timeout: store.DefaultTimeout}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(c); err != nil {
			return nil, err
		}
	}
	e, err := readEnv(os.LookupEnv)
	if err != nil {
		return nil, err
	}
	if err := c.merge(e); err != nil {
		return nil, err
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	base := zerolog.New(os.Stderr).Level(zerolog.InfoLevel).With().Timestamp().Logger()
	if c.log != nil {
		base = *c.log
	}
	r := &Runtime{
		rank: c.rank, worldSize: c.worldSize, localRank: c.localRank,
		localWorldSize: c.localWorldSize, nodeRank: c.nodeRank, restartCount: c.restartCount,
		job: c.job, timeout: c.timeout,
		log: base.With().Str("job", c.job).Int("rank", c.rank).Int("world_size", c.worldSize).
			Int("local_rank", c.localRank).Int("restart", c.restartCount).Logger(),
		done: make(chan struct{}),
	}
	if addr := c.env.MetricsAddr; addr != "" {
		if err := r.startMetrics(addr, c.env.MetricsAddrFile); err != nil {
			return nil, err
		}
	}
	if c.store != nil {
		r.jobStore = c.store
	} else {
		ns, err := natsstore.Dial(ctx, natsstore.Options{
			URL: c.natsURL, Job: c.job,
			Credentials: c.creds,
			Timeout:     c.timeout,
			Name:        fmt.Sprintf("ranktree/%s/rank-%d", c.job, c.rank),
			Log:         r.log,
		}, natsstore.DialPolicy{WaitWhenRefused: c.storeWait})
		if err != nil {
			r.stopMetrics()
			return nil, fmt.Errorf("ranktree: rank %d: connecting the job store: %w", c.rank, err)
		}
		r.jobStore, r.ownsStore, r.nc = ns, true, ns.Conn()
	}
	r.st = store.WithPrefix(r.jobStore, fmt.Sprintf("restart/%d/", c.restartCount))
	start := time.Now()
	// Waiting for the other ranks ends early when one is reported dead.
	ictx, stop := context.WithCancelCause(ctx)
	dw := watchDeadRanks(ictx, r.st, c.rank, stop, r.log)
	stopWatch := func() { stop(nil); dw.wait() }
	if err := store.Barrier(ictx, r.st, r.initBarrierKey(c), c.rank, c.worldSize, c.timeout); err != nil {
		stopWatch()
		r.teardownStore()
		return nil, initError(c.rank, "init barrier", dw.snapshot(), err)
	}
	if err := r.initGroups(ictx, c); err != nil {
		stopWatch()
		r.teardownStore()
		return nil, initError(c.rank, "creating the default process group", dw.snapshot(), err)
	}
	stopWatch()
	r.log.Info().Dur("barrier", time.Since(start)).Msg("ranktree initialized")
	return r, nil
}

// Rank is the global rank, 0 ≤ Rank < WorldSize.
func (r *Runtime) Rank() int { return r.rank }

// WorldSize is the number of ranks in the job.
func (r *Runtime) WorldSize() int { return r.worldSize }

// LocalRank is the rank within this node (device index by convention).
func (r *Runtime) LocalRank() int { return r.localRank }

// LocalWorldSize is the number of ranks on this node.
func (r *Runtime) LocalWorldSize() int { return r.localWorldSize }

// NodeRank is the index of this rank's node among the job's nodes
// (torchrun's GROUP_RANK; rankrunner's --node-rank). It is not a rank in a
// process group: comm.ProcessGroup.Rank is that.
func (r *Runtime) NodeRank() int { return r.nodeRank }

// Job is the job id.
func (r *Runtime) Job() string { return r.job }

// RestartCount is the restart attempt (0 for the first).
func (r *Runtime) RestartCount() int { return r.restartCount }

// Timeout is the store and init-barrier timeout.
func (r *Runtime) Timeout() time.Duration { return r.timeout }

// Store is the job store scoped to this attempt ("restart/<n>/"): keys of
// a previous attempt are invisible, so a restarted job never reads stale
// rendezvous data.
func (r *Runtime) Store() store.Store { return r.st }

// JobStore is the job's whole (unprefixed) store, shared by all attempts.
func (r *Runtime) JobStore() store.Store { return r.jobStore }

// NATS is the control-plane connection (for event publishing); nil when
// Init was given WithStore.
func (r *Runtime) NATS() *nats.Conn { return r.nc }

// Logger is the rank's logger, with job, rank, world_size, local_rank and
// restart fields.
func (r *Runtime) Logger() zerolog.Logger { return r.log }

// onClose registers f to run at Close (in reverse registration order,
// before the store closes). It reports false if the runtime is closed.
func (r *Runtime) onClose(f func(context.Context) error) bool {
	r.closeMu.Lock()
	defer r.closeMu.Unlock()
	if r.closed {
		return false
	}
	r.closers = append(r.closers, f)
	return true
}

// Close leaves the job: it runs the registered teardown (process groups),
// then closes the store view and, if Init opened it, the NATS store and
// connection. It is idempotent and bounded: it returns by ctx's deadline
// (30 s if ctx has none) even if teardown hangs, with an error saying so;
// later calls return the first call's result.
func (r *Runtime) Close(ctx context.Context) error {
	r.closeMu.Lock()
	first := !r.closed
	r.closed = true
	closers := r.closers
	r.closers = nil
	r.closeMu.Unlock()
	if first {
		go func() {
			var errs []error
			for i := len(closers) - 1; i >= 0; i-- {
				if err := closers[i](ctx); err != nil {
					errs = append(errs, err)
				}
			}
			if err := r.teardownStore(); err != nil {
				errs = append(errs, err)
			}
			r.closeMu.Lock()
			r.closeErr = errors.Join(errs...)
			r.closeMu.Unlock()
			close(r.done)
		}()
	}
	bound := ctx
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		bound, cancel = context.WithTimeout(ctx, defaultCloseBound)
		defer cancel()
	}
	select {
	case <-r.done:
		r.closeMu.Lock()
		defer r.closeMu.Unlock()
		if first && r.closeErr == nil {
			r.log.Info().Msg("ranktree closed")
		}
		return r.closeErr
	case <-bound.Done():
		return fmt.Errorf("ranktree: rank %d: Close did not finish: %w", r.rank, bound.Err())
	}
}

func (r *Runtime) teardownStore() error {
	r.stopMetrics()
	var err error
	if r.st != nil {
		err = r.st.Close()
	}
	if r.ownsStore {
		err = errors.Join(err, r.jobStore.Close())
	}
	return err
}
