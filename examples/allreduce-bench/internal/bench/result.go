package bench

import (
	"fmt"
	"math"
	"slices"
)

// Result is one size's measurement. Its JSON form has the keys bytes,
// count, type, redop, time_us, algbw_GBps and busbw_GBps (the fields of
// nccl-tests' output table), then mean_us, p50_us, p90_us and p99_us (the
// timed iterations' mean, median, 90th and 99th percentile: compare mean_us
// with Open MPI's mean of a timed loop, so the tails count; p99_us shows
// the rare slow ops that move the mean), placement (where the
// ranks ran), collective, req_bytes (the size asked for, before the
// layout rounded it) and blocking (whether the ops ran in their blocking
// form).
type Result struct {
	Collective string    `json:"collective"` // what was measured ("allreduce", Collective.String)
	ReqBytes   int64     `json:"req_bytes"`  // the size asked for (--sizes); Bytes is what the layout made of it
	Bytes      int64     `json:"bytes"`      // message size S in bytes (see the package doc)
	Count      int       `json:"count"`      // elements in S
	Type       string    `json:"type"`       // dtype, torch spelling ("float32")
	RedOp      string    `json:"redop"`      // reduction ("sum"), or "none" for collectives without one
	TimeUs     float64   `json:"time_us"`    // median over timed iterations of the slowest rank's time, µs
	AlgBwGBps  float64   `json:"algbw_GBps"` // Bytes / time, GB/s (1e9 B/s)
	BusBwGBps  float64   `json:"busbw_GBps"` // AlgBwGBps × Collective.BusFactor(n)
	MeanUs     float64   `json:"mean_us"`    // mean over timed iterations of the slowest rank's time, µs
	P50Us      float64   `json:"p50_us"`     // median of the same (equal to TimeUs), µs
	P90Us      float64   `json:"p90_us"`     // 90th percentile (nearest rank) of the same, µs
	P99Us      float64   `json:"p99_us"`     // 99th percentile (nearest rank) of the same, µs
	Placement  Placement `json:"placement"`  // CPUs the ranks ran on during the timed iterations
	// Blocking: the collectives ran in their blocking form (comm.Blocking,
	// Config.Blocking), timed as the call; false: AllReduce(...).Wait.
	Blocking bool `json:"blocking"`
}

// Summarize returns the mean, median, 90th and 99th percentile (nearest
// rank: the smallest value with at least 90% (99%) of xs at or below it)
// of xs; NaNs for an empty slice. xs is not modified.
func Summarize(xs []float64) (mean, p50, p90, p99 float64) {
	if len(xs) == 0 {
		return math.NaN(), math.NaN(), math.NaN(), math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	for _, x := range s {
		mean += x
	}
	mean /= float64(len(s))
	rank := func(q float64) float64 { return s[max(int(math.Ceil(q*float64(len(s))))-1, 0)] }
	return mean, Median(s), rank(0.9), rank(0.99)
}

// NewResult fills the bandwidths from bytes and the median time in µs for
// collective c on n ranks; ReqBytes is bytes (the caller sets the size
// asked for when the layout changed it). A zero or negative time gives
// zero bandwidths.
func NewResult(c Collective, n int, bytes int64, count int, dtype, redop string, timeUs float64) Result {
	r := Result{Collective: c.String(), ReqBytes: bytes, Bytes: bytes, Count: count, Type: dtype, RedOp: redop, TimeUs: timeUs}
	if timeUs > 0 {
		r.AlgBwGBps = float64(bytes) / (timeUs * 1e-6) / 1e9
		r.BusBwGBps = r.AlgBwGBps * c.BusFactor(n)
	}
	return r
}

// Median is the middle value of xs (the mean of the two middle values when
// len(xs) is even); NaN for an empty slice. xs is not modified.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// FormatHeader is the two comment lines above the text table, as
// nccl-tests prints them.
func FormatHeader() string {
	return fmt.Sprintf("# %12s %12s %9s %10s %12s %10s %10s %10s %10s %8s %s\n# %12s %12s %9s %10s %12s %10s %10s %10s %10s %8s %s\n",
		"size", "count", "type", "redop", "time", "algbw", "busbw", "mean", "p90", "shared", "cpus",
		"(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", "(us)", "(us)", "(cpu)", "(by rank)")
}

// FormatRow is one line of the text table.
func FormatRow(r Result) string {
	return fmt.Sprintf("  %12d %12d %9s %10s %12.2f %10.3f %10.3f %10.2f %10.2f %7.0f%% %v\n",
		r.Bytes, r.Count, r.Type, r.RedOp, r.TimeUs, r.AlgBwGBps, r.BusBwGBps, r.MeanUs, r.P90Us,
		100*r.Placement.SharedFrac, r.Placement.CPUs)
}
