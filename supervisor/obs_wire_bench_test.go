package supervisor

import "github.com/ranktree/ranktree/internal/metrics"

// obsWire feeds m (nil: none) from the watchdog as a rank does.
func obsWire(cfg *WatchdogConfig, m *metrics.Rank) {
	if m != nil {
		cfg.Metrics = m
	}
}
