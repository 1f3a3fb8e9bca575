package actors

import (
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
)

// EventsLevel selects which events a rank publishes (RANKTREE_EVENTS).
// The zero value is EventsAll.
type EventsLevel uint8

// Event levels.
const (
	// EventsAll publishes every event (the default).
	EventsAll EventsLevel = iota
	// EventsErrors publishes only error events (see IsErrorEvent).
	EventsErrors
	// EventsOff publishes nothing, not even drop reports.
	EventsOff
)

// ParseEventsLevel parses "all", "errors" or "off" (case-insensitive; ""
// means all). Any other value is an error wrapping ErrBadEventsLevel.
func ParseEventsLevel(s string) (EventsLevel, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "all":
		return EventsAll, nil
	case "errors", "error":
		return EventsErrors, nil
	case "off", "none":
		return EventsOff, nil
	}
	return EventsAll, fmt.Errorf("%w %q (want all, errors or off)", ErrBadEventsLevel, s)
}

// ErrBadEventsLevel is returned by ParseEventsLevel for an unknown level.
var ErrBadEventsLevel = errors.New("actors: invalid events level")

// String is the level's RANKTREE_EVENTS spelling.
func (l EventsLevel) String() string {
	switch l {
	case EventsAll:
		return "all"
	case EventsErrors:
		return "errors"
	case EventsOff:
		return "off"
	}
	return fmt.Sprintf("EventsLevel(%d)", uint8(l))
}

// Allows reports whether an event passes the level.
func (l EventsLevel) Allows(ev *Event) bool {
	switch l {
	case EventsAll:
		return true
	case EventsErrors:
		return IsErrorEvent(ev)
	}
	return false
}

// IsErrorEvent reports whether ev is published at level "errors": a failed
// Work, a communicator abort, a watchdog action, a restart, a drop report,
// or any event carrying an error text.
func IsErrorEvent(ev *Event) bool {
	switch ev.Kind {
	case KindCommAbort, KindWatchdog, KindRestart, KindDrops:
		return true
	case KindWork:
		if ev.State == StateFailed {
			return true
		}
	}
	return ev.Error != ""
}

// Publisher is where events go: a *nats.Conn satisfies it. Publish must not
// block for long (nats.Conn buffers and returns) and must not keep data
// after it returns: the publisher reuses that memory for the next batch.
type Publisher interface {
	Publish(subj string, data []byte) error
}

// DefaultEventBuffer is the publisher's default bound on queued events.
// With the drain that starts at a quarter full it absorbs far more than
// the watchdog's Work events of one tick, which the WorkEventRate budget
// bounds before they are queued.
const DefaultEventBuffer = 1 << 16

// DefaultWorkEventRate is the default bound on successful Work events
// (scheduled, started, completed) published per second by one rank. A
// training step's few collectives per second stay far below it, so every
// one is published; at benchmark rates (10^5 ops per second, three events
// each) publishing every event cost a quarter of a rank's CPU and doubled
// the mean small-op time (issue 15).
const DefaultWorkEventRate = 1000

// DefaultSlowOp is the default duration from which a completed Work's event
// is published whatever the sampling.
const DefaultSlowOp = 100 * time.Millisecond

// DefaultFlushInterval is how long an event may wait in the publisher's
// queue before the actor publishes the queue as a batch (error events
// go at once). Each batch costs the rank a write to the NATS socket and
// the server a wake-up that takes a CPU from a rank: 100 ms rather than
// 20, with one socket write per batch, made back-to-back 2-rank
// allreduces of 4 B–4 KiB 3–6 % faster on the 2-core VM (docs/events.md,
// "What publishing costs"). The watchdog
// publishes at its 100 ms tick, so `rankrunner events` sees a busy group
// at most about 200 ms late.
const DefaultFlushInterval = 100 * time.Millisecond

