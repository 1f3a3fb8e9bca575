package reducer

import (
	"strconv"
	"strings"
	"time"
)

// Stats is a snapshot of the reducer's configuration and runtime figures,
// after c10d's DDPLoggingData (model/bucket fields and the averaged
// avg_backward_* timings). Times average over synced iterations.
type Stats struct {
	Rank, WorldSize int
	// Iterations counts synced iterations finalized by EndBackward.
	Iterations int64
	// NoSyncCalls counts GradReady calls skipped under NoSync.
	NoSyncCalls int64

	BucketCapBytes, FirstBucketBytes int
	GradientAsBucketView             bool
	FindUnusedParameters             bool
	StaticGraph                      bool
	DelayAllReduce                   bool
	// CommHook is the registered hook's name, "" for the built-in path.
	CommHook string

	// BucketSizes (bytes) and BucketParams (parameter indices) describe
	// the current buckets, in launch order.
	BucketSizes  []int
	BucketParams [][]int
	// Rebuilt reports whether the one-time rebuild happened; RebuiltOrder
	// is the parameter order it used (rank 0's, the same on every rank)
	// and RebuiltBucketSizes the resulting bucket sizes (bytes).
	Rebuilt            bool
	RebuiltOrder       []int
	RebuiltBucketSizes []int
	// GradReadyOrder is the order in which this rank's gradients were
	// marked ready in the last synced iteration
	// (c10d prev_iteration_grad_ready_order_indices).
	GradReadyOrder []int
	// UnusedParams lists the parameters unused on every rank in the last
	// synced iteration (FindUnusedParameters / StaticGraph only).
	UnusedParams []int

	// AvgComputeTime: backward compute, from the iteration's first event
	// (PrepareForBackward or first GradReady) to the last GradReady
	// (c10d avg_backward_compute_time).
	AvgComputeTime time.Duration
	// AvgCommTime: from the first bucket launch to the moment EndBackward
	// saw every reduction done (c10d avg_backward_comm_time).
	AvgCommTime time.Duration
	// AvgOverlapTime: the part of AvgCommTime before the last GradReady,
	// i.e. communication running while backward computed
	// (c10d avg_backward_compute_comm_overlap_time).
	AvgOverlapTime time.Duration
	// AvgWaitTime: how long EndBackward blocked on collectives.
	AvgWaitTime time.Duration
}

// RebuiltOrderString renders RebuiltOrder as "2,1,0".
func (s Stats) RebuiltOrderString() string { return joinInts(s.RebuiltOrder) }

func joinInts(v []int) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = strconv.Itoa(x)
	}
	return strings.Join(parts, ",")
}

// timing accumulates one iteration's timestamps and the running sums. It
// never reads the clock: the reducer passes now.
type timing struct {
	begin, lastReady, firstLaunch time.Time
	iters                         int64
	compute, comm, overlap, wait  time.Duration
}

func (t *timing) onBegin(now time.Time) {
	t.begin, t.lastReady, t.firstLaunch = now, now, time.Time{}
}

func (t *timing) onReady(now time.Time) { t.lastReady = now }

func (t *timing) onLaunch(now time.Time) {
	if t.firstLaunch.IsZero() {
		t.firstLaunch = now
	}
}

// onDone closes an iteration: waitStart is when EndBackward began
// waiting, done when every reduction had completed.
func (t *timing) onDone(waitStart, done time.Time) {
	t.iters++
	t.compute += t.lastReady.Sub(t.begin)
	t.wait += done.Sub(waitStart)
	if t.firstLaunch.IsZero() {
		return
	}
	t.comm += done.Sub(t.firstLaunch)
	if end := t.lastReady; end.After(t.firstLaunch) {
		if done.Before(end) {
			end = done
		}
		t.overlap += end.Sub(t.firstLaunch)
	}
}

func (t *timing) fill(s *Stats) {
	if t.iters == 0 {
		return
	}
	n := time.Duration(t.iters)
	s.AvgComputeTime = t.compute / n
	s.AvgCommTime = t.comm / n
	s.AvgOverlapTime = t.overlap / n
	s.AvgWaitTime = t.wait / n
}
