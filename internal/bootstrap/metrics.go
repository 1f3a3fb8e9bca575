package bootstrap

import (
	"fmt"
	"os"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/internal/metrics"
	"github.com/ranktree/ranktree/reducer"
	"github.com/ranktree/ranktree/supervisor"
)

// startMetrics serves this rank's Prometheus metrics on addr
// (RANKTREE_METRICS_ADDR) before anything else starts, so an address that
// cannot be bound fails Init at once with a *metrics.BindError naming it.
// With RANKTREE_METRICS_ADDR_FILE set, the address actually bound is
// written there (rankrunner relays the ranks' metrics from it).
func (r *Rank) startMetrics(addr, addrFile string) error {
	m := metrics.NewRank(r.Job, r.Rank)
	srv, err := metrics.Serve(addr, m.Registry())
	if err != nil {
		return fmt.Errorf("ranktree: rank %d: %s: %w", r.Rank, metrics.EnvAddr, err)
	}
	if f := addrFile; f != "" {
		if err := os.WriteFile(f, []byte(srv.Addr()), 0o644); err != nil {
			_ = srv.Close()
			return fmt.Errorf("ranktree: rank %d: %s: %w", r.Rank, metrics.EnvAddrFile, err)
		}
	}
	r.metrics, r.metricsSrv = m, srv
	r.Log.Info().Str("addr", srv.Addr()).Msg("serving Prometheus metrics at /metrics")
	return nil
}

// metricsTap is the event tap feeding the rank's metrics from its events
// (nil without metrics): engine labels, timeouts, aborts, restarts.
func (r *Rank) metricsTap() func(*actors.Event) {
	if r.metrics == nil {
		return nil
	}
	return r.metrics.Observe
}

// workMetrics is what the watchdog feeds with every Work's outcome (nil
// without metrics): the rank's Work series, exact, while Work events are
// sampled.
func (r *Rank) workMetrics() supervisor.WorkMetrics {
	if r.metrics == nil {
		return nil
	}
	return r.metrics
}

// stopMetrics stops serving metrics (idempotent).
func (r *Rank) stopMetrics() {
	if r.metricsSrv != nil {
		_ = r.metricsSrv.Close()
		r.metricsSrv = nil
	}
}

// RegisterReducerMetrics is ranktree.Runtime.RegisterReducerMetrics: it
// adds stats to the rank's metrics (a no-op without RANKTREE_METRICS_ADDR).
func (r *Rank) RegisterReducerMetrics(stats func() reducer.Stats) error {
	if r.metrics == nil {
		return nil
	}
	if stats == nil {
		return fmt.Errorf("ranktree: rank %d: RegisterReducerMetrics: nil stats", r.Rank)
	}
	if err := r.metrics.AddReducer(stats); err != nil {
		return fmt.Errorf("ranktree: rank %d: RegisterReducerMetrics: %w", r.Rank, err)
	}
	return nil
}
