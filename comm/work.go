package comm

import (
	"context"
	"runtime"
	"sync/atomic"
	"time"
)

// Work is the handle of one asynchronous operation, as c10d's Work: wait
// for it, poll it, read its error and timings. It is read-only, as a
// context.Context is: only its Promise, held by whoever runs the op (the
// communicator actor, the engine, the watchdog, a comm hook), completes
// it. A Work completes exactly once. Safe for concurrent use.
type Work struct {
	state atomic.Uint32 // workPending, workCompleting, workDone (workFreed: see opblock.go)
	// ref counts the holders of a blocking op's Promise (opblock.go):
	// refUncounted for every other Promise, n ≥ 1 while held, refFreed
	// once released to the pool. It lives in the Work, beside state, so
	// that an async op's block stays within 512 bytes.
	ref    atomic.Int32
	source atomic.Int32  // sending rank of a Recv (AnySource resolves here)
	op     OpType        // beside source: the two share 8 bytes
	seq    atomic.Uint64 // published after fp (SetFingerprint)
	fp     Fingerprint   // the op's identity, written once before seq
	err    error         // written by the completing call before state becomes workDone
	// done is the channel Done returns and a blocked Wait waits on,
	// created only when one is needed before completion (most small ops
	// complete before anyone blocks on them): nil until then; closedChan
	// once the Work completed (complete swaps it in and closes what was
	// there).
	done atomic.Pointer[chan struct{}]

	// timestamps, in nanoseconds since clockBase (monotonic; 0: not yet)
	created   int64
	started   atomic.Int64
	completed atomic.Int64

	// blocking wait (SetDeadline), or nil: set once, before the Work is
	// returned.
	bw *blockingWait

	// after, if set before the Work is handed out, runs once when it
	// completes, before it is seen complete (ProcessGroup.submitThen:
	// BatchP2P's per-op Works).
	after func()

	// spin (SetSpinWait, nanoseconds): how long Wait polls before blocking.
	// Atomic: the engine sets it when it takes the Work, which the caller
	// may already be waiting on.
	spin atomic.Int64

	// inline (SetInline) holds the InlineStream the op is queued on; set
	// by the engine at launch, which a waiter may already be waiting on.
	inline atomic.Value
	// opDone is the Done channel of the ctx given to the op's ProcessGroup
	// method (nil: none), set before the Work is handed out (SetOpContext):
	// a Wait with that same ctx may run the op inline (see Wait).
	opDone <-chan struct{}

	// bound links the Work into its CtxWatch while its op's ctx is
	// watched (ctxwatch.go).
	bound ctxLink
}

// blockingWait is a Work's blocking-wait deadline (Promise.SetDeadline).
type blockingWait struct {
	deadline  time.Time
	onTimeout func(elapsed time.Duration) error
}

// The states of Work.state: a Work is completed once, by the Complete
// call that moves it from workPending to workCompleting; it is complete
// (err readable, IsCompleted true) from workDone on. workFreed marks the
// Work of an op block released to the pool (opblock.go) until it is
// reused: reading it then is a use after release, and panics.
const (
	workPending uint32 = iota
	workCompleting
	workDone
	workFreed
)

// closedChan is the Done channel of every Work that completed before
// anyone asked for one.
var closedChan = func() *chan struct{} {
	c := make(chan struct{})
	close(c)
	return &c
}()

// clockBase anchors the Works' timestamps: they are read with one
// monotonic clock read (time.Since) instead of time.Now's wall and
// monotonic pair, and converted back to time.Time by Timings.
var clockBase = time.Now()

// now is the time since clockBase in nanoseconds, at least 1 (0 means
// "not yet" in a Work's timestamps).
func now() int64 { return max(int64(time.Since(clockBase)), 1) }