// PublisherConfig configures an EventPublisher.
type PublisherConfig struct {
	// Job is the job name used in subjects (required; no '.', '*', '>' or blanks).
	Job string
	// Rank is the global rank of this process; it overrides Event.Rank.
	Rank int
	// Level filters events (RANKTREE_EVENTS).
	Level EventsLevel
	// Buffer bounds the events queued and not yet published (0: DefaultEventBuffer).
	// Emit drops events beyond it and counts them.
	Buffer int
	// Log receives publish failures (rate-limited to one per second).
	Log zerolog.Logger
	// Now is the clock stamped on events with a zero Time (nil: time.Now).
	Now func() time.Time
	// FlushInterval is the longest an event waits in the queue before it
	// is published (0: DefaultFlushInterval). Error events (IsErrorEvent)
	// are published at once.
	FlushInterval time.Duration
	// WorkEventRate bounds the successful Work events (scheduled, started,
	// completed) published per second, as a token bucket holding one
	// second's worth: beyond it they are sampled out, not queued, and
	// counted (Sampled). Emit takes a token per event; a batch emitter
	// (the watchdog) takes many at once with WorkEventBudget and chooses
	// which events to build. Failed Works, events carrying an error,
	// completions that took SlowOp or longer and every other kind are
	// always published. 0: DefaultWorkEventRate; negative: no bound.
	WorkEventRate int
	// SlowOp is the duration from which a completed Work's event is always
	// published (0: DefaultSlowOp).
	SlowOp time.Duration
	// Tap, if set, sees every emitted event, before Level filters it (the
	// rank's Prometheus metrics, internal/metrics). It runs on the
	// emitter's goroutine, one call at a time, and must be quick and
	// non-blocking; the *Event is valid only during the call (the
	// publisher reuses it, so that tapping allocates nothing).
	Tap func(*Event)
}

// EventPublisher is the event publisher actor of one rank. Successful Work
// events beyond PublisherConfig.WorkEventRate per second are sampled out
// (counted by Sampled); errors, failures and slow ops always go out. Emit hands it
// events from any goroutine without ever blocking (a launch must not wait on
// NATS) and, on the per-op path, without waking any goroutine: events are
// appended to a mutex-guarded queue that the actor drains in batches, at
// most FlushInterval after the first queued event (one timer per batch,
// none while idle), or at once for an error event, a drop report, Close,
// or a queue a quarter of Buffer long.
// The actor marshals each event to JSON and publishes it as one message on
// EventSubject(job, rank, kind), in Emit order. When Buffer events are
// queued, Emit drops the event and counts it; the actor then publishes a
// KindDrops event whose Dropped field is the running total of dropped
// events.
//
// The actor goroutine is the only caller of the Publisher. The counters are
// atomics read by anyone.
type EventPublisher struct {
	cfg PublisherConfig
	pub Publisher

	system *actor.ActorSystem
	pid    *actor.PID

	qmu   sync.Mutex
	queue []Event     // emitted, not yet taken by the actor
	spare []Event     // the actor's last batch, emptied, handed back as the next queue
	armed atomic.Bool // a flush timer is pending (or the actor was woken)

	// Work-event sampling (PublisherConfig.WorkEventRate), under qmu.
	tokens   float64
	lastFill time.Time

	tapMu sync.Mutex
	tapEv Event // the copy of an event the Tap sees, under tapMu

	queued     atomic.Int64
	sampled    atomic.Uint64
	dropped    atomic.Uint64
	published  atomic.Uint64
	failed     atomic.Uint64
	reportSent atomic.Bool
	closed     atomic.Bool

	// Owned by the actor goroutine.
	reported uint64
	lastLog  time.Time
	subjects map[string]string // kind → EventSubject
	enc      []byte            // the JSON of the batch being published, event after event
	ends     []int             // ends[i]: where event i's JSON ends in enc (-1: not encoded)
}

// dropReport asks the actor to publish the drop count.
type dropReport struct{}

// flushQueue asks the actor to publish the queue.
type flushQueue struct{}

// NewEventPublisher validates cfg and returns an unstarted publisher; call
// Start to spawn its actor. It returns an error for an empty or malformed Job
// or a negative Buffer.
func NewEventPublisher(pub Publisher, cfg PublisherConfig) (*EventPublisher, error) {
	if pub == nil {
		return nil, errors.New("actors: NewEventPublisher: nil Publisher")
	}
	if cfg.Job == "" || strings.ContainsAny(cfg.Job, ".*> \t\r\n") {
		return nil, fmt.Errorf("actors: NewEventPublisher: job %q is empty or not a NATS subject token", cfg.Job)
	}
	if cfg.Buffer < 0 {
		return nil, fmt.Errorf("actors: NewEventPublisher: negative buffer %d", cfg.Buffer)
	}
	if cfg.Buffer == 0 {
		cfg.Buffer = DefaultEventBuffer
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = DefaultFlushInterval
	}
	if cfg.WorkEventRate == 0 {
		cfg.WorkEventRate = DefaultWorkEventRate
	}
	if cfg.SlowOp <= 0 {
		cfg.SlowOp = DefaultSlowOp
	}
	return &EventPublisher{cfg: cfg, pub: pub, tokens: float64(max(cfg.WorkEventRate, 0))}, nil
}

