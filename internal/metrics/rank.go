// Package metrics exposes a job's Prometheus metrics (issue 18): per rank,
// collectives started/completed/failed by op type and process group, their
// latency by op type and message size, bytes moved, ops in flight,
// watchdog timeouts, aborts sent and received and communicator restarts;
// per runner, ranks alive, restarts used out of the budget and attempt
// outcomes. docs/metrics.md lists every series.
//
// The rank's metrics are fed from its watchdog, never from the
// collective's own path. The Work series (started, completed, failed, in
// flight, bytes, latency) count every Work exactly: the watchdog's pass
// over the Works it tracks calls WorkScheduled and WorkDone (Rank
// implements supervisor.WorkMetrics), which add to plain per-(group, op)
// tallies, and FlushWorks, once per watchdog tick, adds those to the
// series (BenchmarkWorkMetrics: a few ns per Work). The other series
// (timeouts, aborts, restarts, the engine and transport labels) come from
// the rank's events: Rank.Observe is the event publisher's tap, and
// ignores Work events, which are sampled.
package metrics

import (
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/reducer"
)

// EnvAddr names the environment variable with the address a rank serves
// its metrics on (host:port; port 0 picks a free one). rankrunner
// --metrics-addr sets it for its ranks.
const EnvAddr = "RANKTREE_METRICS_ADDR"

// EnvAddrFile names the environment variable with a file where the rank
// writes the address it actually listens on (rankrunner reads it to relay
// the rank's metrics).
const EnvAddrFile = "RANKTREE_METRICS_ADDR_FILE"

// SizeBuckets are the message-size classes of the latency histogram's
// "size" label: the op's buffer bytes rounded up to these bounds.
var SizeBuckets = []struct {
	Max   int64
	Label string
}{
	{1 << 10, "1KiB"}, {64 << 10, "64KiB"}, {1 << 20, "1MiB"}, {16 << 20, "16MiB"}, {1 << 62, "inf"},
}

// DurationBuckets are the latency histogram's bounds in seconds: 1 µs to
// about 100 s, ×4 per bucket (small allreduces take a few µs).
var DurationBuckets = prometheus.ExponentialBuckets(1e-6, 4, 14)

// Rank holds one rank's metrics. Observe is safe for concurrent use.
type Rank struct {
	job                               string
	rank                              int
	reg                               *prometheus.Registry
	started, completed, failed        *prometheus.CounterVec
	duration                          *durationHist
	bytes                             *prometheus.CounterVec
	inflight                          *prometheus.GaugeVec
	timeouts, abortsSent, abortsRecvd *prometheus.CounterVec
	restarts                          *prometheus.CounterVec

	mu      sync.Mutex
	ops     map[opKey]*opChildren
	grp     map[string]*groupChildren
	engines map[string][2]string // group → engine and transport, from comm_init events

	works works // the watchdog's tallies since its last FlushWorks (works.go)
}

type opKey struct{ group, op string }

// opChildren are the pre-resolved series of one (group, op).
type opChildren struct {
	started, completed, failed, bytes prometheus.Counter
	inflight                          prometheus.Gauge
}

// groupChildren are the pre-resolved series of one group.
type groupChildren struct {
	timeouts, abortsSent, abortsRecvd, restarts prometheus.Counter
}

// NewRank returns the metrics of rank in job, registered on a registry of
// their own (with the Go runtime and process collectors). Every series
// carries the constant labels job and rank.
func NewRank(job string, rank int) *Rank {
	cl := prometheus.Labels{"job": job, "rank": itoa(rank)}
	m := &Rank{job: job, rank: rank, reg: prometheus.NewRegistry(), ops: map[opKey]*opChildren{}, grp: map[string]*groupChildren{},
		engines: map[string][2]string{}}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "ranktree", Name: name, Help: help, ConstLabels: cl}, labels)
		m.reg.MustRegister(v)
		return v
	}
	m.started = counter("collectives_started_total", "Collectives and p2p ops scheduled on a communicator.", "group", "op")
	m.completed = counter("collectives_completed_total", "Ops that completed successfully.", "group", "op")
	m.failed = counter("collectives_failed_total", "Ops that failed (timeout, abort, engine error).", "group", "op")
	m.bytes = counter("collective_bytes_total", "Bytes of the ops' buffers (count × element size) of completed ops, by the group's engine (cpu, nccl) and transport (cpu: shm, tcp, shm+tcp for a multi-host group, inmem, self; nccl: nccl).", "group", "op", "engine", "transport")
	m.duration = newDurationHist(cl)
	m.reg.MustRegister(m.duration)
	m.inflight = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "ranktree", Name: "collectives_in_flight",
		Help: "Ops scheduled and not yet completed or failed.", ConstLabels: cl}, []string{"group", "op"})
	m.reg.MustRegister(m.inflight)
	m.timeouts = counter("watchdog_timeouts_total", "Ops the watchdog failed for passing their deadline.", "group")
	m.abortsSent = counter("aborts_sent_total", "Abort records this rank wrote to the store for its peers.", "group")
	m.abortsRecvd = counter("aborts_received_total", "Communicator aborts caused by a peer's abort record.", "group")
	m.restarts = counter("communicator_restarts_total", "Communicators re-created under a new epoch.", "group")
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func itoa(i int) string { return strconv.Itoa(i) }

