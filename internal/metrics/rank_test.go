package metrics

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
)

func work(group, op, state string, count int64, durUS float64) *actors.Event {
	return &actors.Event{Kind: actors.KindWork, Group: group, Op: op, State: state, DType: "float32", Count: count, DurUS: durUS}
}

// fp is the fingerprint of an ALLREDUCE of count float32s.
func fp(count int64) comm.Fingerprint {
	return comm.Fingerprint{Op: comm.OpAllReduce, DType: comm.Float32, Count: count}
}

// TestRankObserve: the watchdog's Work calls and the events move the
// counters, gauge and histogram exactly, once flushed; Work events (which
// are sampled) move nothing.
func TestRankObserve(t *testing.T) {
	m := NewRank("j", 2)
	m.Observe(&actors.Event{Kind: actors.KindCommInit, Group: "world", Detail: map[string]string{"engine": "cpu", "transport": "tcp"}})
	for i := 0; i < 3; i++ {
		m.WorkScheduled("world", comm.OpAllReduce)
	}
	m.WorkDone("world", fp(1), 5*time.Microsecond, nil)        // 4 B
	m.WorkDone("world", fp(1<<20), 2*time.Millisecond, nil)    // 4 MiB
	m.WorkDone("world", fp(1), 0, errors.New("comm: timeout")) // failed
	if got := testutil.ToFloat64(m.started.WithLabelValues("world", "ALLREDUCE")); got != 0 {
		t.Errorf("started = %v before the flush, want 0", got)
	}
	m.FlushWorks()
	m.WorkScheduled("world", comm.OpAllReduce) // in flight after the next flush
	m.Observe(work("world", "ALLREDUCE", actors.StateScheduled, 1, 0))
	m.Observe(work("world", "ALLREDUCE", actors.StateCompleted, 1, 5))
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
		{"scheduled in the next flush", float64(m.works.last.scheduled), 1},
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
	hist := `
# HELP ranktree_collective_duration_seconds Time from an op's start on the engine to its completion, by op type and message-size class.
# TYPE ranktree_collective_duration_seconds histogram
`
	for _, s := range []struct {
		size     string
		le4us    int // in the bucket ≤ 4 µs (none), ≤ 16 µs (the 5 µs op), ...
		le16us   int
		le2_1ms  int
		count    int
		sumFloat string
	}{{"16MiB", 0, 0, 0, 1, "0.002"}, {"1KiB", 0, 1, 1, 1, "5e-06"}, {"1MiB", 0, 0, 0, 0, "0"}, {"64KiB", 0, 0, 0, 0, "0"}, {"inf", 0, 0, 0, 0, "0"}} {
		cum := 0
		for i, b := range DurationBuckets {
			switch {
			case s.size == "1KiB" && i == 2: // 16 µs
				cum = 1
			case s.size == "16MiB" && i == 6: // 4.096 ms
				cum = 1
			}
			hist += fmt.Sprintf("ranktree_collective_duration_seconds_bucket{job=\"j\",op=\"ALLREDUCE\",rank=\"2\",size=%q,le=\"%g\"} %d\n", s.size, b, cum)
		}
		hist += fmt.Sprintf("ranktree_collective_duration_seconds_bucket{job=\"j\",op=\"ALLREDUCE\",rank=\"2\",size=%q,le=\"+Inf\"} %d\n", s.size, s.count)
		hist += fmt.Sprintf("ranktree_collective_duration_seconds_sum{job=\"j\",op=\"ALLREDUCE\",rank=\"2\",size=%q} %s\n", s.size, s.sumFloat)
		hist += fmt.Sprintf("ranktree_collective_duration_seconds_count{job=\"j\",op=\"ALLREDUCE\",rank=\"2\",size=%q} %d\n", s.size, s.count)
	}
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(hist), "ranktree_collective_duration_seconds"); err != nil {
		t.Error(err)
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
	m.WorkScheduled("world", comm.OpBarrier)
	m.FlushWorks()
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

// workMetricsTick is how many Works the benchmark and the allocation
// test count between two flushes (a watchdog tick at a high op rate).
const workMetricsTick = 10000

// BenchmarkWorkMetrics is the metrics cost of one Work as the watchdog
// pays it (on its goroutine, never the op's path): WorkScheduled and
// WorkDone, and a FlushWorks per workMetricsTick Works.
func BenchmarkWorkMetrics(b *testing.B) {
	m := NewRank("j", 0)
	f := fp(1)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		m.WorkScheduled("world", comm.OpAllReduce)
		m.WorkDone("world", f, 3*time.Microsecond, nil)
		if i%workMetricsTick == workMetricsTick-1 {
			m.FlushWorks()
		}
	}
}

// TestWorkMetricsAllocateNothing: counting Works and flushing them
// allocates nothing once the (group, op) has been seen (issue 15).
func TestWorkMetricsAllocateNothing(t *testing.T) {
	m := NewRank("j", 0)
	step := func() {
		for range 64 {
			m.WorkScheduled("world", comm.OpAllReduce)
			m.WorkDone("world", fp(1), 3*time.Microsecond, nil)
		}
		m.WorkScheduled("world", comm.OpBroadcast)
		m.WorkDone("world", fp(1<<20), time.Millisecond, errors.New("x"))
		m.FlushWorks()
	}
	step()
	if a := testing.AllocsPerRun(100, step); a != 0 {
		t.Fatalf("%v allocations per 65 Works counted and flushed, want 0", a)
	}
	if got := testutil.ToFloat64(m.completed.WithLabelValues("world", "ALLREDUCE")); got != 102*64 { // AllocsPerRun runs step once more to warm up
		t.Errorf("completed = %v, want %d", got, 102*64)
	}
}
