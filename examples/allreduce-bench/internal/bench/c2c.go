package bench

import (
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// C2C is the round trip of a cache line between two CPUs: the time for a
// thread on one to write a word and see the reply that a thread on the
// other writes once it has read it. On the development VM (2 vCPUs of an
// AMD EPYC) this probe measured about 50-100 ns while the host ran the two
// vCPUs on cores that share a cache and about 320-500 ns while it ran them
// on cores that do not, and the host moves them now and then (docs/benchmarks.md,
// "Issue 15, session 14"). Every shared-memory exchange between ranks pays
// it, ranktree's and Open MPI's alike, so scripts/bench-compare.sh
// measures it before each run (--c2c-probe) and records it beside the
// run's figures (c2c_ns).
type C2C struct {
	CPUs [2]int `json:"c2c_cpus"`
	// MedianNs, MinNs and MaxNs are the median, smallest and largest of
	// the samples' mean round trips, in ns.
	MedianNs float64 `json:"c2c_ns"`
	MinNs    float64 `json:"c2c_min_ns"`
	MaxNs    float64 `json:"c2c_max_ns"`
	Samples  int     `json:"c2c_samples"`
	Trips    int     `json:"c2c_trips"` // round trips per sample
}

// CoreToCore measures C2C between CPUs a and b: two threads pinned to
// them (sched_setaffinity) pass a counter on its own cache line back and
// forth, trips round trips per sample, samples times. It needs two
// threads running at once, so it raises GOMAXPROCS to 2 for the
// measurement. Errors: a CPU this process may not run on, a and b equal,
// or trips or samples below 1.
func CoreToCore(a, b, trips, samples int) (C2C, error) {
	if a == b || a < 0 || b < 0 {
		return C2C{}, fmt.Errorf("bench: core-to-core probe needs two different CPUs (got %d and %d)", a, b)
	}
	if trips < 1 || samples < 1 {
		return C2C{}, fmt.Errorf("bench: core-to-core probe needs at least one sample of one round trip (got %d × %d)", samples, trips)
	}
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		return C2C{}, fmt.Errorf("bench: core-to-core probe: %w", err)
	}
	if !allowed.IsSet(a) || !allowed.IsSet(b) {
		return C2C{}, fmt.Errorf("bench: core-to-core probe: CPU %d or %d is not one this process may run on", a, b)
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(2, runtime.GOMAXPROCS(0))))
	var line struct {
		_ [64]byte
		v atomic.Int64
		_ [64]byte
	}
	ready := make(chan error, 1)
	done := make(chan struct{})
	go answer(&line.v, b, int64(trips)*int64(samples), ready, done)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := <-ready; err != nil {
		return C2C{}, err
	}
	var old unix.CPUSet
	err := unix.SchedGetaffinity(0, &old)
	if err == nil {
		err = pin(a)
	} else {
		err = fmt.Errorf("bench: core-to-core probe: %w", err)
	}
	if err != nil {
		line.v.Store(-1) // ends the other thread's wait
		<-done
		return C2C{}, err
	}
	defer func() { _ = unix.SchedSetaffinity(0, &old) }()
	per := make([]float64, samples)
	v := int64(0)
	for s := range per {
		t0 := time.Now()
		for range trips {
			line.v.Store(v + 1)
			for line.v.Load() != v+2 {
			}
			v += 2
		}
		per[s] = float64(time.Since(t0).Nanoseconds()) / float64(trips)
	}
	<-done
	r := C2C{CPUs: [2]int{a, b}, Samples: samples, Trips: trips, MinNs: slices.Min(per), MaxNs: slices.Max(per)}
	r.MedianNs = Median(per)
	return r, nil
}

// answer is CoreToCore's other side: on a thread pinned to cpu (the
// result of which it sends on ready) it answers each odd value of *v with
// the next even one, total times, or until *v goes negative; it closes
// done when it returns. Its thread stays locked, so that it ends with the
// goroutine instead of going back to the scheduler pinned.
func answer(v *atomic.Int64, cpu int, total int64, ready chan<- error, done chan<- struct{}) {
	defer close(done)
	runtime.LockOSThread()
	if err := pin(cpu); err != nil {
		ready <- err
		return
	}
	ready <- nil
	for want := int64(1); want < 2*total; want += 2 {
		for {
			x := v.Load()
			if x == want {
				break
			}
			if x < 0 {
				return // the measuring side gave up
			}
		}
		v.Store(want + 1)
	}
}

// pin binds the calling thread to cpu.
func pin(cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("bench: core-to-core probe: binding to CPU %d: %w", cpu, err)
	}
	return nil
}
