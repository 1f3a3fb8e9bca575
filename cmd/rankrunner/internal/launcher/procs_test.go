package launcher

import (
	"runtime"
	"testing"
)

func TestRunnerProcs(t *testing.T) {
	for _, c := range []struct{ local, cpus, want int }{
		{2, 2, 1}, {1, 2, 2}, {4, 2, 1}, {0, 8, 8}, {8, 96, 12}, {3, 16, 5},
	} {
		if got := RunnerProcs(c.local, c.cpus); got != c.want {
			t.Errorf("RunnerProcs(%d ranks, %d CPUs) = %d, want %d", c.local, c.cpus, got, c.want)
		}
	}
}

// TestLimitRunnerProcs: the runner takes one rank's share of the CPUs
// unless the environment sets GOMAXPROCS, which then stays in effect.
func TestLimitRunnerProcs(t *testing.T) {
	old := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(old)
	want := RunnerProcs(runtime.NumCPU(), runtime.NumCPU()) // 1
	if got := LimitRunnerProcs(runtime.NumCPU(), func(string) string { return "" }); got != want || runtime.GOMAXPROCS(0) != want {
		t.Fatalf("LimitRunnerProcs = %d, GOMAXPROCS %d; want %d", got, runtime.GOMAXPROCS(0), want)
	}
	runtime.GOMAXPROCS(old)
	set := func(k string) string {
		if k == "GOMAXPROCS" {
			return "7"
		}
		return ""
	}
	if got := LimitRunnerProcs(runtime.NumCPU(), set); got != old || runtime.GOMAXPROCS(0) != old {
		t.Fatalf("with GOMAXPROCS in the environment: LimitRunnerProcs = %d, GOMAXPROCS %d; want both %d (left alone)", got, runtime.GOMAXPROCS(0), old)
	}
}
