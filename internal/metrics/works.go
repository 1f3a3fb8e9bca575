package metrics

import (
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ranktree/ranktree/comm"
)

// The Work series (started, completed, failed, in flight, bytes, latency)
// are fed by the watchdog's pass over the Works it tracks, through
// WorkScheduled, WorkDone and FlushWorks (Rank implements
// supervisor.WorkMetrics), not by Work events, which are sampled. The
// calls between two flushes only add to plain counters of the
// watchdog's own (a workTally per group and op, no lock, no atomic, no
// allocation in steady state); FlushWorks, once per watchdog tick, adds
// them to the Prometheus series. Every Work is counted exactly; a scrape
// sees the counts as of the last tick.

// durBounds are DurationBuckets as durations (the histogram's "le"
// bounds, inclusive).
var durBounds = func() []time.Duration {
	b := make([]time.Duration, len(DurationBuckets))
	for i, s := range DurationBuckets {
		b[i] = time.Duration(math.Round(s * 1e9))
	}
	return b
}()

// durTally counts durations per DurationBuckets bucket (the last one is
// +Inf) and their sum.
type durTally struct {
	counts []uint64 // len(DurationBuckets)+1, not cumulative
	sum    time.Duration
	n      uint64
}

func (d *durTally) add(v time.Duration) {
	i := 0
	for i < len(durBounds) && v > durBounds[i] {
		i++
	}
	d.counts[i]++
	d.sum += v
	d.n++
}

func (d *durTally) reset() {
	clear(d.counts)
	d.sum, d.n = 0, 0
}

// workTally is what the watchdog added to one (group, op) since the last
// flush. Owned by the watchdog's goroutine.
type workTally struct {
	group                        string
	op                           comm.OpType
	dirty                        bool
	scheduled, completed, failed uint64
	bytes                        uint64
	dur                          []durTally // by SizeBuckets
}

// works is the watchdog's side of a Rank: the tallies since the last
// flush (single writer, the watchdog actor).
type works struct {
	tallies map[workKey]*workTally
	dirty   []*workTally
	last    *workTally
}

type workKey struct {
	group string
	op    comm.OpType
}

// tally is the workTally of (group, op), marked dirty.
func (m *Rank) tally(group string, op comm.OpType) *workTally {
	w := &m.works
	t := w.last
	if t == nil || t.op != op || t.group != group {
		t = w.tallies[workKey{group, op}]
		if t == nil {
			t = &workTally{group: group, op: op, dur: make([]durTally, len(SizeBuckets))}
			for i := range t.dur {
				t.dur[i].counts = make([]uint64, len(durBounds)+1)
			}
			if w.tallies == nil {
				w.tallies = map[workKey]*workTally{}
			}
			w.tallies[workKey{group, op}] = t
		}
		w.last = t
	}
	if !t.dirty {
		t.dirty = true
		w.dirty = append(w.dirty, t)
	}
	return t
}

// WorkScheduled counts a Work scheduled on group (started, in flight);
// visible after the next FlushWorks. The watchdog calls it
// (supervisor.WorkMetrics), from one goroutine at a time.
func (m *Rank) WorkScheduled(group string, op comm.OpType) {
	m.tally(group, op).scheduled++
}

// WorkDone counts the end of a Work of group that WorkScheduled counted:
// failed if err is not nil, else completed, with its bytes (fp.Count ×
// the dtype's size) and its duration dur (start to completion) in the
// latency histogram. Visible after the next FlushWorks; called as
// WorkScheduled.
func (m *Rank) WorkDone(group string, fp comm.Fingerprint, dur time.Duration, err error) {
	t := m.tally(group, fp.Op)
	if err != nil {
		t.failed++
		return
	}
	t.completed++
	n := fp.Count * elemSizeOf(fp.DType)
	t.bytes += uint64(max(n, 0))
	t.dur[sizeClass(n)].add(dur)
}

// elemSizeOf is d's byte size, 0 for an unknown dtype.
func elemSizeOf(d comm.DType) int64 {
	if !d.Valid() {
		return 0
	}
	return int64(d.Size())
}

// FlushWorks adds what WorkScheduled and WorkDone counted since the last
// flush to the Prometheus series. The watchdog calls it after each tick.
func (m *Rank) FlushWorks() {
	w := &m.works
	for _, t := range w.dirty {
		op := t.op.String()
		c := m.opChildren(t.group, op)
		c.started.Add(float64(t.scheduled))
		c.completed.Add(float64(t.completed))
		c.failed.Add(float64(t.failed))
		c.bytes.Add(float64(t.bytes))
		c.inflight.Add(float64(t.scheduled) - float64(t.completed) - float64(t.failed))
		for i := range t.dur {
			if t.dur[i].n > 0 {
				m.duration.add(op, i, &t.dur[i])
				t.dur[i].reset()
			}
		}
		t.scheduled, t.completed, t.failed, t.bytes, t.dirty = 0, 0, 0, 0, false
	}
	clear(w.dirty)
	w.dirty = w.dirty[:0]
}

// durationHist is ranktree_collective_duration_seconds: a histogram by op
// and size class whose buckets are added in batches (FlushWorks), which
// client_golang's Histogram cannot do, exposed as const histograms at
// each scrape.
type durationHist struct {
	desc   *prometheus.Desc
	mu     sync.Mutex
	series map[histKey]*histSeries
}

type histKey struct {
	op   string
	size int // index in SizeBuckets
}

type histSeries struct {
	counts []uint64 // per bucket, not cumulative; the last is +Inf
	sum    float64  // seconds
	n      uint64
}

func newDurationHist(constLabels prometheus.Labels) *durationHist {
	return &durationHist{
		desc: prometheus.NewDesc("ranktree_collective_duration_seconds",
			"Time from an op's start on the engine to its completion, by op type and message-size class.",
			[]string{"op", "size"}, constLabels),
		series: map[histKey]*histSeries{},
	}
}

// ensure creates op's series of every size class (empty until observed).
func (h *durationHist) ensure(op string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range SizeBuckets {
		if h.series[histKey{op, i}] == nil {
			h.series[histKey{op, i}] = &histSeries{counts: make([]uint64, len(durBounds)+1)}
		}
	}
}

// add adds d's counts to the series (op, size class).
func (h *durationHist) add(op string, size int, d *durTally) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.series[histKey{op, size}]
	if s == nil {
		s = &histSeries{counts: make([]uint64, len(durBounds)+1)}
		h.series[histKey{op, size}] = s
	}
	for i, n := range d.counts {
		s.counts[i] += n
	}
	s.sum += d.sum.Seconds()
	s.n += d.n
}

// Describe implements prometheus.Collector.
func (h *durationHist) Describe(ch chan<- *prometheus.Desc) { ch <- h.desc }

// Collect implements prometheus.Collector.
func (h *durationHist) Collect(ch chan<- prometheus.Metric) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, s := range h.series {
		buckets := make(map[float64]uint64, len(DurationBuckets))
		var cum uint64
		for i, b := range DurationBuckets {
			cum += s.counts[i]
			buckets[b] = cum
		}
		ch <- prometheus.MustNewConstHistogram(h.desc, s.n, s.sum, buckets, k.op, SizeBuckets[k.size].Label)
	}
}
