package launcher

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ranktree/ranktree/internal/metrics"
)

// runnerMetrics are the runner's own Prometheus series (docs/metrics.md)
// and the relay of its ranks' metrics, served at Config.MetricsAddr.
type runnerMetrics struct {
	reg          *prometheus.Registry
	ranksAlive   prometheus.Gauge
	restartsUsed prometheus.Gauge
	budget       prometheus.Gauge
	attempts     *prometheus.CounterVec
	srv          *metrics.Server

	mu    sync.Mutex
	files map[int]string // global rank → its RANKTREE_METRICS_ADDR_FILE (this attempt)
	dir   string
}

// startMetrics binds cfg.MetricsAddr before anything else starts (a
// *metrics.BindError naming the address otherwise) and serves the
// runner's series plus, relayed, those of its live ranks.
func (r *runner) startMetrics() error {
	if r.cfg.MetricsAddr == "" {
		return nil
	}
	cl := prometheus.Labels{"job": r.cfg.JobID, "node_rank": strconv.Itoa(r.cfg.NodeRank)}
	m := &runnerMetrics{reg: prometheus.NewRegistry(), files: map[int]string{}}
	m.ranksAlive = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "ranktree", Subsystem: "runner", Name: "ranks_alive",
		Help: "Rank processes of this runner that are running.", ConstLabels: cl})
	m.restartsUsed = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "ranktree", Subsystem: "runner", Name: "restarts_used",
		Help: "Job restarts used so far (RANKTREE_RESTART_COUNT of the current attempt).", ConstLabels: cl})
	m.budget = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "ranktree", Subsystem: "runner", Name: "restart_budget",
		Help: "The job's restart budget (--max-restarts, as stored for the job).", ConstLabels: cl})
	m.attempts = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ranktree", Subsystem: "runner", Name: "attempts_total",
		Help: "Attempts that ended, by outcome (succeeded, failed, interrupted).", ConstLabels: cl}, []string{"outcome"})
	m.reg.MustRegister(m.ranksAlive, m.restartsUsed, m.budget, m.attempts,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	dir, err := os.MkdirTemp("", "rankrunner-metrics-")
	if err != nil {
		return fmt.Errorf("launcher: --metrics-addr: %w", err)
	}
	m.dir = dir
	srv, err := metrics.Serve(r.cfg.MetricsAddr, prometheus.Gatherers{m.reg, prometheus.GathererFunc(m.gatherRanks)})
	if err != nil {
		_ = os.RemoveAll(dir)
		return &FlagError{Flag: "--metrics-addr", Msg: err.Error()}
	}
	m.srv = srv
	r.metrics = m
	r.addCleanup(func() { _ = srv.Close(); _ = os.RemoveAll(dir) })
	r.log.Info().Str("addr", srv.Addr()).Msg("serving Prometheus metrics at /metrics (runner and ranks)")
	return nil
}

// rankEnv is the metrics part of a rank's environment for attempt n: the
// rank listens on a free loopback port and writes it to a file the runner
// reads to relay its metrics.
func (m *runnerMetrics) rankEnv(n, rank int) []string {
	if m == nil {
		return nil
	}
	f := filepath.Join(m.dir, fmt.Sprintf("attempt%d-rank%d.addr", n, rank))
	_ = os.Remove(f)
	m.mu.Lock()
	m.files[rank] = f
	m.mu.Unlock()
	return []string{metrics.EnvAddr + "=127.0.0.1:0", metrics.EnvAddrFile + "=" + f}
}

// rankStarted and rankExited keep ranks_alive.
func (m *runnerMetrics) rankStarted() {
	if m != nil {
		m.ranksAlive.Inc()
	}
}

func (m *runnerMetrics) rankExited() {
	if m != nil {
		m.ranksAlive.Dec()
	}
}

// attempt records the start of attempt n (restarts used) and budget.
func (m *runnerMetrics) attempt(n, budget int) {
	if m != nil {
		m.restartsUsed.Set(float64(n))
		m.budget.Set(float64(budget))
	}
}

// ended counts an attempt's outcome.
func (m *runnerMetrics) ended(k OutcomeKind) {
	if m != nil {
		m.attempts.WithLabelValues(k.String()).Inc()
	}
}

// gatherRanks scrapes every rank that published its address (1 s each, in
// parallel); a rank that is gone or slow is left out of this scrape.
func (m *runnerMetrics) gatherRanks() ([]*dto.MetricFamily, error) {
	m.mu.Lock()
	files := make([]string, 0, len(m.files))
	for _, f := range m.files {
		files = append(files, f)
	}
	m.mu.Unlock()
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		out []*dto.MetricFamily
	)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil || len(b) == 0 {
			continue
		}
		addr := strings.TrimSpace(string(b))
		wg.Go(func() {
			fams, err := scrape(addr)
			if err != nil {
				return
			}
			mu.Lock()
			out = append(out, fams...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return out, nil
}

// scrape reads one rank's /metrics, keeping only ranktree_* families (the
// ranks' Go runtime series would clash with the runner's own).
func scrape(addr string) ([]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	out := make([]*dto.MetricFamily, 0, len(fams))
	for name, f := range fams {
		if strings.HasPrefix(name, "ranktree_") {
			out = append(out, f)
		}
	}
	return out, nil
}
