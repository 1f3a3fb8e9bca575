package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{[]float64{5}, 5}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{10, 10, 1, 1000, 10}, 10}, {[]float64{-1, 7}, 3},
	} {
		before := slices.Clone(c.in)
		if got := Median(c.in); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
		if !slices.Equal(before, c.in) {
			t.Errorf("Median modified its input: %v -> %v", before, c.in)
		}
	}
	if got := Median(nil); !math.IsNaN(got) {
		t.Errorf("Median(nil) = %v, want NaN", got)
	}
}

func TestNewResultBandwidth(t *testing.T) {
	// 64 MiB in 10 ms on 4 ranks: algbw = 6.7108864 GB/s, busbw × 1.5.
	r := NewResult(AllReduce, 4, 64<<20, 16<<20, "float32", "sum", 10000)
	if math.Abs(r.AlgBwGBps-6.7108864) > 1e-9 || math.Abs(r.BusBwGBps-6.7108864*1.5) > 1e-9 {
		t.Errorf("bandwidths = %v, %v", r.AlgBwGBps, r.BusBwGBps)
	}
	r = NewResult(Broadcast, 3, 1000, 250, "float32", "none", 1)
	if r.AlgBwGBps != 1 || r.BusBwGBps != 1 {
		t.Errorf("broadcast 1000 B in 1 µs = %v / %v GB/s, want 1 / 1", r.AlgBwGBps, r.BusBwGBps)
	}
	if r := NewResult(AllReduce, 2, 8, 2, "float32", "sum", 0); r.AlgBwGBps != 0 || r.BusBwGBps != 0 {
		t.Errorf("zero time gives %v / %v, want zero bandwidths", r.AlgBwGBps, r.BusBwGBps)
	}
}

// TestResultJSONKeys pins the --json schema: exactly these keys.
func TestResultJSONKeys(t *testing.T) {
	b, err := json.Marshal(NewResult(AllGather, 2, 4096, 1024, "bfloat16", "none", 12.5))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	want := []string{"algbw_GBps", "blocking", "busbw_GBps", "bytes", "collective", "count", "mean_us", "p50_us", "p90_us", "p99_us", "placement", "redop", "req_bytes", "time_us", "type"}
	if !slices.Equal(keys, want) {
		t.Fatalf("JSON keys = %v, want %v (%s)", keys, want, b)
	}
	if m["bytes"] != 4096.0 || m["count"] != 1024.0 || m["type"] != "bfloat16" || m["redop"] != "none" || m["time_us"] != 12.5 ||
		m["collective"] != "allgather" || m["req_bytes"] != 4096.0 {
		t.Errorf("JSON values wrong: %s", b)
	}
}

func TestFormatTable(t *testing.T) {
	h := FormatHeader()
	if lines := strings.Split(strings.TrimSuffix(h, "\n"), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[0], "#") ||
		!strings.Contains(lines[0], "busbw") || !strings.Contains(lines[1], "(GB/s)") {
		t.Errorf("header = %q", h)
	}
	r := NewResult(AllReduce, 2, 4096, 1024, "float32", "sum", 8)
	r.MeanUs, r.P90Us, r.Placement = 9.5, 12, Placement{CPUs: []int{0, 1}, SharedFrac: 0.25}
	row := FormatRow(r)
	f := strings.Fields(row)
	if want := []string{"4096", "1024", "float32", "sum", "8.00", "0.512", "0.512", "9.50", "12.00", "25%", "[0", "1]"}; !slices.Equal(f, want) {
		t.Errorf("row fields = %q, want %q", f, want)
	}
}

func TestSummarize(t *testing.T) {
	xs := []float64{10, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	before := slices.Clone(xs)
	mean, p50, p90, p99 := Summarize(xs)
	if mean != 5.5 || p50 != 5.5 || p90 != 9 {
		t.Errorf("Summarize(1..10) = %v, %v, %v, want 5.5, 5.5, 9", mean, p50, p90)
	}
	if !slices.Equal(before, xs) {
		t.Errorf("Summarize modified its input")
	}
	if p99 != 10 {
		t.Errorf("Summarize(1..10) p99 = %v, want 10", p99)
	}
	big := make([]float64, 200)
	for i := range big {
		big[i] = float64(i + 1)
	}
	if _, _, p90, p99 := Summarize(big); p90 != 180 || p99 != 198 {
		t.Errorf("Summarize(1..200) p90, p99 = %v, %v, want 180, 198", p90, p99)
	}
	if mean, p50, p90, _ = Summarize([]float64{3}); mean != 3 || p50 != 3 || p90 != 3 {
		t.Errorf("Summarize([3]) = %v, %v, %v", mean, p50, p90)
	}
	if mean, _, _, _ = Summarize(nil); !math.IsNaN(mean) {
		t.Errorf("Summarize(nil) mean = %v, want NaN", mean)
	}
}

func TestNewPlacement(t *testing.T) {
	// 3 ranks × 4 iterations, values 1 + CPU: rank 0 on CPU 0 then 1, rank 1
	// always CPU 1, rank 2 unknown once. Iteration 1 shares CPU 0 (ranks 0, 2),
	// iterations 2 and 3 share CPU 1 (ranks 0, 1).
	s := []int32{
		1, 1, 2, 2,
		2, 2, 2, 2,
		0, 1, 3, 3,
	}
	p := NewPlacement(s, 3, 4)
	if fmt.Sprint(p.CPUs) != "[0 1 2]" {
		t.Errorf("CPUs = %v, want [0 1 2] (ties to the lower CPU)", p.CPUs)
	}
	if p.SharedFrac != 0.75 || p.Samples != 4 {
		t.Errorf("SharedFrac = %v, Samples = %d, want 0.75, 4", p.SharedFrac, p.Samples)
	}
	if p := NewPlacement(nil, 2, 0); fmt.Sprint(p.CPUs) != "[-1 -1]" || p.Samples != 0 {
		t.Errorf("no samples: %+v", p)
	}
	if c := CurrentCPU(); c < 0 {
		t.Errorf("CurrentCPU() = %d on Linux", c)
	}
}
