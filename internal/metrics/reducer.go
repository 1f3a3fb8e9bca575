package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ranktree/ranktree/reducer"
)

// reducerCollector reads a DDP reducer's Stats at scrape time (nothing on
// the training path).
type reducerCollector struct {
	stats                                           func() reducer.Stats
	buckets, bucketBytes, iterations, overlap, wait *prometheus.Desc
}

// NewReducerCollector returns a collector of the reducer's figures for
// rank in job, read through stats (reducer.Reducer.Stats) at each scrape:
//
//	ranktree_reducer_buckets                  gauge    current gradient buckets
//	ranktree_reducer_bucket_bytes             gauge    their total size (bytes)
//	ranktree_reducer_iterations_total         counter  synced iterations
//	ranktree_reducer_overlap_ratio            gauge    fraction of allreduce time hidden behind backward
//	                                                   (c10d avg_backward_compute_comm_overlap_time / avg_backward_comm_time)
//	ranktree_reducer_wait_seconds             gauge    mean time EndBackward blocked on collectives
func NewReducerCollector(job string, rank int, stats func() reducer.Stats) prometheus.Collector {
	cl := prometheus.Labels{"job": job, "rank": itoa(rank)}
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("ranktree_reducer_"+name, help, nil, cl)
	}
	return &reducerCollector{stats: stats,
		buckets:     d("buckets", "Current gradient buckets of the DDP reducer."),
		bucketBytes: d("bucket_bytes", "Total size of the reducer's buckets in bytes."),
		iterations:  d("iterations_total", "Synced iterations finalized by EndBackward."),
		overlap:     d("overlap_ratio", "Fraction of the reducer's allreduce time that overlapped backward compute (mean over iterations)."),
		wait:        d("wait_seconds", "Mean time EndBackward blocked waiting for the reductions."),
	}
}

// Describe implements prometheus.Collector.
func (c *reducerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.buckets, c.bucketBytes, c.iterations, c.overlap, c.wait} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *reducerCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	total := 0
	for _, b := range s.BucketSizes {
		total += b
	}
	ratio := 0.0
	if s.AvgCommTime > 0 {
		ratio = float64(s.AvgOverlapTime) / float64(s.AvgCommTime)
	}
	ch <- prometheus.MustNewConstMetric(c.buckets, prometheus.GaugeValue, float64(len(s.BucketSizes)))
	ch <- prometheus.MustNewConstMetric(c.bucketBytes, prometheus.GaugeValue, float64(total))
	ch <- prometheus.MustNewConstMetric(c.iterations, prometheus.CounterValue, float64(s.Iterations))
	ch <- prometheus.MustNewConstMetric(c.overlap, prometheus.GaugeValue, ratio)
	ch <- prometheus.MustNewConstMetric(c.wait, prometheus.GaugeValue, s.AvgWaitTime.Seconds())
}
