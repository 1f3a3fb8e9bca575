package supervisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/internal/metrics"
)

// natsRecorder is an actors.Publisher that decodes and keeps what the
// event publisher sends.
type natsRecorder struct {
	mu  sync.Mutex
	evs []actors.Event
}

func (r *natsRecorder) Publish(_ string, data []byte) error {
	var ev actors.Event
	if err := json.Unmarshal(data, &ev); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evs = append(r.evs, ev)
	return nil
}

func (r *natsRecorder) events() []actors.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]actors.Event(nil), r.evs...)
}

// startPublisher starts an event publisher over rec with cfg (Job "j").
func startPublisher(t *testing.T, rec *natsRecorder, cfg actors.PublisherConfig) *actors.EventPublisher {
	t.Helper()
	cfg.Job = "j"
	p, err := actors.NewEventPublisher(rec, cfg)
	if err != nil {
		t.Fatal(err)
	}
	p.Start(newSystem(), nil)
	t.Cleanup(func() { _ = p.Close(5 * time.Second) })
	return p
}

// handWatchdog is a watchdog driven by hand (no actor, no ticker): the
// test calls drain, tick and pollWorks itself.
func handWatchdog(t testing.TB, cfg WatchdogConfig) *Watchdog {
	t.Helper()
	if cfg.Exit == nil {
		cfg.Exit = func(int) { t.Error("exit") }
	}
	cfg.Cfg = Config{ErrorHandling: CleanupOnly, Timeout: time.Minute, WatchdogInterval: time.Hour}
	wd, err := NewWatchdog(cfg)
	if err != nil {
		t.Fatal(err)
	}
	wd.system = newSystem()
	return wd
}

// finishedWork is a Work that started and completed with err.
func finishedWork(err error) *comm.Promise {
	p := comm.NewPromise(comm.OpAllReduce)
	p.MarkStarted()
	p.Complete(err)
	return p
}

// TestWatchdogSamplesWorkEvents checks the sampling of successful Work
// events against a real publisher whose budget (WorkEventRate 30 per
// second, a stopped clock) admits 10 Works: of 300 Works that finished
// before the tick, at most 10 publish their scheduled, started and
// completed events, and no other successful Work publishes anything,
// except a slow one (its completion) and the group's newest (its
// completion: `rankrunner events` sees the latest seq); the failed Work's
// event goes out. A group whose newest Work is still in flight at the tick
// publishes its state, then its completion at a later tick.
func TestWatchdogSamplesWorkEvents(t *testing.T) {
	rec := &natsRecorder{}
	clock := time.Unix(1000, 0)
	pub := startPublisher(t, rec, actors.PublisherConfig{WorkEventRate: 30, SlowOp: 20 * time.Millisecond,
		Now: func() time.Time { return clock }})
	wd := handWatchdog(t, WatchdogConfig{Events: pub})
	wd.handle(RegisterGroup{Spec: GroupSpec{Name: "g", Members: []int{0}}})
	wd.handle(RegisterGroup{Spec: GroupSpec{Name: "h", Members: []int{0}}})

	open := comm.NewPromise(comm.OpAllReduce)
	open.MarkStarted()
	wd.Track("h", fpAt(1), 0, open)
	const n, failed, slow = 300, 150, 200
	for seq := uint64(1); seq <= n; seq++ {
		var p *comm.Promise
		switch seq {
		case failed:
			p = finishedWork(errors.New("boom"))
		case slow:
			p = comm.NewPromise(comm.OpAllReduce)
			p.MarkStarted()
			time.Sleep(30 * time.Millisecond)
			p.Complete(nil)
		default:
			p = finishedWork(nil)
		}
		wd.Track("g", fpAt(seq), 0, p)
	}
	wd.drain()
	wd.tick()
	if wd.core.InFlight() != 1 {
		t.Errorf("%d Works in the core after the tick, want 1 (the one in flight)", wd.core.InFlight())
	}
	open.Complete(nil)
	wd.tick()
	if err := pub.Close(5 * time.Second); err != nil {
		t.Fatal(err)
	}

	states := map[string][]string{} // group/seq → states, in order
	for _, ev := range rec.events() {
		if ev.Kind == actors.KindWork {
			k := fmt.Sprintf("%s/%d", ev.Group, ev.Seq)
			states[k] = append(states[k], ev.State)
		}
	}
	admitted := 0
	for seq := uint64(1); seq <= n; seq++ {
		got := fmt.Sprint(states[fmt.Sprintf("g/%d", seq)])
		switch {
		case got == "[scheduled started completed]":
			admitted++
		case seq == failed && (got == "[failed]" || got == "[scheduled started failed]"):
		case (seq == slow || seq == n) && got == "[completed]":
		case got == "[]" && seq != failed && seq != slow && seq != n:
		default:
			t.Errorf("seq %d published %s", seq, got)
		}
	}
	if admitted < 9 || admitted > 10 {
		t.Errorf("%d Works published all their events, want the 10 the budget of 30 events admits", admitted)
	}
	if got := fmt.Sprint(states["h/1"]); got != "[started completed]" {
		t.Errorf("the newest Work of h, in flight at the first tick, published %s, want [started completed]", got)
	}
	if pub.Sampled() == 0 {
		t.Error("no Work event counted as sampled out")
	}
}

