package bench

import (
	"math"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCoreToCore: between two CPUs this process may use, the probe gives
// a positive, finite round trip per sample, ordered min <= median <= max,
// and leaves GOMAXPROCS and the calling thread's CPU set as they were;
// bad arguments are errors.
func TestCoreToCore(t *testing.T) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	var cpus []int
	for c := 0; c < 1024 && len(cpus) < 2; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	for _, bad := range [][4]int{{0, 0, 10, 1}, {-1, 1, 10, 1}, {0, 1, 0, 1}, {0, 1, 10, 0}, {0, 4096, 10, 1}} {
		if _, err := CoreToCore(bad[0], bad[1], bad[2], bad[3]); err == nil {
			t.Errorf("CoreToCore%v: no error", bad)
		}
	}
	if len(cpus) < 2 {
		t.Skip("needs two CPUs")
	}
	procs := runtime.GOMAXPROCS(0)
	// Locked here, CoreToCore measures on this thread (its own lock
	// nests), so the CPU set checked below is the one it changed.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r, err := CoreToCore(cpus[0], cpus[1], 2000, 5)
	if err != nil {
		t.Fatal(err)
	}
	if !(r.MinNs > 0 && r.MinNs <= r.MedianNs && r.MedianNs <= r.MaxNs && !math.IsInf(r.MaxNs, 0)) {
		t.Fatalf("implausible round trips: %+v", r)
	}
	if r.CPUs != [2]int{cpus[0], cpus[1]} || r.Samples != 5 || r.Trips != 2000 {
		t.Fatalf("result does not describe the probe: %+v", r)
	}
	if got := runtime.GOMAXPROCS(0); got != procs {
		t.Fatalf("GOMAXPROCS %d after the probe, want %d", got, procs)
	}
	var after unix.CPUSet
	if err := unix.SchedGetaffinity(0, &after); err != nil {
		t.Fatal(err)
	}
	if after.Count() != set.Count() {
		t.Fatalf("a thread may run on %d CPUs after the probe, %d before", after.Count(), set.Count())
	}
	t.Logf("CPUs %d and %d: %.1f ns per round trip (min %.1f, max %.1f)", cpus[0], cpus[1], r.MedianNs, r.MinNs, r.MaxNs)
}
