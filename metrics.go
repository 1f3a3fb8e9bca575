package ranktree

import (
	"fmt"
	"os"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/internal/metrics"
	"github.com/ranktree/ranktree/reducer"
)

// EnvMetricsAddr names the variable with the address (host:port; port 0:
// any free port) where Init serves this rank's Prometheus metrics at
// /metrics (docs/metrics.md). Unset: no metrics are served.
const EnvMetricsAddr = metrics.EnvAddr

// MetricsBindError is returned by Init when EnvMetricsAddr cannot be
// listened on (in use, malformed, not local); it names the address, and
// Init has connected nothing yet. Use errors.As.
type MetricsBindError = metrics.BindError

// startMetrics serves this rank's Prometheus metrics on addr
// (RANKTREE_METRICS_ADDR) before anything else starts, so an address that
// cannot be bound fails Init at once with a *metrics.BindError naming it.
// With RANKTREE_METRICS_ADDR_FILE set, the address actually bound is
// written there (rankrunner relays the ranks' metrics from it).
func (r *Runtime) startMetrics(addr, addrFile string) error {
	m := metrics.NewRank(r.job, r.rank)
	srv, err := metrics.Serve(addr, m.Registry())
	if err != nil {
		return fmt.Errorf("ranktree: rank %d: %s: %w", r.rank, metrics.EnvAddr, err)
	}
	if f := addrFile; f != "" {
		if err := os.WriteFile(f, []byte(srv.Addr()), 0o644); err != nil {
			_ = srv.Close()
			return fmt.Errorf("ranktree: rank %d: %s: %w", r.rank, metrics.EnvAddrFile, err)
		}
	}
	r.metrics, r.metricsSrv = m, srv
	r.log.Info().Str("addr", srv.Addr()).Msg("serving Prometheus metrics at /metrics")
	return nil
}

// metricsTap is the event tap feeding the rank's metrics (nil without).
func (r *Runtime) metricsTap() func(*actors.Event) {
	if r.metrics == nil {
		return nil
	}
	return r.metrics.Observe
}

// stopMetrics stops serving metrics (idempotent).
func (r *Runtime) stopMetrics() {
	if r.metricsSrv != nil {
		_ = r.metricsSrv.Close()
		r.metricsSrv = nil
	}
}

// RegisterReducerMetrics adds a DDP reducer's figures to this rank's
// Prometheus metrics (docs/metrics.md: ranktree_reducer_buckets,
// ranktree_reducer_bucket_bytes, ranktree_reducer_iterations_total,
// ranktree_reducer_overlap_ratio: the fraction of allreduce time hidden
// behind backward, ranktree_reducer_wait_seconds), read from stats
// (pass (*reducer.Reducer).Stats) at each scrape. Without
// RANKTREE_METRICS_ADDR it does nothing and returns nil; a second reducer
// on the same rank is an error.
func (r *Runtime) RegisterReducerMetrics(stats func() reducer.Stats) error {
	if r.metrics == nil {
		return nil
	}
	if stats == nil {
		return fmt.Errorf("ranktree: rank %d: RegisterReducerMetrics: nil stats", r.rank)
	}
	if err := r.metrics.AddReducer(stats); err != nil {
		return fmt.Errorf("ranktree: rank %d: RegisterReducerMetrics: %w", r.rank, err)
	}
	return nil
}
