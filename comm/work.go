package comm

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Work is the handle of one asynchronous operation, as c10d's Work: wait
// for it, poll it, read its error and timings. It is read-only, as a
// context.Context is: only its Promise, held by whoever runs the op (the
// communicator actor, the engine, the watchdog, a comm hook), completes
// it. A Work completes exactly once. Safe for concurrent use.
type Work struct {
	op     OpType
	seq    atomic.Uint64 // published after fp (SetFingerprint)
	fp     Fingerprint   // the op's identity, written once before seq
	source atomic.Int64  // sending rank of a Recv (AnySource resolves here)
	done   chan struct{}
	once   sync.Once
	err    error

	created   time.Time
	started   atomic.Int64 // unix nanos
	completed atomic.Int64 // unix nanos

	// blocking wait (SetDeadline): set once, before the Work is returned.
	deadline  time.Time
	onTimeout func(elapsed time.Duration) error

	// after, if set before the Work is handed out, runs once when it
	// completes (ProcessGroup.submit: stop watching the op's ctx).
	after func()

	// spin (SetSpinWait, nanoseconds): how long Wait polls before blocking.
	// Atomic: the engine sets it when it takes the Work, which the caller
	// may already be waiting on.
	spin atomic.Int64

	// inline (SetInline) holds the InlineStream the op is queued on; set
	// by the engine at launch, which a waiter may already be waiting on.
	inline atomic.Value
	// opDone is the Done channel of the ctx given to the op's ProcessGroup
	// method (nil: none), set before the Work is handed out: a Wait with
	// that same ctx may run the op inline (see Wait).
	opDone <-chan struct{}
}

// Promise is the producer side of a Work, as a cancel func is to its
// Context: it completes the Work and records what the engine learns
// (identity, start time, a Recv's source). It is held by the runtime, the
// communicator actor, the engines, the watchdog and comm hooks, and never
// returned by ProcessGroup methods, whose callers get the read-only Work.
// The Work lives inside the Promise: a Promise costs the one allocation
// (and done channel) that a Work alone did.
type Promise struct {
	w Work
}

// NewPromise returns a Promise for an incomplete Work of op. The
// communicator's caller (ProcessGroup) creates one per op and hands it to
// the Launcher; engines and the watchdog complete it. A comm hook
// (reducer.CommHook) or a fake process group written by a user may create
// its own, return p.Work() and complete it when its result is ready, as a
// torch comm hook returns a Future it fulfils.
func NewPromise(op OpType) *Promise {
	p := &Promise{w: Work{op: op, done: make(chan struct{}), created: time.Now()}}
	p.w.source.Store(-1)
	return p
}

// Work is the read-only handle of p's op, to hand to callers. It is the
// same *Work for every call.
func (p *Promise) Work() *Work { return &p.w }

// InlineStream is an engine's ordered stream of ops on which a waiter may
// run its own op (the CPU engine implements it): RunInline runs w's op on
// the calling goroutine if it is next on the stream and the stream is
// idle, completing w through the Promise the engine holds for it, and
// reports whether it did; otherwise it does nothing and returns false at
// once.
type InlineStream interface {
	RunInline(w *Work) bool
}

// SetInline tells the Work which stream its op is queued on, so that Wait
// may run it on the waiting goroutine (see Work.Wait). Engines call it in
// Launch, before queueing the op; s must be a pointer (storing it does not
// allocate).
func (p *Promise) SetInline(s InlineStream) { p.w.inline.Store(s) }

// Timings are a Work's timestamps; zero values mean "not yet".
type Timings struct {
	Created   time.Time // when the ProcessGroup method was called
	Started   time.Time // when the engine began executing it
	Completed time.Time // when it completed or failed
}

// FailedWork returns a Work of op already completed with err (nil: an op
// that does nothing, as on a non-member). ProcessGroup methods return one
// for bad input or a destroyed group, and comm hooks for a bucket they
// cannot reduce. It gives no producer access: nothing can complete the
// Work again.
func FailedWork(op OpType, err error) *Work {
	p := NewPromise(op)
	p.Complete(err)
	return p.Work()
}