// Promise is the producer side of a Work, as a cancel func is to its
// Context: it completes the Work and records what the engine learns
// (identity, start time, a Recv's source). It is held by the runtime, the
// communicator actor, the engines, the watchdog and comm hooks, and never
// returned by ProcessGroup methods, whose callers get the read-only Work.
// The Work lives inside the Promise, and a ProcessGroup op's Promise
// lives in one allocation with its Op (newOp): a small op on the public
// path allocates that block and nothing else, and a blocking one
// (Blocking) reuses a block released by an earlier one.
//
// A blocking op's Promise counts its holders, so that its block is reused
// only once nothing refers to it: see Retain and Release, which every
// runtime holder that keeps p past the call that handed it over (the
// watchdog, the flight recorder, the communicator's launch queue and its
// ctx watch) pairs. Every other Promise is not counted: Retain and Release
// do nothing on it, and it is never reused.
type Promise struct {
	w   Work         // its ref counts the holders of a blocking op's Promise
	blk *pooledBlock // the pooled block p lives in; nil if p is never reused
}

// NewPromise returns a Promise for an incomplete Work of op. The
// ProcessGroup uses the one allocated with each op's descriptor; a comm
// hook (reducer.CommHook) or a fake process group written by a user may
// create its own, return p.Work() and complete it when its result is
// ready, as a torch comm hook returns a Future it fulfils.
func NewPromise(op OpType) *Promise {
	p := new(Promise)
	p.init(op)
	return p
}

// init readies p, zero until now (or taken from the pool: getBlock), for
// an incomplete Work of op.
func (p *Promise) init(op OpType) {
	p.w.op = op
	p.w.created = now()
	p.w.source.Store(-1)
}

// Work is the read-only handle of p's op, to hand to callers. It is the
// same *Work for every call.
func (p *Promise) Work() *Work { return &p.w }

// InlineStream is an engine's ordered stream of ops on which a waiter may
// run its own op (the CPU engine implements it). RunInline runs w's op on
// the calling goroutine if it is next on the stream and the stream is
// idle, completing w through the Promise the engine holds for it, and
// reports whether it did; otherwise it does nothing and returns false at
// once. Progress tells the stream that w's op will not be run by its
// waiter: a stream that put off waking its own progress goroutine for a
// small op, expecting the waiter to run it (and bounding that with a
// timer), starts it now. Work calls it before a Wait blocks and when Done
// hands out a channel for an incomplete Work.
type InlineStream interface {
	RunInline(w *Work) bool
	Progress(w *Work)
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
	if w.IsCompleted() {
		return w.err
	}
	s, inline := w.inline.Load().(InlineStream)
	if inline {
		if w.bw == nil && w.inlineWait(ctx) && s.RunInline(w) {
			w.awaitDone() // RunInline returns once the Work is complete
			return w.err
		}
		s.Progress(w) // this waiter will not run it
	}
	if d := time.Duration(w.spin.Load()); d > 0 && w.spinUntilDone(d) {
		return w.err
	}
	var expired <-chan time.Time
	if w.bw != nil {
		t := time.NewTimer(time.Until(w.bw.deadline))
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-w.doneChan():
		return w.err
	case <-ctx.Done():
		return ctx.Err()
	case <-expired:
		if w.IsCompleted() {
			return w.err
		}
		return w.bw.onTimeout(w.since())
	}
}

// since is the time since the Work was created.
func (w *Work) since() time.Duration { return time.Duration(now() - w.created) }

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
	p.w.bw = &blockingWait{deadline: deadline, onTimeout: onTimeout}
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

// Done is closed when the Work completes. The channel is made on the
// first call before completion (a Work nobody blocks on has none); an op
// still queued then is started without waiting for a waiter to run it
// (InlineStream.Progress).
func (w *Work) Done() <-chan struct{} {
	if !w.IsCompleted() {
		if s, ok := w.inline.Load().(InlineStream); ok {
			s.Progress(w)
		}
	}
	return w.doneChan()
}

// doneChan is Done without the nudge to the stream.
func (w *Work) doneChan() <-chan struct{} {
	if c := w.done.Load(); c != nil {
		return *c
	}
	c := make(chan struct{})
	if w.done.CompareAndSwap(nil, &c) {
		return c
	}
	// Completed meanwhile (closedChan), or another caller's channel.
	return *w.done.Load()
}

