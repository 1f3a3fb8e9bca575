package supervisor

import (
	"runtime"
	"slices"
	"time"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
)

// This file is the watchdog actor's pass over the Works it tracks: what it
// does with each Work when it first sees it (at the drain of its inbox),
// at its ticks while the Work is in flight, and when the Work ends; the
// events it publishes for them and the metrics it feeds. The decisions
// (deadlines, incidents) stay in the core (watchdog_core.go).
//
// At a high op rate almost every Work has already completed when the
// watchdog first sees it (it drains its inbox at its tick). Such a Work
// takes the short path: it never enters the core's map or deadline heap,
// only its group's watermarks move (WatchdogCore.Finished), its metrics
// are counted (WorkMetrics, no Event built) and its events are built only
// if the sampling admits it. A Work still in flight, or failed, takes the
// full path: tracked by the core under its deadline, read at each tick.

// WorkEventSink is an EventSink that lets the watchdog sample successful
// Work events once per batch of Works instead of once per event
// (*actors.EventPublisher satisfies it; see its WorkEventBudget). With a
// plain EventSink the watchdog publishes every Work event.
type WorkEventSink interface {
	EventSink
	// WorkEventBudget takes up to want tokens of successful Work events
	// (actors.EventPublisher.WorkEventBudget).
	WorkEventBudget(want int) actors.WorkBudget
	// EmitBudgeted publishes a successful Work event without sampling it
	// again (actors.EventPublisher.EmitBudgeted).
	EmitBudgeted(ev actors.Event)
}

// WorkMetrics receives the outcome of every Work the watchdog tracks,
// exactly (never sampled) and without an Event per Work: WorkScheduled
// when the watchdog first sees a Work, WorkDone when it sees it end (once
// per Work), and FlushWorks after each tick's pass (and when the watchdog
// stops or deregisters a group), after which the counts are visible.
// dur is the time from the Work's start on its engine (its creation if it
// never started) to its end. Calls come from the watchdog actor, one at a
// time, and must be quick and never block. The rank's Prometheus metrics
// (internal/metrics.Rank) implement it.
type WorkMetrics interface {
	WorkScheduled(group string, op comm.OpType)
	WorkDone(group string, fp comm.Fingerprint, dur time.Duration, err error)
	FlushWorks()
}

// eventsPerWork is how many successful events a Work admitted by the
// sampling publishes: scheduled, started and completed.
const eventsPerWork = 3

// sampling is the watchdog's share of the successful-Work-event budget
// (actor only). Within one batch of n Works it admits k of them, spread
// evenly (Bresenham), and publishes all events of those; every other
// Work's successful events are left out, except a completion that took
// slow or more and, at each tick, the newest Work of each busy group.
type sampling struct {
	on   bool          // successful Work events are published at all
	slow time.Duration // completions this long always go out (0: no such rule)
	k, n int           // admit k of the batch's n Works
	acc  int
}

// newBatch refreshes the sampling for a batch of n Works, taking the
// batch's tokens from the sink.
func (wd *Watchdog) newBatch(n int) {
	s := &wd.smp
	s.k, s.n, s.acc = 0, max(n, 1), 0
	switch {
	case wd.cfg.Events == nil:
		s.on = false
	case wd.wsink == nil:
		s.on, s.k = true, n
	default:
		b := wd.wsink.WorkEventBudget(eventsPerWork * n)
		s.on, s.slow, s.k = b.On, b.SlowOp, b.Events/eventsPerWork
	}
}

// refreshSampling refreshes only whether Work events are published and
// the slow-op rule (a tick's pass), leaving a batch under way as it is.
func (wd *Watchdog) refreshSampling() {
	s := &wd.smp
	switch {
	case wd.cfg.Events == nil:
		s.on = false
	case wd.wsink == nil:
		s.on = true
	default:
		b := wd.wsink.WorkEventBudget(0)
		s.on, s.slow = b.On, b.SlowOp
	}
}

// admit reports whether the batch's next Work has its events published.
func (s *sampling) admit() bool {
	if !s.on || s.k == 0 {
		return false
	}
	s.acc += s.k
	if s.acc >= s.n {
		s.acc -= s.n
		return true
	}
	return false
}

// published reports whether a Work's end is published: an admitted
// Work's, a failure, or a completion that took slow or more.
func (s *sampling) published(admitted bool, dur time.Duration, err error) bool {
	return admitted || err != nil || (s.on && s.slow > 0 && dur >= s.slow)
}