// Wait blocks until the Work completes or ctx ends, and returns the Work's
// error (nil on success) or ctx's error. Wait's ctx bounds only the wait:
// it does not cancel the op, which stays in flight under the watchdog (the
// ctx given to the op's ProcessGroup method is the one that bounds the op). With blocking wait
// (Promise.SetDeadline) Wait also returns the deadline's error, typically a
// *TimeoutError, once the deadline passes. c10d: Work.wait().
//
// Fewer hand-offs: if the op is still queued on an idle engine stream
// (Promise.SetInline) and nothing could end this Wait before the op ends (no
// blocking-wait deadline, and ctx is either never done or, without a
// deadline, the very ctx given to the op's method, whose cancellation
// aborts the op), Wait runs the op itself on the calling goroutine
// instead of waiting to be woken by the engine's progress goroutine. The
// op keeps its place in the launch order and its supervision (watchdog
// deadline, flight recorder, events).
func (w *Work) Wait(ctx context.Context) error {
	select {
	case <-w.done:
		return w.err
	default:
	}
	if s, ok := w.inline.Load().(InlineStream); ok && w.onTimeout == nil && w.inlineWait(ctx) && s.RunInline(w) {
		<-w.done
		return w.err
	}
	if d := time.Duration(w.spin.Load()); d > 0 && w.spinUntilDone(d) {
		return w.err
	}
	var expired <-chan time.Time
	if w.onTimeout != nil {
		t := time.NewTimer(time.Until(w.deadline))
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-w.done:
		return w.err
	case <-ctx.Done():
		return ctx.Err()
	case <-expired:
		select {
		case <-w.done:
			return w.err
		default:
		}
		return w.onTimeout(time.Since(w.created))
	}
}

// inlineWait reports whether a Wait with ctx may run the op inline: ctx
// cannot end the wait before the op ends.
func (w *Work) inlineWait(ctx context.Context) bool {
	d := ctx.Done()
	if d == nil {
		return true
	}
	if d != w.opDone {
		return false
	}
	_, has := ctx.Deadline()
	return !has
}

// SetDeadline turns on blocking wait for p's Work (c10d
// TORCH_NCCL_BLOCKING_WAIT): once deadline passes, Work.Wait returns
// onTimeout(elapsed since creation) instead of blocking on; the op itself
// stays under the watchdog. Call it before the Work is handed to the caller
// (the runtime does so at submission when RANKTREE_BLOCKING_WAIT is set).
func (p *Promise) SetDeadline(deadline time.Time, onTimeout func(elapsed time.Duration) error) {
	p.w.deadline, p.w.onTimeout = deadline, onTimeout
}

// SetSpinWait makes Work.Wait poll the Work's completion for up to d before
// it blocks, so that a waiter whose op finishes within d on another thread
// pays no OS wake-up (the choice CUDA makes with cudaDeviceScheduleSpin).
// The poll burns the waiting goroutine's core; ctx and the blocking-wait
// deadline are checked once it ends. Engines call it (the NCCL engine:
// Options.SpinWait) when they take the Work; a Wait already blocked is not
// affected. d ≤ 0 turns it off.
func (p *Promise) SetSpinWait(d time.Duration) { p.w.spin.Store(int64(d)) }

// SpinWait is the poll time its Promise set (Promise.SetSpinWait; 0: none).
func (w *Work) SpinWait() time.Duration { return time.Duration(w.spin.Load()) }

// spinUntilDone polls for completion for up to d and reports whether the
// Work completed meanwhile (a non-blocking receive from an open channel
// takes no lock). It yields nothing to the scheduler: a goroutine locked
// to its thread would hand its P off at every yield.
func (w *Work) spinUntilDone(d time.Duration) bool {
	end := time.Now().Add(d)
	for i := 0; ; i++ {
		if w.IsCompleted() {
			return true
		}
		if i&63 == 63 && time.Now().After(end) {
			return w.IsCompleted()
		}
	}
}

// Done is closed when the Work completes.
func (w *Work) Done() <-chan struct{} { return w.done }

// IsCompleted reports whether the Work has completed (c10d is_completed).
func (w *Work) IsCompleted() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// IsSuccess reports whether the Work completed without error (c10d
// is_success); false while it is in flight.
func (w *Work) IsSuccess() bool { return w.IsCompleted() && w.err == nil }

