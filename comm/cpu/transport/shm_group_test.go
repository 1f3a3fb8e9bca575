package transport

import (
	"golang.org/x/sys/unix"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// twoRankGroup creates a group segment of 2 ranks in dir and returns both
// ranks' views of it, unmapped and unlinked at the end of the test.
func twoRankGroup(t testing.TB, dir string) (g0, g1 *ShmGroup) {
	t.Helper()
	g0, err := CreateGroupShm(dir, 2, 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g0.Unmap)
	g1, err = OpenGroupShm(g0.Path, 2, 64, 1)
	if err != nil {
		g0.Unlink()
		t.Fatal(err)
	}
	t.Cleanup(g1.Unmap)
	g0.Unlink()
	return g0, g1
}

// goroutinesInSyscalls is the runtime's count of goroutines in a system
// call or cgo call (/sched/goroutines/not-in-go).
func goroutinesInSyscalls(t testing.TB) uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines/not-in-go:goroutines"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		t.Skip("runtime has no /sched/goroutines/not-in-go metric")
	}
	return s[0].Value.Uint64()
}

// TestSleepReleasesP: a rank that sleeps in a wait (its peer is late)
// must let the other goroutines of its process run at once, as
// rankrunner gives each rank GOMAXPROCS=1: training compute, the reducer,
// the watchdog. A waiter blocked in a system call (FUTEX_WAIT) keeps its
// P until sysmon takes it back, 20 µs to 10 ms later; a waiter parked in
// the Go scheduler (the doorbell FIFO read through the netpoller) does
// not. With GOMAXPROCS=1 the compute goroutine below can run only once
// the waiter let go of the P; it checks that the waiter is then parked
// (not counted in a system call), then lets the wait end and rings.
func TestSleepReleasesP(t *testing.T) {
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm")
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	g0, g1 := twoRankGroup(t, t.TempDir())
	c := NewCtl()
	c.UseDoorbell(g0)
	g0.Spin, g0.Yield = 0, 0 // sleep at once

	base := goroutinesInSyscalls(t)
	var done atomic.Bool
	var during atomic.Uint64
	var ran atomic.Int64
	go func() {
		for g0.r[0].sleeping.Load() == 0 {
			runtime.Gosched()
		}
		for i := range 1000 { // some compute while rank 0 sleeps
			ran.Add(int64(i & 1))
		}
		during.Store(goroutinesInSyscalls(t))
		done.Store(true)
		g1.wake(0)
	}()
	var p pace
	for !done.Load() {
		if err := g0.pause(&p, c); err != nil {
			t.Fatal(err)
		}
	}
	p.settle()
	if ran.Load() != 500 {
		t.Fatalf("compute goroutine did %d units, want 500", ran.Load())
	}
	if d := during.Load(); d > base {
		t.Errorf("while rank 0 slept, %d goroutines were in system calls (%d before): the sleeping wait holds its thread's P in a system call", d, base)
	}
}