// watched is a Work the watchdog tracks, or has just seen end. Each one
// in a flight's ws, and its newest, holds its Promise (Promise.Retain)
// until it leaves (compact, publishNewest, drop), so that a blocking op's
// block is not reused while the watchdog may read or fail it.
type watched struct {
	id      WorkID
	p       *comm.Promise // the watchdog fails the Work through it
	group   string
	epoch   uint32
	fp      comm.Fingerprint
	started bool
	gone    bool // finished or dropped: removed at the group's next compaction
	events  bool // admitted by the sampling: all its events are published
	held    bool // p is counted: the entry holds a reference (Promise.Retain)
}

// release drops the entry's reference to its Promise, if it holds one.
func (w *watched) release() {
	if w.held {
		w.p.Release()
	}
}

// flight is one group's Works in flight, in tracking (id) order, and its
// newest Work since the last tick.
type flight struct {
	name string
	ws   []watched
	// newest is the group's last tracked Work since the last tick (id 0:
	// none, the group was idle); its state is published at the tick
	// whatever the sampling (see Watchdog.publishNewest).
	newest watched
	// Within a batch of the inbox (drain): the batch's number, and the
	// index, id and admission of the group's last Work in it, copied to
	// newest at the batch's end (noteNewest).
	batchNo      uint64
	lastAt       int
	lastID       WorkID
	lastAdmitted bool
}

// find is the tracked Work id, or nil.
func (f *flight) find(id WorkID) *watched {
	i, ok := slices.BinarySearchFunc(f.ws, id, func(w watched, id WorkID) int { return cmpU64(uint64(w.id), uint64(id)) })
	if !ok {
		return nil
	}
	return &f.ws[i]
}

// compact removes gone Works, keeping the order and the slice's memory,
// and releases them.
func (f *flight) compact() {
	keep := f.ws[:0]
	for _, w := range f.ws {
		if !w.gone {
			keep = append(keep, w)
		} else {
			w.release()
		}
	}
	clear(f.ws[len(keep):])
	f.ws = keep
}

// drop releases every Work f holds, the group being forgotten.
func (f *flight) drop() {
	for i := range f.ws {
		f.ws[i].release()
	}
	clear(f.ws)
	f.ws = f.ws[:0]
	if f.newest.id != 0 {
		f.newest.release()
		f.newest = watched{}
	}
}

// releaseBatch releases the Promises of an inbox batch's tracks that the
// drain did not keep (inMsg), after noteNewest took its own references.
// It touches no uncounted Promise (an async op's Work, long out of the
// caches by now).
func releaseBatch(batch []inMsg) {
	for i := range batch {
		if m := &batch[i]; m.held && !m.kept {
			m.track.Promise.Release()
		}
	}
}

// flight is group's flight, created on first use (actor only).
func (wd *Watchdog) flight(group string) *flight {
	if f := wd.lastF; f != nil && f.name == group {
		return f
	}
	f := wd.flights[group]
	if f == nil {
		f = &flight{name: group}
		wd.flights[group] = f
		i, _ := slices.BinarySearch(wd.fnames, group)
		wd.fnames = slices.Insert(wd.fnames, i, group)
	}
	wd.lastF = f
	return f
}

// track is the watchdog's first look at a Work, the i-th message of the
// inbox's batch (actor goroutine, at the drain). A Work that already
// completed successfully takes the short path (see the top of this
// file); any other goes under the core's deadline, and track reports
// that it kept the inbox's reference to its Promise for that (inMsg).
func (wd *Watchdog) track(in *inMsg, i int) (kept bool) {
	m, held := &in.track, in.held
	wd.nextID++
	id := wd.nextID
	f := wd.flight(m.Group)
	admitted := wd.smp.admit()
	if f.batchNo != wd.batchNo {
		f.batchNo = wd.batchNo
		wd.touched = append(wd.touched, f)
	}
	f.lastAt, f.lastID, f.lastAdmitted = i, id, admitted
	if wd.cfg.Metrics != nil {
		wd.cfg.Metrics.WorkScheduled(m.Group, m.FP.Op)
	}
	if in.done {
		wd.core.Finished(m.Group, m.FP) // false on an aborted group: see endedOK
		wd.endedOK(in, admitted)
		return false
	}
	w := m.Promise.Work()
	if w.IsSuccess() && wd.core.Finished(m.Group, m.FP) {
		in.created, in.started, in.completed = w.UnixNanos()
		wd.endedOK(in, admitted)
		return false
	}
	f.ws = append(f.ws, watched{id: id, p: m.Promise, group: m.Group, epoch: m.FP.Epoch, fp: m.FP, events: admitted, held: held})
	if admitted {
		wd.emitWork(m.Group, &m.FP, w, actors.StateScheduled, w.Timings())
	}
	if acts := wd.core.Scheduled(EvScheduled{ID: id, Group: m.Group, FP: m.FP, Timeout: m.Timeout, At: w.Timings().Created}); len(acts) > 0 {
		wd.apply(acts)
	}
	return true
}

