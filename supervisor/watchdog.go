package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/store"
)

// Abortable is what the watchdog aborts: a group's engine (comm.Backend
// satisfies it) or its communicator. Abort must return promptly and be
// idempotent; later ops must fail with comm.ErrAborted.
type Abortable interface{ Abort(reason error) }

// AsyncErrorSource is polled by the watchdog every tick (comm.Backend
// satisfies it; c10d: ncclCommGetAsyncError).
type AsyncErrorSource interface{ AsyncError() error }

// DumpWriter dumps the flight recorder (Dumper satisfies it).
type DumpWriter interface {
	Dump(ctx context.Context, reason string) error
}

// EventSink receives events without blocking (*actors.EventPublisher
// satisfies it).
type EventSink interface{ Emit(ev actors.Event) }

// WatchdogConfig configures a Watchdog.
type WatchdogConfig struct {
	Rank int    // global rank
	Cfg  Config // policy: ErrorHandling, Timeout, WatchdogInterval (validated here)
	// Store receives abort/<comm-id> and progress keys and is watched for
	// peers' (nil: single-process, no propagation).
	Store  store.Store
	Dumper DumpWriter // nil: no dumps
	// Events receives the watchdog's events (nil: none). A WorkEventSink
	// (the rank's event publisher) lets the watchdog sample successful
	// Work events per batch (see Watchdog).
	Events EventSink
	// Metrics, if set, counts every Work's outcome (the rank's Prometheus
	// metrics); see WorkMetrics.
	Metrics WorkMetrics
	// Exit ends the process for ActTearDown (nil: os.Exit). The caller's
	// Exit should flush the event publisher and logs first.
	Exit func(code int)
	// Heartbeat is beaten once per tick (nil: a new one, see Watchdog.Heartbeat).
	Heartbeat *Heartbeat
	// IOTimeout bounds each store write and dump (0: 5 s).
	IOTimeout time.Duration
	// ProgressInterval: see CoreConfig (0: DefaultProgressInterval).
	ProgressInterval time.Duration
	Log              zerolog.Logger
	Now              func() time.Time // nil: time.Now
}

// Watchdog is the watchdog actor of one rank: it feeds WatchdogCore from a
// ticker (Config.WatchdogInterval), from the communicators (TrackWork, via
// Observer), from Work completions it polls, from engines' async errors it
// polls and from the store's abort/ and progress/ prefixes it watches (a
// push), and carries out the core's actions. All its state is owned by the
// actor goroutine; the methods below only hand it messages.
//
// The per-op path (Track, the Observer) costs O(1), allocates nothing in
// steady state and wakes no goroutine: it appends the Work to the inbox, a
// mutex-guarded list that the actor drains at its next tick, before every
// other message and, at a high op rate, every drainBatch Works (one wake
// per batch), so the inbox keeps the order of Track against
// Register, Deregister and SetTimeout (which do wake the actor). A Work is
// thus seen at the latest one WatchdogInterval after it was scheduled (its
// scheduled event is published then, stamped with its creation time); its
// deadline counts from its creation (Timings.Created), so it is enforced as
// before, within about a tick. While some group is aborted, Track wakes the
// actor too, so a Work launched on it fails at once (c10d fails such Works
// immediately).
//
// Every Promise the watchdog keeps (in the inbox, in flight, as a group's
// newest) it holds (comm.Promise.Retain) until it forgets it, so that a
// blocking op's block (comm.Blocking) is never reused under it.
//
// At the drain, a Work that has already completed successfully (at a high
// op rate, nearly all of them) never enters the core's map or deadline
// heap: only its group's sequence watermarks move (WatchdogCore.Finished)
// and its metrics are counted (WorkMetrics). Other Works go under the
// core's deadline; at each tick the actor reads each of them once, in
// tracking order per group, and forgets finished ones. No sort, map or
// allocation per Work, and the actor yields the thread every yieldBatch
// Works. The core's deadline check costs O(groups) (see WatchdogCore).
//
// Events: failed Works, errors and every watchdog action are always
// published. Successful Work events (scheduled, started, completed) are
// sampled: with a WorkEventSink, the actor takes one budget per inbox
// batch (WorkEventBudget) and publishes all events of an evenly spread
// share of the batch's Works, building no Event for the others; a
// completion that took SlowOp or more always goes out, and at each tick
// the newest Work of every busy group is published (publishNewest), so
// that `rankrunner events` always shows each group's latest seq. With a
// plain EventSink every Work event is published. See docs/events.md.
type Watchdog struct {
	cfg  WatchdogConfig
	core *WatchdogCore

	system *actor.ActorSystem
	pid    *actor.PID

	// The inbox: written by any goroutine, drained by the actor.
	inMu    sync.Mutex
	inbox   []inMsg
	spare   []inMsg     // the actor's emptied last batch, the next inbox (actor only)
	aborted atomic.Bool // some group is aborted: Track wakes the actor

	wsink WorkEventSink // cfg.Events, if it budgets Work events

	// Owned by the actor.
	nextID   WorkID
	flights  map[string]*flight // group → its tracked Works
	fnames   []string           // the keys of flights, sorted
	lastF    *flight            // the flight last looked up (ops come in runs of one group)
	smp      sampling           // the successful-Work-event budget of the current batch
	touched  []*flight          // the flights with Works in the current batch
	batchNo  uint64             // the current batch's number (from 1; a new flight has 0)
	groups   map[string]*watchedGroup
	running  bool
	cancel   context.CancelFunc
	progress *progressWriter // nil without a store
	once     sync.Once
	stopped  atomic.Bool // Stop was called: Deregister does not wait
}

