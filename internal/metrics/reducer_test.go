package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ranktree/ranktree/reducer"
)

// TestReducerCollector: the reducer's figures are read at scrape time;
// the overlap ratio is overlap / comm time, 0 before any iteration.
func TestReducerCollector(t *testing.T) {
	m := NewRank("j", 1)
	st := reducer.Stats{}
	if err := m.AddReducer(func() reducer.Stats { return st }); err != nil {
		t.Fatal(err)
	}
	if err := m.AddReducer(func() reducer.Stats { return st }); err == nil {
		t.Error("a second reducer was accepted")
	}
	want := func(ratio, iters string) string {
		return `
# HELP ranktree_reducer_iterations_total Synced iterations finalized by EndBackward.
# TYPE ranktree_reducer_iterations_total counter
ranktree_reducer_iterations_total{job="j",rank="1"} ` + iters + `
# HELP ranktree_reducer_overlap_ratio Fraction of the reducer's allreduce time that overlapped backward compute (mean over iterations).
# TYPE ranktree_reducer_overlap_ratio gauge
ranktree_reducer_overlap_ratio{job="j",rank="1"} ` + ratio + `
`
	}
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want("0", "0")), "ranktree_reducer_overlap_ratio", "ranktree_reducer_iterations_total"); err != nil {
		t.Error(err)
	}
	st = reducer.Stats{Iterations: 7, BucketSizes: []int{100, 28}, AvgCommTime: 4 * time.Millisecond, AvgOverlapTime: 3 * time.Millisecond}
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want("0.75", "7")), "ranktree_reducer_overlap_ratio", "ranktree_reducer_iterations_total"); err != nil {
		t.Error(err)
	}
	b := `
# HELP ranktree_reducer_bucket_bytes Total size of the reducer's buckets in bytes.
# TYPE ranktree_reducer_bucket_bytes gauge
ranktree_reducer_bucket_bytes{job="j",rank="1"} 128
# HELP ranktree_reducer_buckets Current gradient buckets of the DDP reducer.
# TYPE ranktree_reducer_buckets gauge
ranktree_reducer_buckets{job="j",rank="1"} 2
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(b), "ranktree_reducer_buckets", "ranktree_reducer_bucket_bytes"); err != nil {
		t.Error(err)
	}
}