// endedOK counts and samples a Work that completed successfully before
// the watchdog first saw it, from its times in the inbox entry (Unix ns:
// folded at Track, inMsg.fold, or copied at the drain), without building
// its Timings unless an event is published. A folded Work's group may
// have been aborted since (WatchdogCore.Finished then moves nothing); the
// full path would only fail it in vain, since it had succeeded, so the
// outcome is the same: a success, counted and sampled.
func (wd *Watchdog) endedOK(in *inMsg, admitted bool) {
	m := &in.track
	dur := spanNanos(in.created, in.started, in.completed)
	if wd.cfg.Metrics != nil {
		wd.cfg.Metrics.WorkDone(m.Group, m.FP, dur, nil)
	}
	if wd.cfg.Events == nil || !wd.smp.published(admitted, dur, nil) {
		return
	}
	t := comm.Timings{Created: time.Unix(0, in.created), Completed: time.Unix(0, in.completed)}
	if in.started != 0 {
		t.Started = time.Unix(0, in.started)
	}
	if admitted {
		wd.emitWork(m.Group, &m.FP, nil, actors.StateScheduled, t)
		if in.started != 0 {
			wd.emitWork(m.Group, &m.FP, nil, actors.StateStarted, t)
		}
	}
	wd.emitWork(m.Group, &m.FP, nil, actors.StateCompleted, t)
}

// noteNewest records, at the end of an inbox batch, each group's last
// Work in it as the group's newest (publishNewest), holding its Promise.
func (wd *Watchdog) noteNewest(batch []inMsg) {
	for _, f := range wd.touched {
		if wd.flights[f.name] != f {
			continue // its group was deregistered within the batch
		}
		if f.newest.id != 0 {
			f.newest.release()
			f.newest = watched{}
		}
		if batch[f.lastAt].done {
			continue // never the case (see inMsg.fold), but it has no Promise
		}
		m := &batch[f.lastAt].track
		held := batch[f.lastAt].held && m.Promise.Retain()
		f.newest = watched{id: f.lastID, p: m.Promise, group: m.Group, epoch: m.FP.Epoch, fp: m.FP, events: f.lastAdmitted, held: held}
	}
	clear(wd.touched)
	wd.touched = wd.touched[:0]
	wd.batchNo++
}

// finish is the end of a Work of group (fingerprint fp, Work w, admitted
// by the sampling or not) that completed with err: its metrics, and its
// last event if the sampling publishes it.
func (wd *Watchdog) finish(group string, fp *comm.Fingerprint, w *comm.Work, admitted bool, t comm.Timings, err error) {
	dur := workDuration(t)
	if wd.cfg.Metrics != nil {
		wd.cfg.Metrics.WorkDone(group, *fp, dur, err)
	}
	if wd.cfg.Events != nil && wd.smp.published(admitted, dur, err) {
		wd.emitWork(group, fp, w, stateOf(err), t)
	}
}

// spanNanos is workDuration from a Work's raw times (Work.UnixNanos:
// created, started and completed, 0 if not yet).
func spanNanos(created, started, completed int64) time.Duration {
	if completed == 0 {
		return 0
	}
	if started == 0 {
		started = created
	}
	return time.Duration(completed - started)
}

// workDuration is the time from a Work's start (its creation if it never
// started) to its completion; 0 before it completes.
func workDuration(t comm.Timings) time.Duration {
	if t.Completed.IsZero() {
		return 0
	}
	// Not Time.Sub, which checks for overflow at twice the cost: these
	// are wall-clock times a few hours apart at most.
	return spanNanos(unixOrZero(t.Created), unixOrZero(t.Started), t.Completed.UnixNano())
}