// fakeMetrics records the watchdog's WorkMetrics calls.
type fakeMetrics struct {
	scheduled, completed, failed, flushes int
	seen                                  map[uint64]int           // seq → WorkDone calls
	durs                                  map[uint64]time.Duration // seq → the last WorkDone's duration
}

func (m *fakeMetrics) WorkScheduled(string, comm.OpType) { m.scheduled++ }
func (m *fakeMetrics) WorkDone(_ string, fp comm.Fingerprint, dur time.Duration, err error) {
	if m.seen == nil {
		m.seen, m.durs = map[uint64]int{}, map[uint64]time.Duration{}
	}
	m.seen[fp.Seq]++
	m.durs[fp.Seq] = dur
	if err != nil {
		m.failed++
	} else {
		m.completed++
	}
}
func (m *fakeMetrics) FlushWorks() { m.flushes++ }

// TestWatchdogShortPathDuration: a Work that ended before the drain (the
// short path, which reads the Work's raw timestamps rather than its
// Timings) is counted with the time from its start to its end, or from
// its creation when it never started, as the full path counts it.
func TestWatchdogShortPathDuration(t *testing.T) {
	m := &fakeMetrics{}
	wd := handWatchdog(t, WatchdogConfig{Metrics: m})
	wd.handle(RegisterGroup{Spec: GroupSpec{Name: "g", Members: []int{0}}})
	started := comm.NewPromise(comm.OpAllReduce)
	time.Sleep(20 * time.Millisecond) // before the start: not counted
	started.MarkStarted()
	time.Sleep(10 * time.Millisecond)
	started.Complete(nil)
	never := comm.NewPromise(comm.OpAllReduce)
	time.Sleep(10 * time.Millisecond)
	never.Complete(nil)
	wd.Track("g", fpAt(1), 0, started)
	wd.Track("g", fpAt(2), 0, never)
	wd.drain()
	if wd.core.InFlight() != 0 {
		t.Fatalf("%d Works in the core; both ended before the drain and take the short path", wd.core.InFlight())
	}
	for seq, w := range map[uint64]*comm.Promise{1: started, 2: never} {
		tm := w.Work().Timings()
		from := tm.Started
		if from.IsZero() {
			from = tm.Created
		}
		if want := tm.Completed.Sub(from); m.durs[seq] != want || want < 10*time.Millisecond || want > time.Second {
			t.Errorf("seq %d: WorkDone got %v, want %v (start, or creation, to end)", seq, m.durs[seq], want)
		}
	}
}

// TestWatchdogFeedsMetricsExactly: every tracked Work is counted once when
// first seen and once at its end, whether it finished before the tick (the
// short path), failed, completed later, or timed out; and only the Works
// in flight enter the core, whose watermarks follow all of them.
func TestWatchdogFeedsMetricsExactly(t *testing.T) {
	m := &fakeMetrics{}
	now := time.Now()
	wd := handWatchdog(t, WatchdogConfig{Metrics: m, Now: func() time.Time { return now }})
	wd.handle(RegisterGroup{Spec: GroupSpec{Name: "g", Members: []int{0}, Timeout: time.Second}})
	const n = 100
	for seq := uint64(1); seq <= n; seq++ {
		wd.Track("g", fpAt(seq), 0, finishedWork(nil))
	}
	wd.Track("g", fpAt(n+1), 0, finishedWork(errors.New("boom")))
	later, stuck := comm.NewPromise(comm.OpAllReduce), comm.NewPromise(comm.OpAllReduce)
	wd.Track("g", fpAt(n+2), 0, later)
	wd.Track("g", fpAt(n+3), 0, stuck)
	wd.drain()
	if in := wd.core.InFlight(); in != 3 {
		t.Errorf("%d Works in the core after the drain, want 3 (failed, later, stuck)", in)
	}
	wd.tick()
	later.MarkStarted()
	later.Complete(nil)
	wd.tick()
	now = now.Add(2 * time.Second) // past stuck's deadline
	wd.tick()
	if err := stuck.Work().Err(); !errors.Is(err, comm.ErrTimeout) {
		t.Fatalf("stuck Work: %v, want ErrTimeout", err)
	}
	if m.scheduled != n+3 || m.completed != n+1 || m.failed != 2 || m.flushes < 3 {
		t.Errorf("metrics saw %d scheduled, %d completed, %d failed, %d flushes; want %d, %d, 2, ≥ 3",
			m.scheduled, m.completed, m.failed, m.flushes, n+3, n+1)
	}
	for seq := uint64(1); seq <= n+3; seq++ {
		if m.seen[seq] != 1 {
			t.Errorf("seq %d ended %d times in the metrics, want once", seq, m.seen[seq])
		}
	}
	if p := wd.core.groups["g"].local; p.Launched != n+3 || p.Completed != n+2 {
		t.Errorf("watermarks %+v, want launched %d, completed %d", p, n+3, n+2)
	}
}

