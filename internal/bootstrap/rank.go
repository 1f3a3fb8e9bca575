package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
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

// Rank is what Start builds for one rank: its identity (from Config), the
// job's store, its process groups and its metrics. ranktree.Runtime is
// its public face; the exported fields are set by Start and read-only
// after it.
type Rank struct {
	Rank, WorldSize, LocalRank, LocalWorldSize, NodeRank, RestartCount int
	Job                                                                string
	Timeout                                                            time.Duration // store and init-barrier timeout
	Log                                                                zerolog.Logger

	JobStore    store.Store        // the job's whole key space
	Store       *store.PrefixStore // JobStore under "restart/<n>/"
	NATS        *nats.Conn         // nil when WithStore was used
	Groups      *groups.Manager    // the rank's process groups; closed by Close
	Incarnation uint32             // earlier Inits of the same job and rank in this process

	ownsStore bool // Start connected JobStore; Close closes it

	closeMu  sync.Mutex
	closers  []func(context.Context) error // run in reverse order by Close, before the store closes
	closed   bool
	closeErr error
	done     chan struct{} // closed when teardown finished

	metrics    *metrics.Rank   // nil unless RANKTREE_METRICS_ADDR (metrics.go)
	metricsSrv *metrics.Server // serves metrics; closed with the store
}

// Start is ranktree.Init: it applies opts, merges the env contract read
// through lookup, connects the store, passes the init barrier while
// watching for dead ranks and starts the process groups. A failing Start
// writes its error to $RANKTREE_ERROR_FILE when set (recordError).
func Start(ctx context.Context, lookup func(string) (string, bool), opts ...Option) (*Rank, error) {
	r, err := start(ctx, lookup, opts)
	if err != nil {
		recordError(err)
	}
	return r, err
}

// configure builds the validated Config from opts and the environment.
func configure(lookup func(string) (string, bool), opts []Option) (*Config, error) {
	c := &Config{}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(c); err != nil {
			return nil, err
		}
	}
	e, err := readEnv(lookup)
	if err != nil {
		return nil, err
	}
	if err := c.merge(e); err != nil {
		return nil, err
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// start is Start without the error file.
func start(ctx context.Context, lookup func(string) (string, bool), opts []Option) (*Rank, error) {
	c, err := configure(lookup, opts)
	if err != nil {
		return nil, err
	}
	base := zerolog.New(os.Stderr).Level(zerolog.InfoLevel).With().Timestamp().Logger()
	if c.log != nil {
		base = *c.log
	}
	r := &Rank{
		Rank: c.rank, WorldSize: c.worldSize, LocalRank: c.localRank,
		LocalWorldSize: c.localWorldSize, NodeRank: c.nodeRank, RestartCount: c.restartCount,
		Job: c.job, Timeout: c.timeout,
		Log: base.With().Str("job", c.job).Int("rank", c.rank).Int("world_size", c.worldSize).
			Int("local_rank", c.localRank).Int("restart", c.restartCount).Logger(),
		done: make(chan struct{}),
	}
	if addr := c.env.MetricsAddr; addr != "" {
		if err := r.startMetrics(addr, c.env.MetricsAddrFile); err != nil {
			return nil, err
		}
	}
	if err := r.connectStore(ctx, c); err != nil {
		r.stopMetrics()
		return nil, err
	}
	start := time.Now()
	if err := r.join(ctx, c); err != nil {
		r.teardownStore()
		return nil, err
	}
	r.Log.Info().Dur("barrier", time.Since(start)).Msg("ranktree initialized")
	return r, nil
}

// connectStore sets JobStore (WithStore's, or a NATS store dialled for the
// job) and Store, its view under "restart/<n>/".
func (r *Rank) connectStore(ctx context.Context, c *Config) error {
	if c.store != nil {
		r.JobStore = c.store
	} else {
		ns, err := natsstore.Dial(ctx, natsstore.Options{
			URL: c.natsURL, Job: c.job,
			Credentials: c.creds,
			Timeout:     c.timeout,
			Name:        fmt.Sprintf("ranktree/%s/rank-%d", c.job, c.rank),
			Log:         r.Log,
		}, natsstore.DialPolicy{WaitWhenRefused: c.storeWait})
		if err != nil {
			return fmt.Errorf("ranktree: rank %d: connecting the job store: %w", c.rank, err)
		}
		r.JobStore, r.ownsStore, r.NATS = ns, true, ns.Conn()
	}
	r.Store = store.WithPrefix(r.JobStore, fmt.Sprintf("restart/%d/", c.restartCount))
	return nil
}

// join passes the init barrier and starts the process groups, both while
// watching the attempt's dead-rank records; an error is an *InitError.
func (r *Rank) join(ctx context.Context, c *Config) error {
	// Waiting for the other ranks ends early when one is reported dead.
	ictx, stop := context.WithCancelCause(ctx)
	dw := watchDeadRanks(ictx, r.Store, c.rank, stop, r.Log)
	defer func() { stop(nil); dw.wait() }()
	if err := store.Barrier(ictx, r.Store, r.initBarrierKey(c), c.rank, c.worldSize, c.timeout); err != nil {
		return initError(c.rank, "init barrier", dw.snapshot(), err)
	}
	if err := r.startGroups(ictx, c); err != nil {
		return initError(c.rank, "creating the default process group", dw.snapshot(), err)
	}
	return nil
}

// initBarrierKey picks this Init's incarnation and returns the key of its
// init barrier: InitBarrierKey for the first, "init.<k>" after.
func (r *Rank) initBarrierKey(c *Config) string {
	k := groups.NextIncarnation(fmt.Sprintf("%p|%s|%s|%d", c.store, c.natsURL, c.job, c.rank), c.store)
	r.Incarnation = k
	if k == 0 {
		return InitBarrierKey
	}
	return InitBarrierKey + "." + strconv.FormatUint(uint64(k), 10)
}

// onClose registers f to run at Close (in reverse registration order,
// before the store closes). It reports false if the rank is closed.
func (r *Rank) onClose(f func(context.Context) error) bool {
	r.closeMu.Lock()
	defer r.closeMu.Unlock()
	if r.closed {
		return false
	}
	r.closers = append(r.closers, f)
	return true
}

// Close is ranktree.Runtime.Close: the registered teardown (process
// groups), then the store view and, if Start opened it, the NATS store.
// Idempotent, and bounded by ctx's deadline (defaultCloseBound without).
func (r *Rank) Close(ctx context.Context) error {
	r.closeMu.Lock()
	first := !r.closed
	r.closed = true
	closers := r.closers
	r.closers = nil
	r.closeMu.Unlock()
	if first {
		go r.teardown(ctx, closers)
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
			r.Log.Info().Msg("ranktree closed")
		}
		return r.closeErr
	case <-bound.Done():
		return fmt.Errorf("ranktree: rank %d: Close did not finish: %w", r.Rank, bound.Err())
	}
}

// teardown runs closers in reverse order, then closes the store; it
// records the joined error and closes done.
func (r *Rank) teardown(ctx context.Context, closers []func(context.Context) error) {
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
}

func (r *Rank) teardownStore() error {
	r.stopMetrics()
	var err error
	if r.Store != nil {
		err = r.Store.Close()
	}
	if r.ownsStore {
		err = errors.Join(err, r.JobStore.Close())
	}
	return err
}