// Props returns the actor's props, for a supervisor that spawns it as a child.
// The actor's state lives in p, so a restart after a panic keeps the counters.
func (p *EventPublisher) Props() *actor.Props {
	return PersistentProps((*publisherActor)(p))
}

// Spawner is what spawns a child actor: the system's RootContext, an actor's
// Context, or the rank's supervision root (supervisor.Root).
type Spawner interface {
	Spawn(props *actor.Props) *actor.PID
}

// Start spawns the actor under parent (nil: the system's root) and returns
// its PID. Emit may be called only after Start.
func (p *EventPublisher) Start(system *actor.ActorSystem, parent Spawner) *actor.PID {
	p.system = system
	p.pid = SpawnUnder(system, parent, p.Props(), "")
	return p.pid
}

// PID is the actor's PID (nil before Start).
func (p *EventPublisher) PID() *actor.PID { return p.pid }

// Emit queues ev for publishing and returns at once. Events the level
// filters out are ignored; successful Work events beyond WorkEventRate are
// sampled out; events beyond the buffer, or emitted after Close, are
// dropped and counted. Job, Rank and (if zero) Time are filled in.
// Safe for concurrent use.
func (p *EventPublisher) Emit(ev Event) { p.emit(&ev, true) }

// EmitBudgeted is Emit for a successful Work event that its emitter has
// already sampled in, with a token of WorkEventBudget (or one it must
// publish whatever the budget, as the watchdog does for each busy group's
// newest Work at every tick): the event is not sampled again. Everything
// else is as Emit (Tap, Level, buffer).
func (p *EventPublisher) EmitBudgeted(ev Event) { p.emit(&ev, false) }

// WorkBudget is what the publisher lets a batch emitter of Work events
// (the watchdog, once per batch of Works) publish; see WorkEventBudget.
type WorkBudget struct {
	// On reports whether successful Work events are published at all
	// (Level EventsAll, publisher not closed).
	On bool
	// Events is how many successful Work events the emitter may publish
	// now with EmitBudgeted: the tokens it took from the WorkEventRate
	// bucket (want when there is no bound).
	Events int
	// SlowOp is the duration from which a completed Work's event is
	// published whatever the budget (PublisherConfig.SlowOp).
	SlowOp time.Duration
}

// WorkEventBudget takes up to want tokens of the WorkEventRate bucket at
// once, for an emitter that decides itself which of its successful Work
// events go out (one call per batch instead of sampling in Emit per
// event), and counts the rest as Sampled. Failed Works, errors and slow
// completions need no token: the emitter publishes them with Emit. Safe
// for concurrent use.
func (p *EventPublisher) WorkEventBudget(want int) WorkBudget {
	b := WorkBudget{SlowOp: p.cfg.SlowOp}
	if p.cfg.Level != EventsAll || p.closed.Load() || p.pid == nil {
		return b
	}
	b.On = true
	if want <= 0 {
		return b
	}
	if p.cfg.WorkEventRate < 0 {
		b.Events = want
		return b
	}
	p.qmu.Lock()
	p.refill()
	n := min(want, int(p.tokens))
	p.tokens -= float64(n)
	p.qmu.Unlock()
	b.Events = n
	if n < want {
		p.sampled.Add(uint64(want - n))
	}
	return b
}