// IsCompleted reports whether the Work has completed (c10d is_completed).
func (w *Work) IsCompleted() bool {
	s := w.state.Load()
	if s == workDone {
		return true
	}
	if s == workFreed {
		panicFreed()
	}
	return false
}

// IsSuccess reports whether the Work completed without error (c10d
// is_success); false while it is in flight.
func (w *Work) IsSuccess() bool { return w.IsCompleted() && w.err == nil }

// Err is the Work's error once it completed; nil while it is in flight or
// if it succeeded.
func (w *Work) Err() error {
	if w.IsCompleted() {
		return w.err
	}
	return nil
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
func (p *Promise) SetSource(rank int) { p.w.source.Store(int32(rank)) }

// MarkStarted records the time the engine began the op; called by engines.
// Only the first call has an effect.
func (p *Promise) MarkStarted() {
	if p.w.started.Load() == 0 {
		p.w.started.CompareAndSwap(0, now())
	}
}

// Complete finishes p's Work with err (nil for success) and wakes its
// waiters. Only the first call has an effect; it returns whether this call
// completed the Work. Called by engines, the communicator actor (also for
// a cancelled ctx), the watchdog and comm hooks.
func (p *Promise) Complete(err error) bool { return p.complete(err) }

// SetOpContext records ctx, the ctx given to the op's ProcessGroup method,
// as the one whose Wait may run the op inline (see Work.Wait): its
// cancellation fails the op (the launcher binds it, CtxWatch), so a Wait
// with it cannot end before the op does. Call it before the Work is handed
// out; a nil ctx or one that is never done records nothing.
func (p *Promise) SetOpContext(ctx context.Context) {
	if ctx != nil {
		p.w.opDone = ctx.Done()
	}
}

// complete is Promise.Complete.
func (p *Promise) complete(err error) bool {
	w := &p.w
	if !w.state.CompareAndSwap(workPending, workCompleting) {
		w.awaitDone() // as sync.Once: a losing call returns once the Work is complete
		return false
	}
	w.err = err
	w.completed.Store(now())
	if w.after != nil {
		w.after() // before the Work is seen complete: its waiter sees its effects
	}
	w.state.Store(workDone)
	if c := w.done.Swap(closedChan); c != nil && c != closedChan {
		close(*c)
	}
	if cw := w.bound.watch.Load(); cw != nil {
		cw.unbind(p)
	}
	p.Release() // the completion's reference (a recycled block's, opblock.go)
	return true
}

// awaitDone waits for a completion already under way (a Complete call
// between its two state changes) to finish; it never waits for the op.
func (w *Work) awaitDone() {
	for {
		switch w.state.Load() {
		case workDone:
			return
		case workFreed:
			panicFreed()
		}
		runtime.Gosched()
	}
}

// clockBaseUnix is clockBase in Unix nanoseconds.
var clockBaseUnix = clockBase.UnixNano()

// UnixNanos returns the Work's timestamps in Unix nanoseconds, 0 meaning
// "not yet": Timings' times as t.UnixNano() gives them, without building
// time.Time values (the flight recorder copies them per op).
func (w *Work) UnixNanos() (created, started, completed int64) {
	if w.state.Load() == workFreed {
		panicFreed()
	}
	created = clockBaseUnix + w.created
	if s := w.started.Load(); s != 0 {
		started = clockBaseUnix + s
	}
	if c := w.completed.Load(); c != 0 {
		completed = clockBaseUnix + c
	}
	return created, started, completed
}

// Timings returns the Work's timestamps.
func (w *Work) Timings() Timings {
	if w.state.Load() == workFreed {
		panicFreed()
	}
	t := Timings{Created: clockBase.Add(time.Duration(w.created))}
	if s := w.started.Load(); s != 0 {
		t.Started = clockBase.Add(time.Duration(s))
	}
	if c := w.completed.Load(); c != 0 {
		t.Completed = clockBase.Add(time.Duration(c))
	}
	return t
}