// BenchmarkSleepHandsOverP measures how long a goroutine of a rank's
// process waits to run once the rank's wait goes to sleep, with
// GOMAXPROCS=1 as rankrunner sets it: per op, the waiter (this
// goroutine) sleeps on its doorbell; a compute goroutine that became
// ready as the wait began runs, notes the delay since the waiter raised
// its sleeping flag (stall-µs, median), rings the waiter and parks until
// the next op; wake-µs is the median time from that ring to the waiter
// running again. A sleep in FUTEX_WAIT held the P until sysmon took it
// back (20 µs to 10 ms); a sleep parked in the netpoller hands it over
// at once.
func BenchmarkSleepHandsOverP(b *testing.B) {
	if _, err := os.Stat("/dev/shm"); err != nil {
		b.Skip("no /dev/shm")
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	g0, g1 := twoRankGroup(b, b.TempDir())
	c := NewCtl()
	c.UseDoorbell(g0)
	g0.Spin, g0.Yield = 0, 0

	t0 := time.Now()
	since := func() int64 { return int64(time.Since(t0)) }
	var armedAt, rungAt atomic.Int64 // ns since t0
	var done atomic.Int64
	stalls := make([]int64, 0, b.N)
	wakes := make([]int64, 0, b.N)
	next := make(chan int64)
	go func() { // the compute goroutine
		for r := range next {
			for g0.r[0].sleeping.Load() == 0 {
				runtime.Gosched() // not asleep yet: let the waiter go on
			}
			stalls = append(stalls, since()-armedAt.Load())
			done.Store(r)
			rungAt.Store(since())
			g1.wake(0)
		}
	}()
	b.ResetTimer()
	for i := int64(1); i <= int64(b.N); i++ {
		next <- i // the compute goroutine is now ready to run
		var p pace
		for done.Load() < i {
			if err := g0.pause(&p, c); err != nil {
				b.Fatal(err)
			}
			if p.armed != nil {
				armedAt.Store(since())
			}
		}
		wakes = append(wakes, since()-rungAt.Load())
		p.settle()
	}
	b.StopTimer()
	close(next)
	for _, m := range []struct {
		v    []int64
		name string
	}{{stalls, "stall-µs"}, {wakes, "wake-µs"}} {
		slices.Sort(m.v)
		b.ReportMetric(float64(m.v[len(m.v)/2])/1e3, m.name)
	}
}

// TestPaceNext checks the wait policy as a function of time: spin (or
// yield when oversubscribed) up to the budget, arm, then sleep slices of
// 1, 2, 4, 8, 8, ... ms, each after a re-arm; after progress the next
// wait of the loop may spin up to spinFlowing, and starts its slices
// afresh.
func TestPaceNext(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(us int) time.Time { return t0.Add(time.Duration(us) * time.Microsecond) }
	var flag atomic.Uint32
	type want struct {
		us int
		st step
		d  time.Duration
	}
	run := func(name string, p *pace, spin, yield time.Duration, ws []want) {
		t.Helper()
		for i, w := range ws {
			st, d := p.next(at(w.us), spin, yield)
			if st != w.st || d != w.d {
				t.Fatalf("%s: call %d at %d µs: got (%d, %v), want (%d, %v)", name, i, w.us, st, d, w.st, w.d)
			}
			switch st { // what pause does to the state
			case stepArm:
				p.armed = &flag
			case stepSleep:
				p.armed = nil
			}
		}
	}
	ms := time.Millisecond
	var p pace
	run("spin", &p, SpinFor, 0, []want{
		{0, stepSpin, 0}, {49, stepSpin, 0}, {50, stepArm, 0}, {51, stepSleep, ms},
		{1100, stepArm, 0}, {1101, stepSleep, 2 * ms}, {3200, stepArm, 0}, {3201, stepSleep, 4 * ms},
		{7300, stepArm, 0}, {7301, stepSleep, 8 * ms}, {15400, stepArm, 0}, {15401, stepSleep, 8 * ms},
	})
	p.settle()
	if p.armed != nil || p.sleeps != 0 || !p.flowing {
		t.Fatalf("settle left %+v", p)
	}
	run("spin, flowing", &p, SpinFor, 0, []want{
		{20000, stepSpin, 0}, {20299, stepSpin, 0}, {20300, stepArm, 0}, {20301, stepSleep, ms},
	})
	p = pace{}
	run("yield", &p, 0, SpinFor, []want{
		{0, stepYield, 0}, {49, stepYield, 0}, {50, stepArm, 0}, {51, stepSleep, ms},
	})
	p = pace{}
	run("sleep at once", &p, 0, 0, []want{{0, stepArm, 0}, {0, stepSleep, ms}})
}

// TestDoorbell: a ring before the sleep is not lost (the sleep returns
// at once and drains it), rings of a rank that does not sleep write
// nothing, and a sleep allocates nothing.
func TestDoorbell(t *testing.T) {
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm")
	}
	g0, g1 := twoRankGroup(t, t.TempDir())
	g1.wake(0) // rank 0 does not sleep: no byte
	if n := pending(t, g0); n != 0 {
		t.Fatalf("a wake of a rank that does not sleep left %d bytes", n)
	}
	g0.r[0].sleeping.Store(1)
	g1.wake(0)
	if g0.r[0].sleeping.Load() != 0 {
		t.Fatal("wake left the sleeping flag up")
	}
	if n := pending(t, g0); n != 1 {
		t.Fatalf("a wake of a sleeping rank left %d bytes, want 1", n)
	}
	g0.bells.sleep(time.Hour) // returns at once: the byte is there
	if n := pending(t, g0); n != 0 {
		t.Fatalf("sleep left %d bytes", n)
	}
	if a := testing.AllocsPerRun(20, func() { g0.bells.sleep(time.Nanosecond) }); a != 0 {
		t.Errorf("a sleep allocates %v times", a)
	}
}

// pending is how many bytes wait in g's own doorbell (FIONREAD).
func pending(t *testing.T, g *ShmGroup) int {
	t.Helper()
	n, err := unix.IoctlGetInt(g.bells.fds[g.rank], unix.TIOCINQ)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
