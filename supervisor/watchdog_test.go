package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/store"
)

// fakeEngine is an Abortable + AsyncErrorSource recording aborts.
type fakeEngine struct {
	mu      sync.Mutex
	aborted error
	async   error
}

func (f *fakeEngine) Abort(reason error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.aborted == nil {
		f.aborted = reason
	}
}

func (f *fakeEngine) AsyncError() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.async
}

func (f *fakeEngine) abortReason() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.aborted
}

// recorder records dumps, exits and events, in order.
type recorder struct {
	mu     sync.Mutex
	log    []string
	events []actors.Event
	exited atomic.Int32
}

func (r *recorder) Dump(ctx context.Context, reason string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, "dump: "+reason)
	return nil
}

func (r *recorder) Exit(code int) {
	r.mu.Lock()
	r.log = append(r.log, "exit")
	r.mu.Unlock()
	r.exited.Store(int32(code))
}

func (r *recorder) Emit(ev actors.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
}

func (r *recorder) snapshot() ([]string, []actors.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.log...), append([]actors.Event(nil), r.events...)
}

func startWatchdog(t *testing.T, rank int, mode ErrorHandling, st store.Store, rec *recorder) *Watchdog {
	t.Helper()
	wd, err := NewWatchdog(WatchdogConfig{Rank: rank, Store: st, Dumper: rec, Events: rec, Exit: rec.Exit,
		Cfg:              Config{ErrorHandling: mode, Timeout: time.Minute, WatchdogInterval: 5 * time.Millisecond},
		ProgressInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	wd.Start(newSystem(), nil)
	t.Cleanup(func() { _ = wd.Stop(5 * time.Second) })
	return wd
}

// newSystem returns an actor system that does not log.
func newSystem() *actor.ActorSystem {
	return actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}))
}

func waitWork(t *testing.T, w *comm.Work, within time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	err := w.Wait(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("work still in flight after %v", within)
	}
	return err
}

