package actors

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/ranktree/ranktree/store/natsstore"
	"io"
	"log/slog"
	"math"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/nats-io/nats.go"
)

// recordingPublisher records publishes; while gate is non-nil, Publish
// blocks until gate is closed.
type recordingPublisher struct {
	mu    sync.Mutex
	subj  []string
	evs   []Event
	gate  chan struct{}
	fail  bool
	calls chan struct{}
}

func (r *recordingPublisher) Publish(subj string, data []byte) error {
	if r.calls != nil {
		select {
		case r.calls <- struct{}{}:
		default:
		}
	}
	if r.gate != nil {
		<-r.gate
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail {
		return errors.New("nats: connection closed")
	}
	var ev Event
	if err := json.Unmarshal(data, &ev); err != nil {
		return err
	}
	r.subj = append(r.subj, subj)
	r.evs = append(r.evs, ev)
	return nil
}

func (r *recordingPublisher) events() ([]string, []Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.subj...), append([]Event(nil), r.evs...)
}

func newTestPublisher(t *testing.T, pub Publisher, cfg PublisherConfig) *EventPublisher {
	t.Helper()
	p, err := NewEventPublisher(pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }))
	p.Start(sys, nil)
	t.Cleanup(func() { _ = p.Close(5 * time.Second) })
	return p
}

func TestPublisherPublishesJSONOnSubject(t *testing.T) {
	rec := &recordingPublisher{}
	p := newTestPublisher(t, rec, PublisherConfig{Job: "job1", Rank: 3})
	p.Emit(Event{Kind: KindWork, Group: "default_pg", Seq: 1, Op: "ALLREDUCE", State: StateScheduled, DType: "float32", Count: 8})
	p.Emit(Event{Kind: KindWork, Group: "default_pg", Seq: 1, Op: "ALLREDUCE", State: StateCompleted, DurUS: 12.5})
	p.Emit(Event{Kind: KindCommInit, Group: "default_pg", Rank: 99})
	if err := p.Close(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	subj, evs := rec.events()
	if len(evs) != 3 {
		t.Fatalf("published %d events, want 3: %v", len(evs), subj)
	}
	wantSubj := []string{"ranktree.job1.events.3.work", "ranktree.job1.events.3.work", "ranktree.job1.events.3.comm_init"}
	for i := range evs {
		if subj[i] != wantSubj[i] {
			t.Errorf("event %d on %q, want %q", i, subj[i], wantSubj[i])
		}
		if evs[i].Job != "job1" || evs[i].Rank != 3 || evs[i].Time.IsZero() {
			t.Errorf("event %d: job %q rank %d time %v; want job1, 3, stamped", i, evs[i].Job, evs[i].Rank, evs[i].Time)
		}
	}
	if evs[0].State != StateScheduled || evs[0].Count != 8 || evs[1].State != StateCompleted || evs[1].DurUS != 12.5 {
		t.Errorf("events out of order or altered: %+v", evs)
	}
	if p.Published() != 3 || p.Dropped() != 0 {
		t.Errorf("published %d dropped %d, want 3 and 0", p.Published(), p.Dropped())
	}
}

func TestPublisherLevels(t *testing.T) {
	all := []Event{
		{Kind: KindWork, State: StateScheduled},
		{Kind: KindWork, State: StateFailed, Error: "comm: timeout"},
		{Kind: KindCommInit},
		{Kind: KindCommAbort, Error: "x"},
		{Kind: KindWatchdog, Action: "dump"},
		{Kind: KindRank, Error: "init failed"},
	}
	for _, tc := range []struct {
		level EventsLevel
		want  []string // kinds published, in order
	}{
		{EventsAll, []string{KindWork, KindWork, KindCommInit, KindCommAbort, KindWatchdog, KindRank}},
		{EventsErrors, []string{KindWork, KindCommAbort, KindWatchdog, KindRank}},
		{EventsOff, nil},
	} {
		rec := &recordingPublisher{}
		p := newTestPublisher(t, rec, PublisherConfig{Job: "j", Level: tc.level})
		for _, ev := range all {
			p.Emit(ev)
		}
		if err := p.Close(5 * time.Second); err != nil {
			t.Fatal(err)
		}
		_, evs := rec.events()
		var got []string
		for _, ev := range evs {
			got = append(got, ev.Kind)
		}
		if len(got) != len(tc.want) {
			t.Fatalf("level %v published %v, want %v", tc.level, got, tc.want)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Fatalf("level %v published %v, want %v", tc.level, got, tc.want)
			}
		}
		if tc.level == EventsErrors && evs[0].State != StateFailed {
			t.Errorf("errors level let through %+v", evs[0])
		}
	}
}