// unixOrZero is t in Unix ns, 0 for the zero Time (Work.UnixNanos' "not
// yet").
func unixOrZero(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// pollWorks reads the state of the Works in flight, in tracking order per
// group: it publishes their starts and ends (as the sampling says),
// counts their metrics and forgets finished ones; with step it also feeds
// them to the core (its watermarks) and carries out its actions. Then it
// publishes each busy group's newest Work (publishNewest) and flushes the
// metrics. Each Work is read once, with no sort, map or allocation.
func (wd *Watchdog) pollWorks(step bool) {
	wd.refreshSampling()
	for _, n := range wd.fnames {
		f := wd.flights[n]
		// The core's actions (apply) may mark Works of f gone but never
		// resize f.ws, so the pass may hold pointers into it.
		for i := range f.ws {
			yieldEvery(i)
			tw := &f.ws[i]
			if tw.gone {
				continue
			}
			w := tw.p.Work()
			t := w.Timings()
			if !tw.started && !t.Started.IsZero() {
				tw.started = true
				if tw.events {
					wd.emitWork(tw.group, &tw.fp, w, actors.StateStarted, t)
				}
				if step {
					wd.core.Started(tw.id)
				}
			}
			if w.IsCompleted() {
				tw.gone = true
				err := w.Err()
				wd.finish(tw.group, &tw.fp, w, tw.events, w.Timings(), err)
				if step {
					if acts := wd.core.Completed(tw.id, err); len(acts) > 0 {
						wd.apply(acts)
					}
				}
			}
		}
		wd.publishNewest(f)
		f.compact()
	}
	if wd.cfg.Metrics != nil {
		wd.cfg.Metrics.FlushWorks()
	}
}

// publishNewest publishes the state of f's newest Work since the last
// tick if the sampling left it out, so that a viewer of the events
// (`rankrunner events`) sees every busy group's latest seq at every tick:
// a Work still in flight is admitted from then on (its end follows); a
// finished one gets its completion event.
func (wd *Watchdog) publishNewest(f *flight) {
	nw := f.newest
	if nw.id == 0 {
		return
	}
	f.newest = watched{}
	defer nw.release()
	if nw.events || !wd.smp.on {
		return
	}
	if tw := f.find(nw.id); tw != nil && !tw.gone {
		tw.events = true
		state := actors.StateScheduled
		if tw.started {
			state = actors.StateStarted
		}
		wd.emitWork(tw.group, &tw.fp, tw.p.Work(), state, tw.p.Work().Timings())
		return
	}
	w := nw.p.Work()
	if !w.IsCompleted() {
		return // dropped (a new epoch), not ended: nothing to say
	}
	t, err := w.Timings(), w.Err()
	if !wd.smp.published(false, workDuration(t), err) {
		wd.emitWork(nw.group, &nw.fp, w, stateOf(err), t)
	}
}

// yieldBatch is how many Works the actor handles between yields.
const yieldBatch = 256

// yieldEvery lets other goroutines run after every yieldBatch Works of a
// tick. A rank often runs on one thread (rankrunner sets GOMAXPROCS=1):
// without it, a tick after a burst of small ops (thousands of Works)
// would hold the thread for a long stretch while the training goroutine
// waits for it, which is the long tail the watchdog used to add to op
// latency (issue 15).
func yieldEvery(i int) {
	if i > 0 && i%yieldBatch == 0 {
		runtime.Gosched()
	}
}

func stateOf(err error) string {
	if err != nil {
		return actors.StateFailed
	}
	return actors.StateCompleted
}

// emitWork publishes the change to state of Work w of group (fingerprint
// fp; w nil: a Work that succeeded before the watchdog saw it, endedOK),
// stamped with the Work's own time of the change (t: its timings; the
// watchdog sees changes at its tick, after the fact). Successful events go
// out unsampled (EmitBudgeted): the watchdog has done the sampling.
func (wd *Watchdog) emitWork(group string, fp *comm.Fingerprint, w *comm.Work, state string, t comm.Timings) {
	if wd.cfg.Events == nil {
		return
	}
	ev := actors.Event{Kind: actors.KindWork, Group: group, Epoch: fp.Epoch, Op: fp.Op.String(), State: state,
		DType: fp.DType.String(), Count: fp.Count}
	if fp.Op.IsP2P() {
		ev.P2PSeq = fp.Seq
	} else {
		ev.Seq = fp.Seq
	}
	switch state {
	case actors.StateScheduled:
		ev.Time = t.Created
	case actors.StateStarted:
		ev.Time = t.Started
	default:
		ev.Time = t.Completed
		if !t.Completed.IsZero() {
			ev.DurUS = float64(workDuration(t).Nanoseconds()) / 1e3
		}
		if w != nil {
			if err := w.Err(); err != nil {
				ev.Error = err.Error()
			}
		}
	}
	if wd.wsink != nil && ev.Error == "" {
		wd.wsink.EmitBudgeted(ev)
		return
	}
	wd.cfg.Events.Emit(ev)
}