// inMsg is one inbox entry: a TrackWork (ctl nil), or a control message
// (RegisterGroup, DeregisterGroup, SetGroupTimeout). Tracks are kept by
// value so that Track allocates nothing. A track holds its Promise
// (Promise.Retain; held: it is counted) from Track until the drain has
// handled its batch; kept says that the drain passed that reference on to
// the group's Works in flight instead (track). A track folded by the
// next Track of its group (fold) holds nothing.
type inMsg struct {
	track TrackWork
	ctl   any
	held  bool
	kept  bool
	// done: the track's Work completed successfully before the next
	// Track of its group (fold); track.Promise is then nil and the Work's
	// times (Unix ns; started 0 if never started) are here.
	done                        bool
	created, started, completed int64
}

type watchedGroup struct {
	spec      GroupSpec
	abort     Abortable
	async     AsyncErrorSource
	asyncSeen bool
}

// Messages accepted by the watchdog actor (send them with the methods).
type (
	// RegisterGroup starts watching a communicator.
	RegisterGroup struct {
		Spec  GroupSpec
		Comm  Abortable        // may be nil
		Async AsyncErrorSource // may be nil
	}
	// DeregisterGroup stops watching a group (ProcessGroup.Destroy).
	DeregisterGroup struct {
		Group string
		done  chan struct{} // closed once handled (Deregister waits for it)
	}
	// SetGroupTimeout changes a group's default deadline (ProcessGroup.SetTimeout).
	SetGroupTimeout struct {
		Group   string
		Timeout time.Duration
	}
	// TrackWork puts a scheduled Work under the watchdog, through its
	// Promise (the watchdog fails it at its deadline).
	TrackWork struct {
		Group   string
		FP      comm.Fingerprint
		Timeout time.Duration // per-op override (0: the group's)
		Promise *comm.Promise
	}
	watchdogTick  struct{}
	watchdogStore struct{ ev store.Event }
	watchdogDrain struct{} // the inbox has messages that must not wait for the tick
)