// emit is Emit (sample) and EmitBudgeted (!sample). ev does not escape.
func (p *EventPublisher) emit(ev *Event, sample bool) {
	if tap := p.cfg.Tap; tap != nil {
		p.tapMu.Lock()
		p.tapEv = *ev
		tap(&p.tapEv)
		p.tapEv = Event{}
		p.tapMu.Unlock()
	}
	if !p.cfg.Level.Allows(ev) {
		return
	}
	if p.closed.Load() || p.pid == nil {
		p.dropped.Add(1)
		return
	}
	ev.Job, ev.Rank = p.cfg.Job, p.cfg.Rank
	if ev.Time.IsZero() {
		ev.Time = p.cfg.Now()
	}
	p.qmu.Lock()
	if sample && p.cfg.WorkEventRate > 0 && p.sampleOut(ev) {
		p.qmu.Unlock()
		p.sampled.Add(1)
		return
	}
	if len(p.queue) >= p.cfg.Buffer {
		p.qmu.Unlock()
		p.dropped.Add(1)
		if p.reportSent.CompareAndSwap(false, true) {
			p.system.Root.Send(p.pid, dropReport{})
		}
		return
	}
	p.queue = append(p.queue, *ev)
	n := len(p.queue)
	p.queued.Add(1)
	p.qmu.Unlock()
	// The actor clears armed before it takes the queue, so an event
	// appended after the take always finds armed false and arms anew.
	switch {
	case n%max(p.cfg.Buffer/4, 1) == 0:
		// A burst (the watchdog's tick): drain it while it grows.
		p.armed.Store(true)
		p.system.Root.Send(p.pid, flushQueue{})
	case IsErrorEvent(ev):
		p.armed.Store(true)
		p.system.Root.Send(p.pid, flushQueue{})
	case p.armed.CompareAndSwap(false, true):
		time.AfterFunc(p.cfg.FlushInterval, p.wake)
	}
}

// sampleOut reports whether ev, a successful Work event beyond the
// WorkEventRate budget, is left out. Called with qmu held.
func (p *EventPublisher) sampleOut(ev *Event) bool {
	if ev.Kind != KindWork || IsErrorEvent(ev) ||
		(ev.State == StateCompleted && ev.DurUS >= float64(p.cfg.SlowOp.Microseconds())) {
		return false
	}
	p.refill()
	if p.tokens < 1 {
		return true
	}
	p.tokens--
	return false
}

// refill adds the tokens earned since the last refill to the
// WorkEventRate bucket (one second's worth at most). Called with qmu held.
func (p *EventPublisher) refill() {
	rate := float64(p.cfg.WorkEventRate)
	now := p.cfg.Now()
	if p.lastFill.IsZero() {
		p.lastFill = now
	}
	if dt := now.Sub(p.lastFill); dt > 0 {
		p.tokens = min(rate, p.tokens+dt.Seconds()*rate)
		p.lastFill = now
	}
}

// wake sends the actor a flush request (the flush timer's function).
func (p *EventPublisher) wake() {
	if !p.closed.Load() {
		p.system.Root.Send(p.pid, flushQueue{})
	}
}

// Dropped is the number of events dropped so far (buffer full, publish
// failures, emitted after Close).
func (p *EventPublisher) Dropped() uint64 { return p.dropped.Load() }

// Sampled is the number of successful Work events left out by the
// WorkEventRate bound (not counted in Dropped).
func (p *EventPublisher) Sampled() uint64 { return p.sampled.Load() }

// Published is the number of events (drop reports included) published.
func (p *EventPublisher) Published() uint64 { return p.published.Load() }

// Close stops accepting events, lets the actor publish what is queued, and
// stops it. It returns an error if that takes longer than timeout (the
// actor is then stopped without draining). Idempotent.
func (p *EventPublisher) Close(timeout time.Duration) error {
	if !p.closed.CompareAndSwap(false, true) || p.pid == nil {
		return nil
	}
	if StopWithin(p.system, p.pid, StopDrain, timeout) {
		return nil
	}
	return fmt.Errorf("actors: event publisher did not drain within %v (%d events queued)", timeout, p.queued.Load())
}

// publisherActor is EventPublisher's actor face.
type publisherActor EventPublisher

// Receive implements actor.Actor.
func (a *publisherActor) Receive(ctx actor.Context) {
	p := (*EventPublisher)(a)
	switch ctx.Message().(type) {
	case flushQueue:
		p.flush()
		p.reportDrops()
	case dropReport:
		p.reportSent.Store(false)
		p.flush()
		p.reportDrops()
	case *actor.Stopping:
		p.flush()
		p.reportDrops()
	}
}