// TestWatchdogActorsTimeoutAndRemoteAbort runs two ranks' watchdogs over one
// store. Rank 1 is stuck before starting seq 3; rank 0's 300 ms deadline
// fires, names rank 1, aborts its engine and writes abort/<comm-id>; rank 1's
// watchdog sees the key and fails its Work with ErrRemoteAbort.
func TestWatchdogActorsTimeoutAndRemoteAbort(t *testing.T) {
	st := store.NewMemStore()
	defer st.Close()
	rec0, rec1 := &recorder{}, &recorder{}
	eng0, eng1 := &fakeEngine{}, &fakeEngine{}
	wd0 := startWatchdog(t, 0, CleanupOnly, st, rec0)
	wd1 := startWatchdog(t, 1, CleanupOnly, st, rec1)
	spec := GroupSpec{Name: "default_pg", Engine: "cpu", Members: []int{0, 1}}
	spec0 := spec
	spec0.Timeout = 300 * time.Millisecond
	wd0.Register(spec0, eng0, eng0)
	wd1.Register(spec, eng1, eng1)

	// Seqs 1-2 complete on both ranks.
	for seq := uint64(1); seq <= 2; seq++ {
		for _, wd := range []*Watchdog{wd0, wd1} {
			w := comm.NewPromise(comm.OpAllReduce)
			wd.Observer("default_pg").Scheduled(&comm.Op{Type: comm.OpAllReduce, FP: fpAt(seq)}, w)
			w.MarkStarted()
			w.Complete(nil)
		}
	}
	w0, w1 := comm.NewPromise(comm.OpAllReduce), comm.NewPromise(comm.OpAllReduce)
	wd0.Track("default_pg", fpAt(3), 0, w0)
	w0.MarkStarted()
	wd1.Track("default_pg", fpAt(3), 0, w1) // launched, never started

	start := time.Now()
	err0 := waitWork(t, w0.Work(), 10*time.Second)
	var te *comm.TimeoutError
	if !errors.As(err0, &te) || !errors.Is(err0, comm.ErrTimeout) {
		t.Fatalf("rank 0: %v, want a *comm.TimeoutError", err0)
	}
	if len(te.NotReached) != 1 || te.NotReached[0] != 1 || te.FP.Seq != 3 || te.Elapsed < 300*time.Millisecond {
		t.Errorf("rank 0's report %+v", te)
	}
	if !strings.Contains(err0.Error(), "ranks [1] have not reached seq 3") {
		t.Errorf("message %q", err0)
	}
	err1 := waitWork(t, w1.Work(), 5*time.Second)
	var re *comm.RemoteAbortError
	// The failure started at rank 1 (it never reached seq 3); rank 0
	// reported it.
	if !errors.As(err1, &re) || re.Rank != 1 || re.Relay != 0 || re.Seq != 3 || !strings.Contains(re.Reason, "ranks [1] have not reached seq 3") {
		t.Fatalf("rank 1: %v, want a RemoteAbortError from rank 0 naming rank 1 at seq 3", err1)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("rank 1 learned of the abort after %v", d)
	}
	if !errors.Is(eng0.abortReason(), comm.ErrTimeout) {
		t.Errorf("rank 0's engine aborted with %v", eng0.abortReason())
	}
	deadline := time.Now().Add(5 * time.Second)
	for eng1.abortReason() == nil && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if !errors.Is(eng1.abortReason(), comm.ErrRemoteAbort) {
		t.Errorf("rank 1's engine aborted with %v", eng1.abortReason())
	}
	b, err := st.Get(context.Background(), AbortKey("default_pg.0"))
	if err != nil || !strings.Contains(string(b), `"rank":0`) {
		t.Errorf("abort key: %s, %v", b, err)
	}
	// Both dumped; CleanupOnly never exits.
	for i, rec := range []*recorder{rec0, rec1} {
		deadline := time.Now().Add(5 * time.Second)
		for {
			log, _ := rec.snapshot()
			if len(log) > 0 || time.Now().After(deadline) {
				if len(log) == 0 || !strings.HasPrefix(log[0], "dump: ") {
					t.Errorf("rank %d log %v, want a dump", i, log)
				}
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if rec.exited.Load() != 0 {
			t.Errorf("rank %d exited in CleanupOnly mode", i)
		}
	}
	// Events: rank 0 published work states and watchdog actions.
	_, evs := rec0.snapshot()
	seen := map[string]bool{}
	for _, ev := range evs {
		seen[ev.Kind+"/"+ev.State+ev.Action] = true
	}
	for _, k := range []string{"work/scheduled", "work/started", "work/completed", "work/failed", "watchdog/timeout",
		"comm_abort/abort", "watchdog/write_abort", "watchdog/dump"} {
		if !seen[k] {
			t.Errorf("rank 0 did not emit %s (saw %v)", k, seen)
		}
	}
	// A later op on the aborted group fails fast with ErrAborted.
	w := comm.NewPromise(comm.OpAllReduce)
	wd0.Track("default_pg", fpAt(4), 0, w)
	if err := waitWork(t, w.Work(), 5*time.Second); !errors.Is(err, comm.ErrAborted) {
		t.Errorf("op after abort: %v", err)
	}
}

func TestWatchdogActorTearDownExitsAfterDump(t *testing.T) {
	rec := &recorder{}
	wd := startWatchdog(t, 0, TearDown, nil, rec)
	eng := &fakeEngine{}
	wd.Register(GroupSpec{Name: "g", Members: []int{0}, Engine: "cpu"}, eng, eng)
	p := comm.NewPromise(comm.OpBarrier)
	wd.Track("g", comm.Fingerprint{Seq: 1, Op: comm.OpBarrier}, 50*time.Millisecond, p)
	if err := waitWork(t, p.Work(), 10*time.Second); !errors.Is(err, comm.ErrTimeout) {
		t.Fatalf("%v, want ErrTimeout", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for rec.exited.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	log, _ := rec.snapshot()
	if rec.exited.Load() != ExitTearDown || len(log) != 2 || !strings.HasPrefix(log[0], "dump") || log[1] != "exit" {
		t.Errorf("exit code %d, log %v; want a dump then exit %d", rec.exited.Load(), log, ExitTearDown)
	}
}

func TestWatchdogActorAsyncError(t *testing.T) {
	rec := &recorder{}
	wd := startWatchdog(t, 0, CleanupOnly, nil, rec)
	eng := &fakeEngine{}
	wd.Register(GroupSpec{Name: "g", Members: []int{0, 1}, Engine: "nccl"}, eng, eng)
	p := comm.NewPromise(comm.OpAllReduce)
	wd.Track("g", fpAt(1), 0, p)
	eng.mu.Lock()
	eng.async = errors.New("ncclSystemError")
	eng.mu.Unlock()
	err := waitWork(t, p.Work(), 10*time.Second)
	var ee *comm.EngineError
	if !errors.As(err, &ee) || ee.Engine != "nccl" || !strings.Contains(err.Error(), "ncclSystemError") {
		t.Fatalf("%v, want an EngineError", err)
	}
}

func TestWatchdogActorCompletedWorkIsForgotten(t *testing.T) {
	rec := &recorder{}
	wd := startWatchdog(t, 0, TearDown, nil, rec)
	wd.Register(GroupSpec{Name: "g", Members: []int{0}}, nil, nil)
	p := comm.NewPromise(comm.OpAllReduce)
	wd.Track("g", fpAt(1), 100*time.Millisecond, p)
	p.MarkStarted()
	p.Complete(nil)
	time.Sleep(400 * time.Millisecond) // well past the deadline
	if err := p.Work().Err(); err != nil || rec.exited.Load() != 0 {
		t.Errorf("completed work: err %v, exit %d", err, rec.exited.Load())
	}
	if beats := wd.Heartbeat().Load(); beats == 0 {
		t.Error("the watchdog never beat its heartbeat")
	}
}

func TestHeartbeatCore(t *testing.T) {
	h := NewHeartbeatCore(10 * time.Second)
	steps := []struct {
		at   time.Duration
		beat uint64
		want int // actions
	}{
		{0, 0, 0},
		{5 * time.Second, 1, 0},
		{14 * time.Second, 1, 0},  // 9 s without progress
		{15 * time.Second, 2, 0},  // progress resets the clock
		{24 * time.Second, 2, 0},  // 9 s
		{25 * time.Second, 2, 2},  // 10 s: dump + teardown
		{99 * time.Second, 2, 0},  // once only
		{100 * time.Second, 3, 0}, // still once
	}
	for _, s := range steps {
		acts := h.Observe(t0.Add(s.at), s.beat)
		if len(acts) != s.want {
			t.Fatalf("at %v beat %d: %v", s.at, s.beat, acts)
		}
		if s.want == 2 {
			if _, ok := acts[0].(ActDump); !ok {
				t.Errorf("first action %T", acts[0])
			}
			if td, ok := acts[1].(ActTearDown); !ok || td.Code != ExitHeartbeat || !strings.Contains(td.Reason, "no progress for 10s") {
				t.Errorf("second action %#v", acts[1])
			}
		}
	}
}

func TestHeartbeatMonitorActor(t *testing.T) {
	sys := newSystem()
	// A stalled watchdog: the counter never moves.
	rec := &recorder{}
	m, err := NewHeartbeatMonitor(HeartbeatConfig{Timeout: 100 * time.Millisecond, Interval: 5 * time.Millisecond,
		Beat: &Heartbeat{}, Dumper: rec, Exit: rec.Exit})
	if err != nil {
		t.Fatal(err)
	}
	m.Start(sys, nil)
	defer m.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for rec.exited.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	log, _ := rec.snapshot()
	if rec.exited.Load() != ExitHeartbeat || len(log) != 2 || !strings.Contains(log[0], "heartbeat") || !m.Fired() {
		t.Errorf("stalled watchdog: exit %d log %v", rec.exited.Load(), log)
	}

	// A live watchdog beats; the monitor stays quiet.
	rec2 := &recorder{}
	beat := &Heartbeat{}
	m2, _ := NewHeartbeatMonitor(HeartbeatConfig{Timeout: 2 * time.Second, Interval: 5 * time.Millisecond,
		Beat: beat, Dumper: rec2, Exit: rec2.Exit})
	m2.Start(sys, nil)
	defer m2.Stop()
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		beat.Beat()
		time.Sleep(2 * time.Millisecond)
	}
	if rec2.exited.Load() != 0 || m2.Fired() {
		t.Error("monitor fired on a live watchdog")
	}
	if _, err := NewHeartbeatMonitor(HeartbeatConfig{}); err == nil {
		t.Error("NewHeartbeatMonitor without a Beat succeeded")
	}
}

// TestWatchdogTearDownExitsProcess runs a rank in a child process (this test
// binary, re-executed) with the default os.Exit: in TearDown mode a timeout
// must write the dump to the trace dir and then exit with ExitTearDown.
func TestWatchdogTearDownExitsProcess(t *testing.T) {
	if dir := os.Getenv("RANKTREE_TEST_TEARDOWN_DIR"); dir != "" {
		rec := NewFlightRecorder(RecorderConfig{Job: "td", Rank: 0, WorldSize: 1})
		wd, err := NewWatchdog(WatchdogConfig{Rank: 0, Dumper: Dumper{Rec: rec, Dir: dir},
			Cfg: Config{ErrorHandling: TearDown, WatchdogInterval: 5 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		wd.Start(newSystem(), nil)
		wd.Register(GroupSpec{Name: "default_pg", Members: []int{0}, Timeout: 50 * time.Millisecond}, nil, nil)
		op := allreduceOp(1, 4)
		p := comm.NewPromise(comm.OpAllReduce)
		actors.Observers{rec.Observer("default_pg", nil), wd.Observer("default_pg")}.Scheduled(op, p)
		time.Sleep(20 * time.Second) // the watchdog exits the process long before
		t.Fatal("still alive after the deadline")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestWatchdogTearDownExitsProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "RANKTREE_TEST_TEARDOWN_DIR="+dir)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != ExitTearDown {
		t.Fatalf("child: %v, want exit code %d; output:\n%s", err, ExitTearDown, out)
	}
	b, err := os.ReadFile(TraceFile(dir, 0))
	if err != nil {
		t.Fatalf("no dump after teardown: %v", err)
	}
	d, err := ParseDump(b)
	if err != nil || !strings.Contains(d.Reason, "timeout") || len(d.Entries) != 1 || d.Entries[0].State != actors.StateFailed {
		t.Errorf("dump %+v, %v", d, err)
	}
}

// TestWatchdogTrackIsBatchedPerTick checks the per-op path: Track wakes
// nothing, and the next tick picks up every tracked Work in order and
// publishes its scheduled, started and completed events; a Work past its
// deadline still fails within about a tick; once a group is aborted, a
// newly tracked Work fails at once instead of at the next tick.
func TestWatchdogTrackIsBatchedPerTick(t *testing.T) {
	rec := &recorder{}
	const tick = 400 * time.Millisecond
	wd, err := NewWatchdog(WatchdogConfig{Rank: 0, Dumper: rec, Events: rec, Exit: rec.Exit,
		Cfg: Config{ErrorHandling: CleanupOnly, Timeout: time.Minute, WatchdogInterval: tick}})
	if err != nil {
		t.Fatal(err)
	}
	wd.Start(newSystem(), nil)
	t.Cleanup(func() { _ = wd.Stop(5 * time.Second) })
	wd.Register(GroupSpec{Name: "g", Members: []int{0}, Timeout: 150 * time.Millisecond}, &fakeEngine{}, nil)

	const n = 50
	works := make([]*comm.Promise, n)
	for i := range works {
		works[i] = comm.NewPromise(comm.OpAllReduce)
		wd.Track("g", fpAt(uint64(i+1)), 0, works[i])
		works[i].MarkStarted()
		works[i].Complete(nil)
	}
	stuck := comm.NewPromise(comm.OpAllReduce)
	wd.Track("g", fpAt(n+1), 0, stuck)
	tracked := time.Now()

	err = waitWork(t, stuck.Work(), 10*time.Second)
	if !errors.Is(err, comm.ErrTimeout) {
		t.Fatalf("stuck work: %v, want ErrTimeout", err)
	}
	if d := time.Since(tracked); d > 150*time.Millisecond+3*tick {
		t.Errorf("deadline of 150ms enforced only after %v (tick %v)", d, tick)
	}
	_, evs := rec.snapshot()
	var states []string
	next := map[uint64]string{}
	for _, ev := range evs {
		if ev.Kind != actors.KindWork || ev.Seq > n {
			continue
		}
		want := map[string]string{"": actors.StateScheduled, actors.StateScheduled: actors.StateStarted,
			actors.StateStarted: actors.StateCompleted}[next[ev.Seq]]
		if ev.State != want {
			t.Fatalf("seq %d: event %q after %q, want %q", ev.Seq, ev.State, next[ev.Seq], want)
		}
		next[ev.Seq] = ev.State
		states = append(states, ev.State)
	}
	if len(states) != 3*n {
		t.Fatalf("%d work events for %d completed works, want %d", len(states), n, 3*n)
	}

	// The group is aborted now: a new Work fails long before the next tick.
	p := comm.NewPromise(comm.OpAllReduce)
	start := time.Now()
	wd.Track("g", fpAt(n+2), 0, p)
	err = waitWork(t, p.Work(), 10*time.Second)
	if !errors.Is(err, comm.ErrAborted) {
		t.Fatalf("work on an aborted group: %v, want ErrAborted", err)
	}
	if d := time.Since(start); d > tick/2 {
		t.Errorf("work on an aborted group failed after %v; want at once, not at the tick (%v)", d, tick)
	}
}

// TestWatchdogStopPublishesPendingWorkEvents checks that Works tracked since
// the last tick still get their events when the watchdog stops (a Close
// right after the last op).
func TestWatchdogStopPublishesPendingWorkEvents(t *testing.T) {
	rec := &recorder{}
	wd, err := NewWatchdog(WatchdogConfig{Rank: 0, Events: rec, Exit: rec.Exit,
		Cfg: Config{ErrorHandling: CleanupOnly, Timeout: time.Minute, WatchdogInterval: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	wd.Start(newSystem(), nil)
	wd.Register(GroupSpec{Name: "g", Members: []int{0}}, nil, nil)
	done, open := comm.NewPromise(comm.OpAllReduce), comm.NewPromise(comm.OpAllReduce)
	// Work 1 completes before the watchdog is told of it, so that it is
	// finished when the watchdog first sees it whatever the scheduling
	// (completing it after Track raced with the watchdog's goroutine, and
	// under load the events came in launch order: 1 and 2 scheduled, then
	// 1 started and completed).
	done.MarkStarted()
	done.Complete(nil)
	wd.Track("g", fpAt(1), 0, done)
	wd.Track("g", fpAt(2), 0, open)
	if err := wd.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	_, evs := rec.snapshot()
	var got []string
	for _, ev := range evs {
		if ev.Kind == actors.KindWork {
			got = append(got, fmt.Sprintf("%d:%s", ev.Seq, ev.State))
		}
	}
	// Work 1 had finished when the watchdog first saw it: its events come
	// together, before Work 2's.
	want := []string{"1:scheduled", "1:started", "1:completed", "2:scheduled"}
	if !slices.Equal(got, want) {
		t.Errorf("work events at stop: %v, want %v", got, want)
	}
	if open.Work().IsCompleted() {
		t.Errorf("stopping the watchdog completed an in-flight Work: %v", open.Work().Err())
	}
}

// BenchmarkWatchdogTrack measures Track, what the observer costs a launch
// per op (with an event sink, so the scheduled event is included).
func BenchmarkWatchdogTrack(b *testing.B) {
	rec := &recorder{}
	wd, err := NewWatchdog(WatchdogConfig{Rank: 0, Events: rec, Exit: rec.Exit,
		Cfg: Config{ErrorHandling: CleanupOnly, Timeout: time.Minute, WatchdogInterval: 10 * time.Millisecond}})
	if err != nil {
		b.Fatal(err)
	}
	wd.Start(newSystem(), nil)
	defer func() { _ = wd.Stop(10 * time.Second) }()
	wd.Register(GroupSpec{Name: "g", Members: []int{0}}, nil, nil)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		p := comm.NewPromise(comm.OpAllReduce)
		wd.Track("g", fpAt(uint64(i+1)), 0, p)
		p.Complete(nil)
		if i%4096 == 0 {
			rec.mu.Lock()
			rec.events = rec.events[:0]
			rec.mu.Unlock()
		}
	}
}

// TestWatchdogPerOpPathAllocatesNothing drives the watchdog's per-op path
// by hand (no actor, no ticker; events off): Track from the launching
// goroutine, then the actor's drain and poll of a tick. In steady state
// neither allocates per op, and finished Works are forgotten.
func TestWatchdogPerOpPathAllocatesNothing(t *testing.T) {
	wd, err := NewWatchdog(WatchdogConfig{Rank: 0, Exit: func(int) { t.Error("exit") },
		Cfg: Config{ErrorHandling: CleanupOnly, Timeout: time.Minute, WatchdogInterval: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	wd.handle(RegisterGroup{Spec: GroupSpec{Name: "g", Members: []int{0, 1}}})
	const batch = 64
	works := make([]*comm.Promise, batch)
	for i := range works {
		works[i] = comm.NewPromise(comm.OpAllReduce)
		works[i].MarkStarted()
		works[i].Complete(nil)
	}
	seq := uint64(0)
	step := func() {
		for _, w := range works {
			seq++
			wd.Track("g", fpAt(seq), 0, w)
		}
		wd.drain()
		wd.pollWorks(true)
	}
	for range 20 {
		step()
	}
	if a := testing.AllocsPerRun(50, step); a != 0 {
		t.Fatalf("%v allocations per %d ops tracked and polled, want 0", a, batch)
	}
	if n := len(wd.flights["g"].ws); n != 0 || wd.core.InFlight() != 0 {
		t.Fatalf("%d Works kept, %d in the core, after they all finished", n, wd.core.InFlight())
	}
	if p := wd.core.groups["g"].local; p.Completed != seq || p.Launched != seq {
		t.Fatalf("watermarks %+v, want launched and completed %d", p, seq)
	}
}
