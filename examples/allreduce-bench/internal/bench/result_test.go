package bench

import (
	"encoding/json"
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
	want := []string{"algbw_GBps", "busbw_GBps", "bytes", "count", "redop", "time_us", "type"}
	if !slices.Equal(keys, want) {
		t.Fatalf("JSON keys = %v, want %v (%s)", keys, want, b)
	}
	if m["bytes"] != 4096.0 || m["count"] != 1024.0 || m["type"] != "bfloat16" || m["redop"] != "none" || m["time_us"] != 12.5 {
		t.Errorf("JSON values wrong: %s", b)
	}
}

func TestFormatTable(t *testing.T) {
	h := FormatHeader()
	if lines := strings.Split(strings.TrimSuffix(h, "\n"), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[0], "#") ||
		!strings.Contains(lines[0], "busbw") || !strings.Contains(lines[1], "(GB/s)") {
		t.Errorf("header = %q", h)
	}
	row := FormatRow(NewResult(AllReduce, 2, 4096, 1024, "float32", "sum", 8))
	f := strings.Fields(row)
	if want := []string{"4096", "1024", "float32", "sum", "8.00", "0.512", "0.512"}; !slices.Equal(f, want) {
		t.Errorf("row fields = %q, want %q", f, want)
	}
}