// flush publishes the queued events in order (actor goroutine only).
func (p *EventPublisher) flush() {
	p.armed.Store(false)
	p.qmu.Lock()
	batch := p.queue
	p.queue, p.spare = p.spare, nil
	p.qmu.Unlock()
	if len(batch) == 0 {
		return
	}
	// Encode the whole batch first, yielding between stretches, then hand
	// the messages to the Publisher with no scheduling point between them
	// (but every publishYield). A *nats.Conn buffers what Publish gives it
	// and its flusher goroutine writes the buffer when it next runs: with a
	// rank's one thread (GOMAXPROCS=1) that is once per batch, not once per
	// stretch of encoding. Each write to the NATS socket costs the rank
	// tens of µs of system call on a VM and wakes the server, whose thread
	// then takes a CPU from a rank (docs/events.md, "What publishing
	// costs").
	p.enc, p.ends = p.enc[:0], p.ends[:0]
	for i := range batch {
		if i > 0 && i%flushYield == 0 {
			// Let the training goroutine run between stretches of
			// encoding.
			runtime.Gosched()
		}
		batch[i].SchemaVersion = EventSchemaVersion
		data, err := json.Marshal(&batch[i])
		if err != nil {
			p.sent(&batch[i], err)
			p.ends = append(p.ends, -1)
			continue
		}
		p.enc = append(p.enc, data...)
		p.ends = append(p.ends, len(p.enc))
	}
	start := 0
	for i := range batch {
		if i > 0 && i%publishYield == 0 {
			runtime.Gosched() // a burst: one write per stretch
		}
		p.queued.Add(-1)
		if end := p.ends[i]; end >= 0 {
			p.sent(&batch[i], p.pub.Publish(p.subject(batch[i].Kind), p.enc[start:end]))
			start = end
		}
		batch[i] = Event{}
	}
	if cap(p.enc) > maxEncodeKeep {
		p.enc = nil // a burst's encoding: do not keep it for the rest of the run
	}
	if cap(batch) <= 2*p.cfg.Buffer { // keep it for reuse (append may round the capacity up)
		p.qmu.Lock()
		if p.spare == nil && p.queue == nil {
			p.queue = batch[:0]
		} else if p.spare == nil {
			p.spare = batch[:0]
		}
		p.qmu.Unlock()
	}
}

// flushYield is how many events the actor encodes between yields.
const flushYield = 16

// publishYield is how many encoded events the actor hands the Publisher
// between yields: a burst's stretches (about 200 bytes an event) stay
// within a *nats.Conn's 32 KiB write buffer, and a steady rate's batch of
// 100 ms (at most about 100 Work events) goes out in one write.
const publishYield = 128

// maxEncodeKeep is the largest encoding buffer flush keeps for the next
// batch (a steady rate's batches are a few KB).
const maxEncodeKeep = 1 << 20

// publish encodes ev and publishes it at once (actor goroutine only).
func (p *EventPublisher) publish(ev *Event) {
	ev.SchemaVersion = EventSchemaVersion
	data, err := json.Marshal(ev)
	if err == nil {
		err = p.pub.Publish(p.subject(ev.Kind), data)
	}
	p.sent(ev, err)
}

// subject is the NATS subject of an event of this kind (cached per kind;
// actor goroutine only).
func (p *EventPublisher) subject(kind string) string {
	subj, cached := p.subjects[kind]
	if !cached {
		subj = EventSubject(p.cfg.Job, p.cfg.Rank, kind)
		if p.subjects == nil {
			p.subjects = map[string]string{}
		}
		p.subjects[kind] = subj
	}
	return subj
}

// sent counts the outcome of publishing ev: err nil is published, else a
// failed (and dropped) event, logged at most once a second (actor
// goroutine only).
func (p *EventPublisher) sent(ev *Event, err error) {
	if err != nil {
		p.failed.Add(1)
		p.dropped.Add(1)
		if now := time.Now(); now.Sub(p.lastLog) >= time.Second {
			p.lastLog = now
			p.cfg.Log.Warn().Err(err).Int("rank", p.cfg.Rank).Str("kind", ev.Kind).
				Uint64("failed", p.failed.Load()).Msg("event publish failed")
		}
		return
	}
	p.published.Add(1)
}

// reportDrops publishes a KindDrops event if drops happened since the last
// report. A failed report is itself counted and reported next time.
func (p *EventPublisher) reportDrops() {
	if p.cfg.Level == EventsOff {
		return
	}
	n := p.dropped.Load()
	if n == p.reported {
		return
	}
	p.reported = n
	p.publish(&Event{Job: p.cfg.Job, Rank: p.cfg.Rank, Kind: KindDrops, Time: p.cfg.Now(), Dropped: n})
}