// AddReducer registers a DDP reducer's figures (NewReducerCollector) on
// the rank's registry. A second reducer on the same rank is an error.
func (m *Rank) AddReducer(stats func() reducer.Stats) error {
	return m.reg.Register(NewReducerCollector(m.job, m.rank, stats))
}

// Registry is the rank's registry (to serve or gather).
func (m *Rank) Registry() *prometheus.Registry { return m.reg }

func (m *Rank) opChildren(group, op string) *opChildren {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c := m.ops[opKey{group, op}]; c != nil {
		return c
	}
	et := m.engines[group]
	engine, transport := et[0], et[1]
	if engine == "" {
		engine = "unknown"
	}
	if transport == "" {
		transport = engine // nccl: NCCL picks its own transports
	}
	c := &opChildren{
		started: m.started.WithLabelValues(group, op), completed: m.completed.WithLabelValues(group, op),
		failed: m.failed.WithLabelValues(group, op), bytes: m.bytes.WithLabelValues(group, op, engine, transport),
		inflight: m.inflight.WithLabelValues(group, op),
	}
	m.duration.ensure(op)
	m.ops[opKey{group, op}] = c
	return c
}

func (m *Rank) groupChildren(group string) *groupChildren {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c := m.grp[group]; c != nil {
		return c
	}
	c := &groupChildren{timeouts: m.timeouts.WithLabelValues(group), abortsSent: m.abortsSent.WithLabelValues(group),
		abortsRecvd: m.abortsRecvd.WithLabelValues(group), restarts: m.restarts.WithLabelValues(group)}
	m.grp[group] = c
	return c
}

// sizeClass is the index in SizeBuckets of a buffer of n bytes.
func sizeClass(n int64) int {
	for i, b := range SizeBuckets {
		if n <= b.Max {
			return i
		}
	}
	return len(SizeBuckets) - 1
}

// remoteAbortPrefix starts a comm.RemoteAbortError's text.
const remoteAbortPrefix = "comm: communicator aborted by a failure at rank"

// Observe updates the metrics from one event (actors.PublisherConfig.Tap):
// comm_init gives a group's engine and transport labels; watchdog
// "timeout" and "write_abort", comm_abort caused by a peer, and restart
// "restart" count the rest. Work events are ignored: Works are counted
// exactly by the watchdog (WorkScheduled, WorkDone), while their events
// are sampled. Safe for concurrent use.
func (m *Rank) Observe(ev *actors.Event) {
	switch ev.Kind {
	case actors.KindCommInit:
		if e := ev.Detail["engine"]; e != "" {
			m.mu.Lock()
			m.engines[ev.Group] = [2]string{e, ev.Detail["transport"]}
			m.mu.Unlock()
		}
	case actors.KindWatchdog:
		switch ev.Action {
		case "timeout":
			m.groupChildren(ev.Group).timeouts.Inc()
		case "write_abort":
			m.groupChildren(ev.Group).abortsSent.Inc()
		}
	case actors.KindCommAbort:
		if strings.HasPrefix(ev.Error, remoteAbortPrefix) {
			m.groupChildren(ev.Group).abortsRecvd.Inc()
		}
	case actors.KindRestart:
		if ev.Action == "restart" && ev.Group != "" {
			m.groupChildren(ev.Group).restarts.Inc()
		}
	}
}