// TestWatchdogObservabilityAllocatesNothingPerOp drives a rank's whole
// per-op observability by hand: the communicator's observers (flight
// recorder, watchdog) for each op, then the watchdog's drain and poll of
// a tick, with events off, and with events on through a real publisher and
// the rank's Prometheus metrics (fed by the watchdog and by the
// publisher's tap). Nothing is allocated in steady state. (The publisher
// flushes only at Close here: its actor's JSON encoding of the few events
// it publishes, a rate-bounded cost of its own goroutine, is left out, and
// its clock stands still, so that the measured Works are the ones its
// budget does not admit.)
func TestWatchdogObservabilityAllocatesNothingPerOp(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("events=%v", on), func(t *testing.T) {
			cfg := WatchdogConfig{}
			if on {
				m := metrics.NewRank("j", 0)
				// A clock that stands still: the warm-up spends the
				// sampling budget and no time refills it, so the measured
				// steps admit no Work event whatever this machine's speed.
				still := time.Unix(1000, 0)
				cfg.Events = startPublisher(t, &natsRecorder{}, actors.PublisherConfig{FlushInterval: time.Hour, Tap: m.Observe,
					Now: func() time.Time { return still }})
				cfg.Metrics = m
			}
			wd := handWatchdog(t, cfg)
			wd.handle(RegisterGroup{Spec: GroupSpec{Name: "g", Members: []int{0, 1}}})
			fr := NewFlightRecorder(RecorderConfig{Capacity: 256})
			obs := actors.Observers{fr.Observer("g", nil), wd.Observer("g")}
			const batch = 1024
			works := make([]*comm.Promise, batch)
			for i := range works {
				works[i] = finishedWork(nil)
			}
			op := allreduceOp(0, 1)
			op.Timeout = time.Minute
			step := func() {
				for _, w := range works {
					op.FP.Seq++
					obs.Scheduled(op, w)
				}
				wd.drain()
				wd.pollWorks(true)
			}
			for range 20 {
				step()
			}
			// AllocsPerRun counts every goroutine's allocations: those of
			// goroutines that earlier tests of this binary left behind
			// (actor systems, publishers, timers) may fall into one
			// measurement, never into all of them, where the per-op path's
			// own would be in each. So the best of five must be 0.
			var got []float64
			for range 5 {
				got = append(got, testing.AllocsPerRun(20, step))
				if got[len(got)-1] == 0 {
					break
				}
			}
			if a := slices.Min(got); a != 0 {
				t.Fatalf("%v allocations per %d ops observed and polled (each of %d measurements), want 0", got, batch, len(got))
			}
			if n := len(wd.flights["g"].ws); n != 0 || wd.core.InFlight() != 0 {
				t.Fatalf("%d Works kept, %d in the core, after they all finished", n, wd.core.InFlight())
			}
			if p := wd.core.groups["g"].local; p.Completed != op.FP.Seq || p.Launched != op.FP.Seq {
				t.Fatalf("watermarks %+v, want launched and completed %d", p, op.FP.Seq)
			}
			if st := fr.Dump("x").Groups[0]; st.LastCompleted != op.FP.Seq || st.LastEnqueued != op.FP.Seq ||
				st.Evicted != op.FP.Seq-256 {
				t.Fatalf("dumped progress %+v, want enqueued and completed %d, evicted %d", st, op.FP.Seq, op.FP.Seq-256)
			}
		})
	}
}