// NewWatchdog validates cfg and returns an unstarted watchdog.
func NewWatchdog(cfg WatchdogConfig) (*Watchdog, error) {
	c, err := cfg.Cfg.Validate()
	if err != nil {
		return nil, err
	}
	cfg.Cfg = c
	if cfg.Exit == nil {
		cfg.Exit = os.Exit
	}
	if cfg.Heartbeat == nil {
		cfg.Heartbeat = &Heartbeat{}
	}
	if cfg.IOTimeout <= 0 {
		cfg.IOTimeout = 5 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	core := NewWatchdogCore(CoreConfig{Rank: cfg.Rank, Mode: c.ErrorHandling, Timeout: c.Timeout, ProgressInterval: cfg.ProgressInterval})
	wd := &Watchdog{cfg: cfg, core: core, flights: map[string]*flight{}, groups: map[string]*watchedGroup{}, batchNo: 1}
	wd.wsink, _ = cfg.Events.(WorkEventSink)
	return wd, nil
}

// Heartbeat is the counter the watchdog beats; hand it to the HeartbeatMonitor.
func (wd *Watchdog) Heartbeat() *Heartbeat { return wd.cfg.Heartbeat }

// Props returns the actor's props. The state lives in wd, so a restart
// after a panic keeps every tracked Work. Use the default dispatcher (the
// watchdog must not run on a caller's goroutine).
func (wd *Watchdog) Props() *actor.Props {
	return actors.PersistentProps((*watchdogActor)(wd))
}

// Start spawns the watchdog under parent (nil: the root), starts its ticker
// and, with a store, its watches.
func (wd *Watchdog) Start(system *actor.ActorSystem, parent actors.Spawner) *actor.PID {
	wd.system = system
	wd.pid = actors.SpawnUnder(system, parent, wd.Props(), "")
	return wd.pid
}

// PID is the actor's PID (nil before Start).
func (wd *Watchdog) PID() *actor.PID { return wd.pid }

// Register starts watching group's communicator.
func (wd *Watchdog) Register(spec GroupSpec, abort Abortable, async AsyncErrorSource) {
	wd.post(RegisterGroup{Spec: spec, Comm: abort, Async: async}, true)
}

// Deregister stops watching group. It returns once the watchdog has
// published the group's last Work events and acted on its engine's error
// (the error-handling mode's action, e.g. TearDown), or after
// deregisterWait.
func (wd *Watchdog) Deregister(group string) {
	if wd.stopped.Load() {
		wd.post(DeregisterGroup{Group: group}, false)
		return
	}
	done := make(chan struct{})
	wd.post(DeregisterGroup{Group: group, done: done}, true)
	select {
	case <-done:
	case <-time.After(deregisterWait):
	}
}

// deregisterWait bounds how long Deregister waits for the watchdog.
const deregisterWait = time.Second

// SetTimeout sets group's default deadline for later Works.
func (wd *Watchdog) SetTimeout(group string, d time.Duration) {
	wd.post(SetGroupTimeout{Group: group, Timeout: d}, true)
}

// Track puts p's Work (fingerprint fp, per-op timeout or 0) under the
// watchdog, which fails it through p at its deadline. It never blocks,
// allocates nothing in steady state and, unless a group is aborted, wakes
// no goroutine but once every drainBatch Works: the watchdog picks the
// Work up at its next tick or drain (see Watchdog).
func (wd *Watchdog) Track(group string, fp comm.Fingerprint, timeout time.Duration, p *comm.Promise) {
	held := p.Retain() // the inbox's reference, until the drain (see inMsg)
	aborted := wd.aborted.Load()
	wd.inMu.Lock()
	var folded *comm.Promise
	if n := len(wd.inbox); n > 0 && !aborted {
		folded = wd.inbox[n-1].fold(group)
	}
	wd.inbox = append(wd.inbox, inMsg{track: TrackWork{Group: group, FP: fp, Timeout: timeout, Promise: p}, held: held})
	n := len(wd.inbox)
	wd.inMu.Unlock()
	if folded != nil {
		folded.Release()
	}
	if (n == drainBatch || aborted) && wd.pid != nil {
		wd.system.Root.Send(wd.pid, watchdogDrain{})
	}
}

// fold is Track's look at the inbox's last entry m when a Work of group
// follows it: if m tracks a Work of the same group that has completed
// successfully (a caller that waits for each op, the common case), m
// keeps the Work's final state (its times) and lets go of the Work, and
// fold returns the Promise whose reference m held (the caller releases it
// outside the lock), or nil. So a blocking op's block goes back to its
// pool one op later, while it is still in the CPU's caches, instead of
// after the drain, up to drainBatch ops later; and the drain handles m
// without reading the Work (track). The group's last Work in a batch is
// never folded (the one that folded it follows in the same batch), so
// noteNewest always finds a Promise. Called with inMu held.
func (m *inMsg) fold(group string) *comm.Promise {
	t := &m.track
	if m.ctl != nil || m.done || t.Group != group {
		return nil
	}
	w := t.Promise.Work()
	if !w.IsSuccess() {
		return nil
	}
	m.created, m.started, m.completed = w.UnixNanos()
	m.done = true
	p := t.Promise
	t.Promise = nil
	if !m.held {
		return nil
	}
	m.held = false
	return p
}

// drainBatch is how many tracked Works wake the actor before its tick: at a
// high op rate it then drains them in batches of this size, while they
// are still in the CPU's caches, instead of holding a tick's worth (tens
// of thousands of Works, megabytes the GC must mark) until the tick. One
// wake per drainBatch ops.
const drainBatch = 1024

// post appends control message m to the inbox; wake sends the actor a
// drain message.
func (wd *Watchdog) post(m any, wake bool) {
	wd.inMu.Lock()
	wd.inbox = append(wd.inbox, inMsg{ctl: m})
	wd.inMu.Unlock()
	if wake {
		wd.system.Root.Send(wd.pid, watchdogDrain{})
	}
}

// drain handles the inbox's messages in order (actor goroutine only).
func (wd *Watchdog) drain() {
	for {
		wd.inMu.Lock()
		batch := wd.inbox
		if len(batch) > 0 {
			wd.inbox, wd.spare = wd.spare, nil
		}
		wd.inMu.Unlock()
		if len(batch) == 0 {
			return
		}
		wd.newBatch(len(batch))
		for i := range batch {
			yieldEvery(i)
			if m := &batch[i]; m.ctl != nil {
				wd.handle(m.ctl)
			} else {
				m.kept = wd.track(m, i)
			}
		}
		wd.noteNewest(batch)
		releaseBatch(batch)
		clear(batch)
		wd.spare = batch[:0]
	}
}

// Observer returns the actors.Observer to give group's communicator actor:
// it tracks every scheduled op under its deadline (op.Timeout, else the
// group's).
func (wd *Watchdog) Observer(group string) actors.Observer {
	return actors.ObserverFunc(func(op *comm.Op, p *comm.Promise) { wd.Track(group, op.FP, op.Timeout, p) })
}

// Stop stops the ticker, the watches and the actor, waiting at most
// timeout. Tracked Works are left as they are. Idempotent.
func (wd *Watchdog) Stop(timeout time.Duration) error {
	var err error
	wd.stopped.Store(true)
	wd.once.Do(func() {
		if !actors.StopWithin(wd.system, wd.pid, actors.StopNow, timeout) {
			err = fmt.Errorf("supervisor: watchdog of rank %d did not stop within %v", wd.cfg.Rank, timeout)
		}
	})
	return err
}

type watchdogActor Watchdog

// Receive implements actor.Actor.
func (a *watchdogActor) Receive(ctx actor.Context) {
	wd := (*Watchdog)(a)
	switch m := ctx.Message().(type) {
	case *actor.Started:
		wd.startLoops(ctx)
	case *actor.Stopping:
		if wd.cancel != nil {
			wd.cancel()
		}
		// Publish what happened since the last tick (the Works of the
		// inbox included), so that a Close right after the last op loses
		// no Work event; the core is not stepped (no actions on the way out).
		wd.drain()
		wd.pollWorks(false)
	case watchdogDrain:
		wd.drain()
	case watchdogTick:
		wd.drain()
		wd.tick()
	case watchdogStore:
		wd.drain()
		wd.storeEvent(m.ev)
	case TrackWork, RegisterGroup, DeregisterGroup, SetGroupTimeout:
		wd.drain()
		wd.handle(m)
	}
}

// handle carries out one inbox message (actor goroutine only).
func (wd *Watchdog) handle(msg any) {
	switch m := msg.(type) {
	case RegisterGroup:
		spec := m.Spec
		if spec.CommID == "" {
			spec.CommID = CommID(spec.Name, spec.Epoch)
		}
		wd.groups[spec.Name] = &watchedGroup{spec: spec, abort: m.Comm, async: m.Async}
		if f := wd.flights[spec.Name]; f != nil {
			for i := range f.ws {
				if f.ws[i].fp.Epoch != spec.Epoch {
					f.ws[i].gone = true // the old communicator's; the core drops them too
				}
			}
			f.compact()
		}
		wd.emit(actors.Event{Kind: actors.KindWatchdog, Group: spec.Name, Epoch: spec.Epoch, Action: "watch",
			Detail: map[string]string{"comm_id": spec.CommID, "timeout": spec.Timeout.String()}})
		wd.apply(wd.core.Step(EvAddGroup{Spec: spec}))
	case DeregisterGroup:
		// Publish what the group's Works did since the last tick and act on
		// its engine's error first, so that Destroy (or Close) right after
		// the last op loses no Work event and no error-handling action (a
		// TearDown) and need not wait for a tick.
		wd.pollWorks(true)
		wd.checkAsync(m.Group)
		if m.done != nil {
			defer close(m.done)
		}
		delete(wd.groups, m.Group)
		if f, ok := wd.flights[m.Group]; ok {
			f.drop()
			delete(wd.flights, m.Group)
			wd.lastF = nil
			if i, ok := slices.BinarySearch(wd.fnames, m.Group); ok {
				wd.fnames = slices.Delete(wd.fnames, i, i+1)
			}
		}
		wd.apply(wd.core.Step(EvRemoveGroup{Group: m.Group}))
	case SetGroupTimeout:
		wd.apply(wd.core.Step(EvSetTimeout{Group: m.Group, Timeout: m.Timeout}))
	case TrackWork: // sent as a message rather than through Track: a batch of one
		batch := []inMsg{{track: m, held: m.Promise.Retain()}} // as Track does
		wd.newBatch(1)
		batch[0].kept = wd.track(&batch[0], 0)
		wd.noteNewest(batch)
		releaseBatch(batch)
	}
}

// startLoops starts the ticker and the store watches, once (a restarted
// actor gets Started again and keeps the running ones).
func (wd *Watchdog) startLoops(ctx actor.Context) {
	if wd.running {
		return
	}
	wd.running = true
	lctx, cancel := context.WithCancel(context.Background())
	wd.cancel = cancel
	pid, root := ctx.Self(), wd.system.Root
	go func() {
		t := time.NewTicker(wd.cfg.Cfg.WatchdogInterval)
		defer t.Stop()
		for {
			select {
			case <-lctx.Done():
				return
			case <-t.C:
				root.Send(pid, watchdogTick{})
			}
		}
	}()
	if wd.cfg.Store == nil {
		return
	}
	wd.progress = &progressWriter{pending: map[string][]byte{}, kick: make(chan struct{}, 1)}
	go wd.progress.run(lctx, wd.cfg.Store, wd.cfg.IOTimeout, wd.cfg.Log.With().Int("rank", wd.cfg.Rank).Logger())
	for _, prefix := range []string{AbortPrefix, ProgressPrefix} {
		ch, err := wd.cfg.Store.Watch(lctx, prefix, true)
		if err != nil {
			wd.cfg.Log.Error().Err(err).Int("rank", wd.cfg.Rank).Str("prefix", prefix).
				Msg("watchdog cannot watch the store; peers' aborts will not be seen")
			continue
		}
		go func() {
			for ev := range ch {
				root.Send(pid, watchdogStore{ev: ev})
			}
		}()
	}
}

// find is the tracked Work id, or nil.
func (wd *Watchdog) find(id WorkID) *watched {
	for _, n := range wd.fnames {
		if w := wd.flights[n].find(id); w != nil {
			return w
		}
	}
	return nil
}

// checkAsync lets the core act on group n's engine error, once.
func (wd *Watchdog) checkAsync(n string) {
	g := wd.groups[n]
	if g == nil || g.async == nil || g.asyncSeen {
		return
	}
	if err := g.async.AsyncError(); err != nil {
		g.asyncSeen = true
		wd.emit(actors.Event{Kind: actors.KindWatchdog, Group: n, Epoch: g.spec.Epoch, Action: "async_error", Error: err.Error()})
		wd.apply(wd.core.Step(EvAsyncError{Group: n, Err: err}))
	}
}

// tick polls Works and engines, then lets the core check deadlines.
func (wd *Watchdog) tick() {
	wd.pollWorks(true)
	names := make([]string, 0, len(wd.groups))
	for n := range wd.groups {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		wd.checkAsync(n)
	}
	wd.apply(wd.core.Step(EvTick{Now: wd.cfg.Now()}))
	wd.cfg.Heartbeat.Beat()
}

// storeEvent turns a watched key into a core event.
func (wd *Watchdog) storeEvent(ev store.Event) {
	if ev.Type != store.EventPut {
		return
	}
	switch {
	case strings.HasPrefix(ev.Key, AbortPrefix):
		var rec AbortRecord
		if err := json.Unmarshal(ev.Value, &rec); err != nil {
			wd.cfg.Log.Warn().Err(err).Str("key", ev.Key).Msg("watchdog: unreadable abort record; treating it as an abort by an unknown rank")
			rec = AbortRecord{Rank: -1, Reason: string(ev.Value)}
		}
		wd.apply(wd.core.Step(EvRemoteAbort{CommID: strings.TrimPrefix(ev.Key, AbortPrefix), Record: rec}))
	case strings.HasPrefix(ev.Key, ProgressPrefix):
		rest := strings.TrimPrefix(ev.Key, ProgressPrefix)
		i := strings.LastIndexByte(rest, '/')
		if i < 0 {
			return
		}
		rank, err := strconv.Atoi(rest[i+1:])
		var p Progress
		if err != nil || json.Unmarshal(ev.Value, &p) != nil {
			return
		}
		wd.apply(wd.core.Step(EvProgress{CommID: rest[:i], Rank: rank, Progress: p}))
	}
}

// apply carries out the core's actions in order. Store writes and dumps
// are bounded by IOTimeout.
func (wd *Watchdog) apply(acts []Action) {
	log := wd.cfg.Log
	// Raise the aborted flag before any Work of this step completes, so
	// that a caller who sees its Work fail and tracks the next one already
	// finds the flag set (and wakes the watchdog instead of waiting a tick).
	for _, a := range acts {
		if _, ok := a.(ActAbortComm); ok {
			wd.aborted.Store(true)
		}
	}
	// Abort the communicators before any Work of this step fails: an
	// abort is final only if the peers have learned of it (the engine's
	// Abort waits for that) before the caller, seeing its Work fail, can
	// go on to meet them elsewhere.
	for _, a := range acts {
		if a, ok := a.(ActAbortComm); ok {
			log.Error().Err(a.Reason).Int("rank", wd.cfg.Rank).Str("group", a.Group).Msg("watchdog: aborting communicator")
			if g := wd.groups[a.Group]; g != nil && g.abort != nil {
				g.abort.Abort(a.Reason)
			}
		}
	}
	for _, a := range acts {
		switch a := a.(type) {
		case ActFailWork:
			tw := wd.find(a.ID)
			if tw == nil || tw.gone {
				continue
			}
			tw.gone = true
			// The abort above may have completed the Work first (with its
			// own error); either way this is its end.
			tw.p.Complete(a.Err)
			w := tw.p.Work()
			wd.finish(tw.group, &tw.fp, w, tw.events, w.Timings(), w.Err())
			if errors.Is(a.Err, comm.ErrTimeout) {
				log.Error().Err(a.Err).Int("rank", wd.cfg.Rank).Str("group", tw.group).Uint64("seq", tw.fp.Seq).Msg("watchdog: work timed out")
				wd.emit(actors.Event{Kind: actors.KindWatchdog, Group: tw.group, Epoch: tw.epoch, Seq: tw.fp.Seq,
					Op: tw.fp.Op.String(), Action: "timeout", Error: a.Err.Error()})
			}
		case ActAbortComm:
			g := wd.groups[a.Group] // aborted above
			ev := actors.Event{Kind: actors.KindCommAbort, Group: a.Group, Error: a.Reason.Error(), Action: "abort"}
			if g != nil {
				ev.Epoch = g.spec.Epoch
			}
			wd.emit(ev)
		case ActWriteAbort:
			wd.storeSet(AbortKey(a.CommID), a.Record)
			wd.emit(actors.Event{Kind: actors.KindWatchdog, Group: a.Record.Group, Epoch: a.Record.Epoch,
				Action: "write_abort", Error: a.Record.Reason, Detail: map[string]string{"comm_id": a.CommID}})
		case ActPublishProgress:
			if wd.progress != nil {
				data, _ := json.Marshal(a.Progress)
				wd.progress.put(ProgressKey(a.CommID, wd.cfg.Rank), data)
			}
		case ActDump:
			if wd.cfg.Dumper != nil {
				ctx, cancel := context.WithTimeout(context.Background(), wd.cfg.IOTimeout)
				if err := wd.cfg.Dumper.Dump(ctx, a.Reason); err != nil {
					log.Error().Err(err).Int("rank", wd.cfg.Rank).Msg("watchdog: flight-recorder dump failed")
				}
				cancel()
			}
			wd.emit(actors.Event{Kind: actors.KindWatchdog, Action: "dump", Error: a.Reason})
		case ActTearDown:
			log.Error().Int("rank", wd.cfg.Rank).Int("exit_code", a.Code).Str("reason", a.Reason).
				Str("mode", wd.cfg.Cfg.ErrorHandling.String()).Msg("watchdog: tearing the process down")
			wd.emit(actors.Event{Kind: actors.KindWatchdog, Action: "teardown", Error: a.Reason,
				Detail: map[string]string{"exit_code": strconv.Itoa(a.Code), "mode": wd.cfg.Cfg.ErrorHandling.String()}})
			wd.cfg.Exit(a.Code)
		}
	}
}

func (wd *Watchdog) storeSet(key string, v any) {
	if wd.cfg.Store == nil {
		return
	}
	data, err := json.Marshal(v)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), wd.cfg.IOTimeout)
		err = wd.cfg.Store.Set(ctx, key, data)
		cancel()
	}
	if err != nil {
		wd.cfg.Log.Warn().Err(err).Int("rank", wd.cfg.Rank).Str("key", key).Msg("watchdog: store write failed")
	}
}

func (wd *Watchdog) emit(ev actors.Event) {
	if wd.cfg.Events != nil {
		wd.cfg.Events.Emit(ev)
	}
}

// progressWriter writes progress keys from its own goroutine, keeping only
// the latest value per key, so that a slow or unreachable store never
// stalls the watchdog's ticks. The actor puts; the goroutine writes.
type progressWriter struct {
	mu      sync.Mutex
	pending map[string][]byte
	kick    chan struct{}
}

func (p *progressWriter) put(key string, v []byte) {
	p.mu.Lock()
	p.pending[key] = v
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (p *progressWriter) run(ctx context.Context, st store.Store, timeout time.Duration, log zerolog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		}
		p.mu.Lock()
		batch := p.pending
		p.pending = map[string][]byte{}
		p.mu.Unlock()
		for k, v := range batch {
			wctx, cancel := context.WithTimeout(ctx, timeout)
			err := st.Set(wctx, k, v)
			cancel()
			if err != nil && ctx.Err() == nil {
				log.Warn().Err(err).Str("key", k).Msg("watchdog: publishing progress failed")
			}
		}
	}
}