func TestParseEventsLevel(t *testing.T) {
	for in, want := range map[string]EventsLevel{"": EventsAll, "all": EventsAll, "ERRORS": EventsErrors, " off ": EventsOff} {
		got, err := ParseEventsLevel(in)
		if err != nil || got != want {
			t.Errorf("ParseEventsLevel(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"abc", "-1", "2", "debug"} {
		if _, err := ParseEventsLevel(in); !errors.Is(err, ErrBadEventsLevel) {
			t.Errorf("ParseEventsLevel(%q) error = %v, want ErrBadEventsLevel", in, err)
		}
	}
}

// TestPublisherNeverBlocksAndCountsDrops blocks the Publisher, emits more
// events than the buffer holds, and checks that Emit returned at once, the
// overflow was counted, and a drop report with the total followed.
func TestPublisherNeverBlocksAndCountsDrops(t *testing.T) {
	rec := &recordingPublisher{gate: make(chan struct{}), calls: make(chan struct{}, 1)}
	const buf, total = 4, 50
	p := newTestPublisher(t, rec, PublisherConfig{Job: "j", Buffer: buf})
	p.Emit(Event{Kind: KindWork, Seq: 1})
	select { // the actor is now stuck in Publish with the first event
	case <-rec.calls:
	case <-time.After(10 * time.Second):
		t.Fatal("publisher never called Publish")
	}
	start := time.Now()
	for i := 2; i <= total; i++ {
		p.Emit(Event{Kind: KindWork, Seq: uint64(i)})
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Emit blocked: %d emits took %v", total-1, d)
	}
	// One event is being published; buf more are queued; the rest dropped.
	wantDropped := uint64(total - 1 - buf)
	if got := p.Dropped(); got != wantDropped {
		t.Fatalf("dropped %d, want %d", got, wantDropped)
	}
	close(rec.gate)
	if err := p.Close(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	_, evs := rec.events()
	var work int
	var lastDrop uint64
	for _, ev := range evs {
		switch ev.Kind {
		case KindWork:
			work++
		case KindDrops:
			lastDrop = ev.Dropped
		}
	}
	if work != 1+buf {
		t.Errorf("published %d work events, want %d", work, 1+buf)
	}
	if lastDrop != wantDropped {
		t.Errorf("last drop report says %d, want %d (events %+v)", lastDrop, wantDropped, evs)
	}
}

func TestPublisherCountsPublishFailures(t *testing.T) {
	rec := &recordingPublisher{fail: true}
	p := newTestPublisher(t, rec, PublisherConfig{Job: "j"})
	p.Emit(Event{Kind: KindWork})
	p.Emit(Event{Kind: KindWork})
	if err := p.Close(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	// Two events and at least one drop report failed.
	if p.Dropped() < 3 || p.Published() != 0 {
		t.Errorf("dropped %d published %d; want ≥3 and 0", p.Dropped(), p.Published())
	}
	p.Emit(Event{Kind: KindWork}) // after Close: dropped, no panic
}

// TestPublisherSkipsUnencodableEvent: an event json.Marshal refuses (a NaN
// duration) in the middle of a batch is counted as failed and dropped; the
// rest of the batch goes out, in order, each message its own event's JSON.
func TestPublisherSkipsUnencodableEvent(t *testing.T) {
	rec := &recordingPublisher{}
	p := newTestPublisher(t, rec, PublisherConfig{Job: "j", FlushInterval: time.Hour})
	for seq := uint64(1); seq <= 40; seq++ {
		ev := Event{Kind: KindWork, Seq: seq, State: StateCompleted, DurUS: float64(seq)}
		if seq == 17 {
			ev.DurUS = math.NaN()
		}
		p.Emit(ev)
	}
	if err := p.Close(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	_, all := rec.events()
	var evs []Event
	drops := false
	for _, ev := range all {
		switch ev.Kind {
		case KindWork:
			evs = append(evs, ev)
		case KindDrops:
			drops = ev.Dropped == 1
		}
	}
	if len(evs) != 39 || p.Dropped() != 1 || !drops {
		t.Fatalf("published %d work events, dropped %d (drop report %v); want 39, 1 and a report of 1", len(evs), p.Dropped(), drops)
	}
	want := uint64(1)
	for _, ev := range evs {
		if want == 17 {
			want++
		}
		if ev.Seq != want || ev.DurUS != float64(want) {
			t.Fatalf("event %+v, want seq %d with duration %d", ev, want, want)
		}
		want++
	}
}

func TestNewEventPublisherRejectsBadConfig(t *testing.T) {
	rec := &recordingPublisher{}
	for _, cfg := range []PublisherConfig{{Job: ""}, {Job: "a.b"}, {Job: "a>"}, {Job: "j", Buffer: -1}} {
		if _, err := NewEventPublisher(rec, cfg); err == nil {
			t.Errorf("NewEventPublisher(%+v) succeeded", cfg)
		}
	}
	if _, err := NewEventPublisher(nil, PublisherConfig{Job: "j"}); err == nil {
		t.Error("NewEventPublisher(nil) succeeded")
	}
}

// startNATS starts an embedded NATS server for the test and returns its URL.
func startNATS(t *testing.T) string {
	t.Helper()
	url, shutdown, err := natsstore.StartEmbedded(natsstore.EmbeddedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(shutdown)
	return url
}

// connectNATS connects to url with opts, closed at the test's end.
func connectNATS(t *testing.T, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestPublisherOverNATS publishes through a real *nats.Conn to an embedded
// NATS server and reads the events back with a wildcard subscriber.
func TestPublisherOverNATS(t *testing.T) {
	nc := connectNATS(t, startNATS(t))
	sub, err := nc.SubscribeSync(EventWildcard("jobx"))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	p := newTestPublisher(t, nc, PublisherConfig{Job: "jobx", Rank: 1})
	for seq := uint64(1); seq <= 3; seq++ {
		p.Emit(Event{Kind: KindWork, Group: "default_pg", Seq: seq, Op: "ALLREDUCE", State: StateCompleted})
	}
	if err := p.Close(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 3; seq++ {
		msg, err := sub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("event %d: %v", seq, err)
		}
		if msg.Subject != "ranktree.jobx.events.1.work" {
			t.Errorf("subject %q", msg.Subject)
		}
		var ev Event
		if err := json.Unmarshal(msg.Data, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Seq != seq || ev.Op != "ALLREDUCE" || ev.Rank != 1 || ev.Job != "jobx" {
			t.Errorf("event %d = %+v", seq, ev)
		}
	}
}

// countingDialer dials TCP and counts the writes on the connections it made.
type countingDialer struct{ writes atomic.Int64 }

func (d *countingDialer) Dial(network, address string) (net.Conn, error) {
	c, err := net.Dial(network, address)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, writes: &d.writes}, nil
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// TestPublisherWritesBatchOnce: with a rank's one thread (GOMAXPROCS=1, as
// rankrunner sets it) a batch of events reaches the NATS socket in one
// write, not one per stretch of encoding between the actor's yields: each
// write costs the rank a system call and wakes the server. All events
// still arrive, in order.
func TestPublisherWritesBatchOnce(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	url := startNATS(t)
	sub := connectNATS(t, url)
	ch := make(chan *nats.Msg, 256)
	if _, err := sub.ChanSubscribe(EventWildcard("jobw"), ch); err != nil {
		t.Fatal(err)
	}
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	d := &countingDialer{}
	nc := connectNATS(t, url, nats.SetCustomDialer(d))
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	const n = 4 * flushYield // four stretches of encoding: 4 writes before the batch was encoded first
	p := newTestPublisher(t, nc, PublisherConfig{Job: "jobw", Rank: 2, FlushInterval: time.Hour})
	before := d.writes.Load()
	for seq := uint64(1); seq <= n; seq++ {
		p.Emit(Event{Kind: KindWork, Group: "default_pg", Seq: seq, Op: "ALLREDUCE", State: StateCompleted, DurUS: 12.5})
	}
	if err := p.Close(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	// Let the connection's flusher run before counting.
	deadline := time.Now().Add(5 * time.Second)
	for d.writes.Load() == before && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	// One write; two leave room for a Publish that finds the connection's
	// lock taken by its reader, a scheduling point.
	if w := d.writes.Load() - before; w > 2 {
		t.Errorf("%d events reached the socket in %d writes, want 1 (at most 2)", n, w)
	}
	for seq := uint64(1); seq <= n; seq++ {
		select {
		case msg := <-ch:
			var ev Event
			if err := json.Unmarshal(msg.Data, &ev); err != nil {
				t.Fatal(err)
			}
			if ev.Seq != seq || ev.Rank != 2 || msg.Subject != "ranktree.jobw.events.2.work" {
				t.Fatalf("message %d: subject %q, event %+v", seq, msg.Subject, ev)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("event %d never arrived", seq)
		}
	}
	if got := p.Published(); got != n {
		t.Errorf("Published() = %d, want %d", got, n)
	}
}

type discardPublisher struct{}

func (discardPublisher) Publish(string, []byte) error { return nil }

// BenchmarkPublisherEmit measures Emit, the cost a launch pays per event.
func BenchmarkPublisherEmit(b *testing.B) {
	p, err := NewEventPublisher(discardPublisher{}, PublisherConfig{Job: "bench", Buffer: 1 << 16})
	if err != nil {
		b.Fatal(err)
	}
	p.Start(actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	})), nil)
	defer p.Close(10 * time.Second)
	ev := Event{Kind: KindWork, Group: "default_pg", Op: "ALLREDUCE", State: StateScheduled}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		ev.Seq = uint64(i)
		p.Emit(ev)
	}
}

// TestPublisherBatchesOnTimer checks the batch path: Emit wakes nothing,
// the queued events are published in order once FlushInterval passes, an
// error event is published at once, and Close publishes what is queued.
func TestPublisherBatchesOnTimer(t *testing.T) {
	rec := &recordingPublisher{}
	const interval = 150 * time.Millisecond
	p := newTestPublisher(t, rec, PublisherConfig{Job: "j", FlushInterval: interval})
	start := time.Now()
	for i := 1; i <= 100; i++ {
		p.Emit(Event{Kind: KindWork, Seq: uint64(i), State: StateScheduled})
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, evs := rec.events(); len(evs) == 100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("queued events were never published")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if d := time.Since(start); d < interval {
		t.Errorf("batch published after %v, before the flush interval %v", d, interval)
	}
	_, evs := rec.events()
	for i, ev := range evs {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d: published out of order", i, ev.Seq)
		}
	}

	// An error event goes out at once even with a long interval, and takes
	// the events queued before it along, in order.
	rec2 := &recordingPublisher{}
	p2 := newTestPublisher(t, rec2, PublisherConfig{Job: "j", FlushInterval: time.Hour})
	p2.Emit(Event{Kind: KindWork, Seq: 1, State: StateScheduled})
	p2.Emit(Event{Kind: KindWork, Seq: 1, State: StateFailed, Error: "boom"})
	deadline = time.Now().Add(10 * time.Second)
	for {
		if _, evs := rec2.events(); len(evs) == 2 {
			if evs[0].State != StateScheduled || evs[1].State != StateFailed {
				t.Fatalf("events out of order: %+v", evs)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("an error event waited for the flush interval")
		}
		time.Sleep(5 * time.Millisecond)
	}

	// Close flushes the queue.
	p2.Emit(Event{Kind: KindWork, Seq: 2, State: StateScheduled})
	p2.Emit(Event{Kind: KindWork, Seq: 2, State: StateCompleted})
	if err := p2.Close(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if _, evs := rec2.events(); len(evs) != 4 || evs[3].Seq != 2 || evs[3].State != StateCompleted {
		t.Fatalf("Close did not publish the queued events: %+v", evs)
	}
}

// TestPublisherSamplesWorkEvents: beyond WorkEventRate per second,
// successful Work events are left out and counted; failed, erroring and
// slow ones, and other kinds, always go out; the budget refills with time.
func TestPublisherSamplesWorkEvents(t *testing.T) {
	rec := &recordingPublisher{}
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	p := newTestPublisher(t, rec, PublisherConfig{Job: "j", WorkEventRate: 4, SlowOp: time.Second, Now: clock})
	ok := func(seq uint64) Event {
		return Event{Kind: KindWork, Seq: seq, Op: "ALLREDUCE", State: StateCompleted, DurUS: 3}
	}
	for s := uint64(1); s <= 10; s++ {
		p.Emit(ok(s)) // 1..4 fit the budget, 5..10 are sampled out
	}
	p.Emit(Event{Kind: KindWork, Seq: 11, State: StateFailed, Error: "comm: timeout"})
	p.Emit(Event{Kind: KindWork, Seq: 12, State: StateCompleted, DurUS: 2e6}) // slow
	p.Emit(Event{Kind: KindCommInit, Group: "g"})
	mu.Lock()
	now = now.Add(500 * time.Millisecond) // refills 2 tokens
	mu.Unlock()
	for s := uint64(13); s <= 16; s++ {
		p.Emit(ok(s)) // 13, 14 go out
	}
	if err := p.Close(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	_, evs := rec.events()
	var got []uint64
	kinds := 0
	for _, ev := range evs {
		if ev.Kind == KindWork {
			got = append(got, ev.Seq)
		} else {
			kinds++
		}
	}
	if want := []uint64{1, 2, 3, 4, 11, 12, 13, 14}; fmt.Sprint(got) != fmt.Sprint(want) || kinds != 1 {
		t.Errorf("published work seqs %v and %d other events, want %v and 1", got, kinds, want)
	}
	if p.Sampled() != 8 || p.Dropped() != 0 {
		t.Errorf("sampled %d dropped %d, want 8 and 0", p.Sampled(), p.Dropped())
	}
}

// TestPublisherWorkEventBudget: a batch emitter takes its successful Work
// events from the same WorkEventRate bucket as Emit, counts the rest as
// sampled, and publishes what it took with EmitBudgeted, which samples
// nothing again; at level errors the budget is off.
func TestPublisherWorkEventBudget(t *testing.T) {
	rec := &recordingPublisher{}
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	p := newTestPublisher(t, rec, PublisherConfig{Job: "j", WorkEventRate: 10, SlowOp: time.Second, Now: clock})
	if b := p.WorkEventBudget(4); !b.On || b.Events != 4 || b.SlowOp != time.Second {
		t.Fatalf("first budget %+v, want on, 4 events, slow 1s", b)
	}
	if b := p.WorkEventBudget(10); b.Events != 6 {
		t.Fatalf("second budget %+v, want the 6 tokens left", b)
	}
	if p.Sampled() != 4 {
		t.Errorf("sampled %d, want the 4 events the budget refused", p.Sampled())
	}
	ok := func(seq uint64) Event { return Event{Kind: KindWork, Seq: seq, Op: "ALLREDUCE", State: StateCompleted} }
	p.Emit(ok(1))         // no token left: sampled out
	p.EmitBudgeted(ok(2)) // taken by a budget: published
	mu.Lock()
	now = now.Add(500 * time.Millisecond) // refills 5 tokens
	mu.Unlock()
	if b := p.WorkEventBudget(100); b.Events != 5 {
		t.Errorf("budget after 500 ms %+v, want 5 events", b)
	}
	if err := p.Close(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if b := p.WorkEventBudget(3); b.On || b.Events != 0 {
		t.Errorf("budget of a closed publisher %+v, want off", b)
	}
	_, evs := rec.events()
	if len(evs) != 1 || evs[0].Seq != 2 {
		t.Errorf("published %+v, want only the budgeted seq 2", evs)
	}

	errs := newTestPublisher(t, &recordingPublisher{}, PublisherConfig{Job: "j", Level: EventsErrors})
	if b := errs.WorkEventBudget(3); b.On || b.Events != 0 {
		t.Errorf("budget at level errors %+v, want off", b)
	}
	unbounded := newTestPublisher(t, &recordingPublisher{}, PublisherConfig{Job: "j", WorkEventRate: -1})
	if b := unbounded.WorkEventBudget(1 << 20); b.Events != 1<<20 {
		t.Errorf("budget without a bound %+v, want all", b)
	}
}

// TestPublisherTapAllocatesNothing: emitting through a tap (the rank's
// metrics) allocates nothing per event, and the tap sees the event.
func TestPublisherTapAllocatesNothing(t *testing.T) {
	var seen uint64
	p := newTestPublisher(t, &recordingPublisher{}, PublisherConfig{Job: "j", Level: EventsOff,
		Tap: func(ev *Event) { seen = ev.Seq }})
	ev := Event{Kind: KindWatchdog, Seq: 7, Action: "x"}
	if a := testing.AllocsPerRun(100, func() { p.Emit(ev) }); a != 0 {
		t.Errorf("%v allocations per tapped event, want 0", a)
	}
	if seen != 7 {
		t.Errorf("the tap saw seq %d, want 7", seen)
	}
}