// TestWatchdogPublishesNewestOfEachBusyGroup: with a budget of one Work
// for the whole batch, each of three groups whose Works interleave in one
// inbox batch still gets its newest Work's completion published at the
// tick (what `rankrunner events` shows); an idle group publishes nothing
// at the next tick.
func TestWatchdogPublishesNewestOfEachBusyGroup(t *testing.T) {
	rec := &natsRecorder{}
	clock := time.Unix(1000, 0)
	pub := startPublisher(t, rec, actors.PublisherConfig{WorkEventRate: 3, Now: func() time.Time { return clock }})
	wd := handWatchdog(t, WatchdogConfig{Events: pub})
	groups := []string{"a", "b", "c"}
	for _, g := range groups {
		wd.handle(RegisterGroup{Spec: GroupSpec{Name: g, Members: []int{0}}})
	}
	const n = 100
	for seq := uint64(1); seq <= n; seq++ {
		for _, g := range groups {
			wd.Track(g, fpAt(seq), 0, finishedWork(nil))
		}
	}
	wd.drain()
	wd.tick()
	wd.tick() // idle: nothing more
	if err := pub.Close(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	newest := map[string]int{}
	others := 0
	for _, ev := range rec.events() {
		if ev.Kind != actors.KindWork {
			continue
		}
		if ev.Seq == n && ev.State == actors.StateCompleted {
			newest[ev.Group]++
		} else {
			others++
		}
	}
	for _, g := range groups {
		if newest[g] != 1 {
			t.Errorf("group %s: newest seq %d completed %d times, want once", g, n, newest[g])
		}
	}
	if others > 3 {
		t.Errorf("%d other work events, want at most the 3 of the one admitted Work", others)
	}
}

// TestWatchdogDrainsFullBatchBeforeTick: at a high op rate the actor does
// not hold a tick's worth of Works: the drainBatch-th Work tracked since
// its last drain wakes it, and it takes the batch (publishing its events
// here) long before its next tick (an hour away). Of 2 × drainBatch Works,
// at least drainBatch are drained.
func TestWatchdogDrainsFullBatchBeforeTick(t *testing.T) {
	rec := &recorder{}
	wd, err := NewWatchdog(WatchdogConfig{Rank: 0, Events: rec, Exit: rec.Exit,
		Cfg: Config{ErrorHandling: CleanupOnly, Timeout: time.Minute, WatchdogInterval: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	wd.Start(newSystem(), nil)
	t.Cleanup(func() { _ = wd.Stop(5 * time.Second) })
	wd.Register(GroupSpec{Name: "g", Members: []int{0}}, nil, nil)
	for seq := uint64(1); seq <= 2*drainBatch; seq++ {
		wd.Track("g", fpAt(seq), 0, finishedWork(nil))
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, evs := rec.snapshot()
		done := 0
		for _, ev := range evs {
			if ev.Kind == actors.KindWork && ev.State == actors.StateCompleted {
				done++
			}
		}
		if done >= drainBatch {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d Works drained without a tick", done, drainBatch)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestWatchdogFoldsFinishedWorkAtNextTrack: Track folds the inbox's last
// entry when the next Work of the same group arrives and that entry's
// Work has completed successfully: the entry lets go of the Work (so a
// blocking op's block returns to its pool one op later), keeps its times,
// and hands back the Promise to release if it held it. A Work still in
// flight, a failed one, one of another group, a control message, or any
// entry while a group is aborted is left as it was. At the drain, folded
// Works count and publish exactly as Works read at the drain do: every
// event (a plain sink publishes them all) at the Work's own times,
// WorkDone with the start-to-end duration, the watermarks at the last seq.
func TestWatchdogFoldsFinishedWorkAtNextTrack(t *testing.T) {
	rec := &recorder{}
	m := &fakeMetrics{}
	wd := handWatchdog(t, WatchdogConfig{Metrics: m, Events: rec})
	wd.handle(RegisterGroup{Spec: GroupSpec{Name: "g", Members: []int{0, 1}, Timeout: time.Minute}})
	wd.handle(RegisterGroup{Spec: GroupSpec{Name: "h", Members: []int{0, 1}, Timeout: time.Minute}})

	ok1, ok2 := finishedWork(nil), finishedWork(nil)
	neverStarted := comm.NewPromise(comm.OpAllReduce)
	time.Sleep(time.Millisecond)
	neverStarted.Complete(nil)
	failed := finishedWork(errors.New("boom"))
	inFlight := comm.NewPromise(comm.OpAllReduce)
	other := finishedWork(nil)
	last := finishedWork(nil)

	wd.Track("g", fpAt(1), 0, ok1)
	wd.Track("g", fpAt(2), 0, ok2)          // folds 1
	wd.Track("g", fpAt(3), 0, neverStarted) // folds 2
	wd.Track("g", fpAt(4), 0, failed)       // folds 3
	wd.Track("g", fpAt(5), 0, inFlight)     // 4 failed: kept
	wd.Track("g", fpAt(6), 0, other)        // 5 in flight: kept
	wd.Track("h", fpAt(7), 0, last)         // 6 is of g: kept
	wantDone := []bool{true, true, true, false, false, false, false}
	for i, in := range wd.inbox {
		if in.done != wantDone[i] || (in.done != (in.track.Promise == nil)) {
			t.Fatalf("inbox[%d] (seq %d of %s): done %v, Promise %p; want done %v and a Promise only if not done",
				i, in.track.FP.Seq, in.track.Group, in.done, in.track.Promise, wantDone[i])
		}
	}
	if c, s, d := ok1.Work().UnixNanos(); wd.inbox[0].created != c || wd.inbox[0].started != s || wd.inbox[0].completed != d {
		t.Fatalf("folded times %d %d %d, want the Work's %d %d %d", wd.inbox[0].created, wd.inbox[0].started, wd.inbox[0].completed, c, s, d)
	}

	// A held entry hands its Promise back to Track, which releases it.
	held := inMsg{track: TrackWork{Group: "g", FP: fpAt(9), Promise: finishedWork(nil)}, held: true}
	p := held.track.Promise
	if got := held.fold("g"); got != p || held.held || !held.done {
		t.Fatalf("fold of a held entry returned %p (held %v, done %v), want its Promise %p", got, held.held, held.done, p)
	}
	if got := held.fold("g"); got != nil {
		t.Fatal("an entry was folded twice")
	}
	ctl := inMsg{ctl: SetGroupTimeout{Group: "g"}}
	if ctl.fold("g") != nil || ctl.done {
		t.Fatal("a control message was folded")
	}

	inFlight.MarkStarted()
	inFlight.Complete(nil)
	wd.drain()
	wd.pollWorks(true)
	if m.scheduled != 7 || m.completed != 6 || m.failed != 1 {
		t.Fatalf("metrics scheduled %d completed %d failed %d, want 7, 6, 1", m.scheduled, m.completed, m.failed)
	}
	for seq, p := range map[uint64]*comm.Promise{1: ok1, 3: neverStarted} {
		tm := p.Work().Timings()
		from := tm.Started
		if from.IsZero() {
			from = tm.Created
		}
		if want := tm.Completed.Sub(from); m.durs[seq] != want {
			t.Errorf("seq %d: WorkDone got %v, want %v", seq, m.durs[seq], want)
		}
	}
	if w := wd.core.groups["g"].local; w.Completed != 6 || w.Launched != 6 {
		t.Fatalf("g's watermarks %+v, want launched and completed 6", w)
	}
	_, evs := rec.snapshot()
	states := map[uint64][]string{}
	for _, ev := range evs {
		if ev.Kind != actors.KindWork || ev.Group != "g" {
			continue
		}
		states[ev.Seq] = append(states[ev.Seq], ev.State)
		if ev.Seq == 1 {
			tm := ok1.Work().Timings()
			want := map[string]time.Time{actors.StateScheduled: tm.Created, actors.StateStarted: tm.Started, actors.StateCompleted: tm.Completed}[ev.State]
			if !ev.Time.Equal(want) {
				t.Errorf("seq 1 %s event at %v, want the Work's %v", ev.State, ev.Time, want)
			}
		}
	}
	want := map[uint64][]string{
		1: {actors.StateScheduled, actors.StateStarted, actors.StateCompleted},
		2: {actors.StateScheduled, actors.StateStarted, actors.StateCompleted},
		3: {actors.StateScheduled, actors.StateCompleted},
		4: {actors.StateScheduled, actors.StateStarted, actors.StateFailed},
	}
	for seq, w := range want {
		if !slices.Equal(states[seq], w) {
			t.Errorf("seq %d events %v, want %v", seq, states[seq], w)
		}
	}
}

// TestWatchdogDoesNotFoldWhileAborted: while a group is aborted, Track
// folds nothing (a Work launched then must meet the core as before).
func TestWatchdogDoesNotFoldWhileAborted(t *testing.T) {
	wd := handWatchdog(t, WatchdogConfig{})
	wd.aborted.Store(true)
	wd.Track("g", fpAt(1), 0, finishedWork(nil))
	wd.Track("g", fpAt(2), 0, finishedWork(nil))
	if wd.inbox[0].done {
		t.Fatal("Track folded a Work while a group was aborted")
	}
}
