package metrics

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ranktree/ranktree/actors"
)

func work(group, op, state string, count int64, durUS float64) *actors.Event {
	return &actors.Event{Kind: actors.KindWork, Group: group, Op: op, State: state, DType: "float32", Count: count, DurUS: durUS}
}

// TestRankObserve: events move the counters, gauge and histogram exactly.
func TestRankObserve(t *testing.T) {
	m := NewRank("j", 2)
	m.Observe(&actors.Event{Kind: actors.KindCommInit, Group: "world", Detail: map[string]string{"engine": "cpu", "transport": "tcp"}})
	for i := 0; i < 3; i++ {
		m.Observe(work("world", "ALLREDUCE", actors.StateScheduled, 1, 0))
		m.Observe(work("world", "ALLREDUCE", actors.StateStarted, 1, 0))
	}
	m.Observe(work("world", "ALLREDUCE", actors.StateCompleted, 1, 5))        // 4 B
	m.Observe(work("world", "ALLREDUCE", actors.StateCompleted, 1<<20, 2000)) // 4 MiB
	m.Observe(work("world", "ALLREDUCE", actors.StateFailed, 1, 0))
	m.Observe(&actors.Event{Kind: actors.KindWatchdog, Group: "world", Action: "timeout"})
	m.Observe(&actors.Event{Kind: actors.KindWatchdog, Group: "world", Action: "write_abort"})
	m.Observe(&actors.Event{Kind: actors.KindCommAbort, Group: "world", Action: "abort", Error: "comm: timeout"})
	m.Observe(&actors.Event{Kind: actors.KindCommAbort, Group: "world", Action: "abort", Error: remoteAbortPrefix + " 1: x"})
	m.Observe(&actors.Event{Kind: actors.KindRestart, Group: "world", Epoch: 1, Action: "restart"})
	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"started", testutil.ToFloat64(m.started.WithLabelValues("world", "ALLREDUCE")), 3},
		{"completed", testutil.ToFloat64(m.completed.WithLabelValues("world", "ALLREDUCE")), 2},
		{"failed", testutil.ToFloat64(m.failed.WithLabelValues("world", "ALLREDUCE")), 1},
		{"in flight", testutil.ToFloat64(m.inflight.WithLabelValues("world", "ALLREDUCE")), 0},
		{"bytes", testutil.ToFloat64(m.bytes.WithLabelValues("world", "ALLREDUCE", "cpu", "tcp")), 4 + 4<<20},
		{"timeouts", testutil.ToFloat64(m.timeouts.WithLabelValues("world")), 1},
		{"aborts sent", testutil.ToFloat64(m.abortsSent.WithLabelValues("world")), 1},
		{"aborts received", testutil.ToFloat64(m.abortsRecvd.WithLabelValues("world")), 1},
		{"restarts", testutil.ToFloat64(m.restarts.WithLabelValues("world")), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if n := testutil.CollectAndCount(m.duration, "ranktree_collective_duration_seconds"); n != 5 {
		t.Errorf("%d duration series (one per size class of ALLREDUCE), want 5", n)
	}
	want := `
# HELP ranktree_collectives_completed_total Ops that completed successfully.
# TYPE ranktree_collectives_completed_total counter
ranktree_collectives_completed_total{group="world",job="j",op="ALLREDUCE",rank="2"} 2
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "ranktree_collectives_completed_total"); err != nil {
		t.Error(err)
	}
}

// TestServeBindError: a busy or malformed address is a *BindError naming
// it; a served registry answers /metrics.
func TestServeBindError(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, addr := range []string{l.Addr().String(), "nohost:notaport", ""} {
		_, err := Serve(addr, NewRank("j", 0).Registry())
		var be *BindError
		if !errors.As(err, &be) || be.Addr != addr || !strings.Contains(err.Error(), addr) {
			t.Errorf("Serve(%q) = %v, want a *BindError naming it", addr, err)
		}
	}
	m := NewRank("j", 0)
	m.Observe(work("world", "BARRIER", actors.StateScheduled, 0, 0))
	s, err := Serve("127.0.0.1:0", m.Registry())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	resp, err := http.Get("http://" + s.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `ranktree_collectives_in_flight{group="world",job="j",op="BARRIER",rank="0"} 1`) {
		t.Errorf("scrape lacks the in-flight gauge:\n%.2000s", body)
	}
}

// BenchmarkObserveCompleted is the metrics cost of one op's completion
// event (on the watchdog's goroutine, never the op's path).
func BenchmarkObserveCompleted(b *testing.B) {
	m := NewRank("j", 0)
	ev := work("world", "ALLREDUCE", actors.StateCompleted, 1, 3)
	m.Observe(ev)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m.Observe(ev)
	}
}