// Err is the Work's error once it completed; nil while it is in flight or
// if it succeeded.
func (w *Work) Err() error {
	select {
	case <-w.done:
		return w.err
	default:
		return nil
	}
}

// Seq is the op's sequence number in its group (the P2P sequence for
// Send/Recv), assigned by the communicator actor when it schedules the op;
// 0 before that and for ops rejected for bad input.
func (w *Work) Seq() uint64 { return w.seq.Load() }

// SetSeq records the sequence number alone (BatchP2P's per-entry Works,
// tests and engines driven without a communicator); the communicator actor
// calls SetFingerprint.
func (p *Promise) SetSeq(seq uint64) { p.w.seq.Store(seq) }

// SetFingerprint records the op's identity {group, epoch, seq, op, dtype,
// count, root} and its sequence number. The group's communicator actor,
// the only owner of op identity, calls it once when it schedules the op,
// before launch; the fingerprint is published by the seq's atomic store.
func (p *Promise) SetFingerprint(fp Fingerprint) {
	p.w.fp = fp
	p.w.seq.Store(fp.Seq)
}

// Fingerprint is the op's identity as its group's communicator assigned
// it (group hash, epoch, seq, op, dtype, count, root); the zero
// Fingerprint before that, and for ops rejected for bad input. Errors that
// name the op (*TimeoutError, *CanceledError) take it from here.
func (w *Work) Fingerprint() Fingerprint {
	if w.seq.Load() == 0 {
		return Fingerprint{}
	}
	return w.fp
}

// OpType is the kind of operation.
func (w *Work) OpType() OpType { return w.op }

// Source is the group rank a Recv received from (useful with AnySource);
// -1 for other ops or before completion.
func (w *Work) Source() int { return int(w.source.Load()) }

// SetSource records a Recv's sending rank; called by engines before Complete.
func (p *Promise) SetSource(rank int) { p.w.source.Store(int64(rank)) }

// MarkStarted records the time the engine began the op; called by engines.
// Only the first call has an effect.
func (p *Promise) MarkStarted() { p.w.started.CompareAndSwap(0, time.Now().UnixNano()) }

// Complete finishes p's Work with err (nil for success) and wakes its
// waiters. Only the first call has an effect; it returns whether this call
// completed the Work. Called by engines, the communicator actor (also for
// a cancelled ctx), the watchdog and comm hooks.
func (p *Promise) Complete(err error) bool { return p.w.complete(err) }

// BindContext ties p's Work to ctx, the ctx given to the op's
// ProcessGroup method: when ctx is done before the Work completes,
// onDone runs once (on a goroutine of its own; it typically aborts the
// communicator and completes p with a *CanceledError), and Work.Wait with
// that same ctx may run the op inline (see Work.Wait). Completing the Work
// unregisters onDone (onDone must itself check Work.IsCompleted: a
// completion racing with BindContext may leave it registered until ctx
// ends). Call it at most once, before the Work can complete
// (the launcher does so in Submit); a nil ctx or one that is never done
// binds nothing.
func (p *Promise) BindContext(ctx context.Context, onDone func()) {
	if ctx == nil || ctx.Done() == nil {
		return
	}
	w := &p.w
	w.opDone = ctx.Done()
	// w.after is set before the AfterFunc exists, so that an onDone
	// racing with this call never reads it while it is written; a
	// completion that comes before stop is stored leaves the AfterFunc to
	// find the Work completed.
	var stop atomic.Pointer[func() bool]
	then := w.after
	w.after = func() {
		if s := stop.Load(); s != nil {
			(*s)()
		}
		if then != nil {
			then()
		}
	}
	s := context.AfterFunc(ctx, onDone)
	stop.Store(&s)
}

// complete is Promise.Complete.
func (w *Work) complete(err error) bool {
	first := false
	w.once.Do(func() {
		w.err = err
		w.completed.Store(time.Now().UnixNano())
		close(w.done)
		first = true
		if w.after != nil {
			w.after()
		}
	})
	return first
}

// Timings returns the Work's timestamps.
func (w *Work) Timings() Timings {
	t := Timings{Created: w.created}
	if s := w.started.Load(); s != 0 {
		t.Started = time.Unix(0, s)
	}
	if c := w.completed.Load(); c != 0 {
		t.Completed = time.Unix(0, c)
	}
	return t
}
