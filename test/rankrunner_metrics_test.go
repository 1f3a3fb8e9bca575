package test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	dto "github.com/prometheus/client_model/go"
)

// rrScrape reads and parses http://addr/metrics.
func rrScrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("scrape: %v\n%s", err, body)
	}
	return fams
}

// rrValue is the value of the series of family name whose labels include
// want (counter, gauge, or a histogram's sample count); -1 if absent.
func rrValue(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	return -1
}

// TestRankrunnerMetrics: `rankrunner --metrics-addr` serves, while the job
// runs, the runner's series and its ranks' relayed ones, and the ranks'
// counters match the ops they did: N allreduces of 16 bytes each on
// group "default_pg" (the world group) started, completed, none failed or in flight, N latency
// samples in the 1KiB size class, 16·N bytes.
func TestRankrunnerMetrics(t *testing.T) {
	t.Parallel()
	const n = 40
	prog := rrBuildProg(t, "metricsprog")
	dir := t.TempDir()
	addr := fmt.Sprintf("127.0.0.1:%d", rrFreePort(t))
	p := rrStartRunner(t, "--nproc-per-node", "2", "--job-id", "metricsjob", "--metrics-addr", addr, prog, dir, fmt.Sprint(n))
	rrWaitReady(t, p, dir, 2)
	// The watchdog reports completions at its tick: wait for them.
	var fams map[string]*dto.MetricFamily
	for end := time.Now().Add(15 * time.Second); ; {
		fams = rrScrape(t, addr)
		done := true
		for r := 0; r < 2; r++ {
			if rrValue(fams, "ranktree_collectives_completed_total", map[string]string{"rank": fmt.Sprint(r), "op": "ALLREDUCE", "group": "default_pg"}) != n {
				done = false
			}
		}
		if done || time.Now().After(end) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for r := 0; r < 2; r++ {
		l := map[string]string{"job": "metricsjob", "rank": fmt.Sprint(r), "op": "ALLREDUCE", "group": "default_pg"}
		for _, c := range []struct {
			name string
			want float64
		}{
			{"ranktree_collectives_started_total", n},
			{"ranktree_collectives_completed_total", n},
			{"ranktree_collectives_in_flight", 0},
			{"ranktree_collective_bytes_total", 16 * n},
		} {
			if got := rrValue(fams, c.name, l); got != c.want {
				t.Errorf("rank %d %s = %v, want %v", r, c.name, got, c.want)
			}
		}
		if got := rrValue(fams, "ranktree_collective_bytes_total", map[string]string{"rank": fmt.Sprint(r), "op": "ALLREDUCE", "engine": "cpu", "transport": "shm"}); got != 16*n {
			t.Errorf("rank %d: %v bytes under engine=\"cpu\" transport=\"shm\", want %d", r, got, 16*n)
		}
		if got := rrValue(fams, "ranktree_collectives_failed_total", l); got > 0 {
			t.Errorf("rank %d: %v failed ops", r, got)
		}
		if got := rrValue(fams, "ranktree_collective_duration_seconds", map[string]string{"rank": fmt.Sprint(r), "op": "ALLREDUCE", "size": "1KiB"}); got != n {
			t.Errorf("rank %d: %v latency samples in the 1KiB class, want %d", r, got, n)
		}
	}
	if got := rrValue(fams, "ranktree_runner_ranks_alive", map[string]string{"job": "metricsjob"}); got != 2 {
		t.Errorf("ranks_alive = %v, want 2", got)
	}
	if got := rrValue(fams, "ranktree_runner_restarts_used", nil); got != 0 {
		t.Errorf("restarts_used = %v, want 0", got)
	}
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if c := p.wait(t, 60*time.Second); c != 0 {
		t.Fatalf("rankrunner exit code %d", c)
	}
}

// TestRankrunnerMetricsAddrBusy: a --metrics-addr that cannot be bound
// stops rankrunner at start with an error naming the address; no rank runs.
func TestRankrunnerMetricsAddrBusy(t *testing.T) {
	t.Parallel()
	_, prog := rrBuild(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	addr := l.Addr().String()
	p := rrStartRunner(t, "--nproc-per-node", "2", "--metrics-addr", addr, prog, "ok")
	if c := p.wait(t, 30*time.Second); c != 2 {
		t.Errorf("exit code %d, want 2", c)
	}
	if out := p.stderr.String(); !strings.Contains(out, addr) || !strings.Contains(out, "--metrics-addr") {
		t.Errorf("stderr does not name the flag and address %s:\n%s", addr, out)
	}
	if strings.Contains(p.stdout.String()+p.stderr.String(), "[rank ") {
		t.Errorf("a rank ran although the metrics address was busy")
	}
}

// TestRankrunnerMetricsFaults: an allreduce that rank 1 never joins times
// out on rank 0 (CleanupOnly keeps both alive); the scraped counters match
// what happened: rank 0 has one failed ALLREDUCE, one watchdog timeout and
// one abort sent; rank 1 one abort received; nothing is left in flight.
func TestRankrunnerMetricsFaults(t *testing.T) {
	t.Parallel()
	const n = 5
	prog := rrBuildProg(t, "metricsprog")
	dir := t.TempDir()
	addr := fmt.Sprintf("127.0.0.1:%d", rrFreePort(t))
	p := rrStartRunnerEnv(t, []string{"RANKTREE_ASYNC_ERROR_HANDLING=CleanupOnly"}, "--nproc-per-node", "2", "--job-id", "metricsfault",
		"--timeout", "1s", "--metrics-addr", addr, prog, dir, fmt.Sprint(n), "hang")
	rrWaitReady(t, p, dir, 2)
	type want struct {
		rank  string
		name  string
		extra map[string]string
		value float64
	}
	wants := []want{
		{"0", "ranktree_collectives_completed_total", map[string]string{"op": "ALLREDUCE"}, n},
		{"0", "ranktree_collectives_failed_total", map[string]string{"op": "ALLREDUCE"}, 1},
		{"0", "ranktree_collectives_in_flight", map[string]string{"op": "ALLREDUCE"}, 0},
		{"0", "ranktree_watchdog_timeouts_total", nil, 1},
		{"0", "ranktree_aborts_sent_total", nil, 1},
		{"1", "ranktree_collectives_completed_total", map[string]string{"op": "ALLREDUCE"}, n},
		{"1", "ranktree_aborts_received_total", nil, 1},
	}
	var bad []string
	for end := time.Now().Add(20 * time.Second); ; {
		fams := rrScrape(t, addr)
		bad = bad[:0]
		for _, w := range wants {
			l := map[string]string{"rank": w.rank, "group": "default_pg"}
			for k, v := range w.extra {
				l[k] = v
			}
			if got := rrValue(fams, w.name, l); got != w.value {
				bad = append(bad, fmt.Sprintf("rank %s %s = %v, want %v", w.rank, w.name, got, w.value))
			}
		}
		if len(bad) == 0 || time.Now().After(end) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, b := range bad {
		t.Error(b)
	}
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p.wait(t, 60*time.Second)
}

// TestRankrunnerMetricsRestart: rank 1 fails the job's first attempt and
// rankrunner (--max-restarts 1) restarts it; while the second attempt runs,
// the runner's metrics show one failed attempt, one restart used of a
// budget of 1, and 2 ranks alive.
func TestRankrunnerMetricsRestart(t *testing.T) {
	t.Parallel()
	prog := rrBuildProg(t, "metricsprog")
	dir := t.TempDir()
	addr := fmt.Sprintf("127.0.0.1:%d", rrFreePort(t))
	p := rrStartRunner(t, "--nproc-per-node", "2", "--job-id", "metricsrestart", "--max-restarts", "1", "--failure-grace", "0",
		"--metrics-addr", addr, prog, dir, "3", "failfirst")
	rrWaitReady(t, p, dir, 2)
	fams := rrScrape(t, addr)
	job := map[string]string{"job": "metricsrestart"}
	for _, c := range []struct {
		name  string
		extra map[string]string
		want  float64
	}{
		{"ranktree_runner_attempts_total", map[string]string{"outcome": "failed"}, 1},
		{"ranktree_runner_restarts_used", nil, 1},
		{"ranktree_runner_restart_budget", nil, 1},
		{"ranktree_runner_ranks_alive", nil, 2},
	} {
		l := map[string]string{}
		for k, v := range job {
			l[k] = v
		}
		for k, v := range c.extra {
			l[k] = v
		}
		if got := rrValue(fams, c.name, l); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.extra, got, c.want)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if c := p.wait(t, 60*time.Second); c != 0 {
		t.Errorf("rankrunner exited %d after the restarted attempt", c)
	}
}

// rrWaitReady waits (90 s at most) until ranks 0..n-1 of a metricsprog job
// wrote dir/ready-<rank>; it fails the test if rankrunner exits first.
func rrWaitReady(t *testing.T, p *rrProc, dir string, n int) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for r := 0; r < n; r++ {
		for {
			if _, err := os.Stat(filepath.Join(dir, fmt.Sprintf("ready-%d", r))); err == nil {
				break
			}
			select {
			case <-p.done:
				t.Fatalf("rankrunner exited %d before rank %d was ready; stderr:\n%s", p.code, r, p.stderr.String())
			case <-time.After(50 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("rank %d not ready", r)
			}
		}
	}
}
