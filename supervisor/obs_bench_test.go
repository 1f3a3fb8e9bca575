package supervisor

import (
	"syscall"
	"testing"
	"time"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/internal/metrics"
)

// discardNATS is an actors.Publisher that publishes nothing.
type discardNATS struct{}

func (discardNATS) Publish(string, []byte) error { return nil }

// benchTick is how many ops a benchmark runs between two watchdog ticks:
// about a third of a 100 ms tick at 300k small ops per second.
const benchTick = 10000

// obsSetup is one rank's observability as a benchmark drives it: a
// watchdog and a flight recorder, with events off, or on through a
// started publisher (whose actor shares the benchmark's thread under
// -cpu 1, as a rank's does under GOMAXPROCS=1) that discards what it
// publishes, and with or without the rank's Prometheus metrics.
func obsSetup(b *testing.B, events, withMetrics bool) (*Watchdog, *FlightRecorder) {
	b.Helper()
	var m *metrics.Rank
	if withMetrics {
		m = metrics.NewRank("bench", 0)
	}
	cfg := WatchdogConfig{Rank: 0, Exit: func(int) {},
		Cfg: Config{ErrorHandling: CleanupOnly, Timeout: time.Minute, WatchdogInterval: time.Hour}}
	if m != nil {
		cfg.Metrics = m
	}
	if events || withMetrics {
		pc := actors.PublisherConfig{Job: "bench"}
		if !events {
			pc.Level = actors.EventsOff
		}
		if m != nil {
			pc.Tap = m.Observe
		}
		p, err := actors.NewEventPublisher(discardNATS{}, pc)
		if err != nil {
			b.Fatal(err)
		}
		p.Start(newSystem(), nil)
		b.Cleanup(func() { _ = p.Close(10 * time.Second) })
		cfg.Events = p
	}
	wd, err := NewWatchdog(cfg)
	if err != nil {
		b.Fatal(err)
	}
	wd.system = newSystem() // Track may wake the actor; nothing runs it here
	wd.handle(RegisterGroup{Spec: GroupSpec{Name: "g", Members: []int{0, 1}}})
	return wd, NewFlightRecorder(RecorderConfig{Capacity: DefaultTraceBufferSize})
}

// finishedWorks returns n Works that started and completed successfully.
func finishedWorks(n int) []*comm.Promise {
	ps := make([]*comm.Promise, n)
	for i := range ps {
		ps[i] = comm.NewPromise(comm.OpAllReduce)
		ps[i].MarkStarted()
		ps[i].Complete(nil)
	}
	return ps
}

// cpuTime is the CPU time (user and system) the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process's CPU time since start per op
// ("cpu-ns/op"): on a loaded machine the wall time per op includes the
// time the benchmark waited for a CPU; this does not. It counts every
// goroutine of the process (the publisher's actor, the GC) as a rank's
// one thread pays for them.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
}

var obsCases = []struct {
	name            string
	events, metrics bool
}{{"events-off", false, false}, {"events-on", true, false}, {"events-on+metrics", true, true}}

// BenchmarkWatchdogTrackTick is the watchdog's cost per op at a high op
// rate, as the rank's thread pays it: Track on the launch path, then the
// actor's drain and tick, once per benchTick ops that all finished in
// between (ns/op and allocs/op are per Work).
func BenchmarkWatchdogTrackTick(b *testing.B) {
	for _, c := range obsCases {
		b.Run(c.name, func(b *testing.B) {
			wd, _ := obsSetup(b, c.events, c.metrics)
			works := finishedWorks(benchTick)
			fp := fpAt(0)
			b.ReportAllocs()
			start := cpuTime()
			for i := 0; b.Loop(); i++ {
				fp.Seq++
				wd.Track("g", fp, time.Minute, works[i%benchTick])
				if i%benchTick == benchTick-1 {
					wd.drain()
					wd.tick()
				}
			}
			reportCPU(b, start)
		})
	}
}

// BenchmarkSupervisionPerOp is the whole per-op cost of a rank's
// supervision and observability: the communicator's observers (flight
// recorder and watchdog) on the launch path, and the watchdog's tick
// (events, metrics) once per benchTick finished ops.
func BenchmarkSupervisionPerOp(b *testing.B) {
	for _, c := range obsCases {
		b.Run(c.name, func(b *testing.B) {
			wd, fr := obsSetup(b, c.events, c.metrics)
			obs := actors.Observers{fr.Observer("g", nil), wd.Observer("g")}
			works := finishedWorks(benchTick)
			op := allreduceOp(1, 1)
			op.Timeout = time.Minute
			b.ReportAllocs()
			start := cpuTime()
			for i := 0; b.Loop(); i++ {
				op.FP.Seq = uint64(i + 1)
				obs.Scheduled(op, works[i%benchTick])
				if i%benchTick == benchTick-1 {
					wd.drain()
					wd.tick()
				}
			}
			reportCPU(b, start)
		})
	}
}

// BenchmarkFlightRecorderRecordFull measures Record once the ring is full
// (every record evicts the oldest entry), for Works in flight, completed
// and failed.
func BenchmarkFlightRecorderRecordFull(b *testing.B) {
	failed := comm.NewPromise(comm.OpAllReduce)
	failed.MarkStarted()
	failed.Complete(&comm.TimeoutError{Rank: 0, Group: "default_pg", Timeout: time.Second})
	for _, c := range []struct {
		name string
		p    *comm.Promise
	}{{"in-flight", comm.NewPromise(comm.OpAllReduce)}, {"completed", finishedWorks(1)[0]}, {"failed", failed}} {
		b.Run(c.name, func(b *testing.B) {
			r := NewFlightRecorder(RecorderConfig{Capacity: DefaultTraceBufferSize})
			op := allreduceOp(1, 1)
			b.ReportAllocs()
			start := cpuTime()
			for i := 0; b.Loop(); i++ {
				op.FP.Seq = uint64(i + 1)
				r.Record("default_pg", op, c.p.Work(), time.Minute)
			}
			reportCPU(b, start)
		})
	}
}
