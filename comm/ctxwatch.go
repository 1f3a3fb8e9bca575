package comm

import (
	"context"
	"sync"
	"sync/atomic"
)

// CtxWatch watches the contexts that in-flight ops were submitted with, for
// their launcher (the communicator, actors.Communicator): when a ctx is
// done, the Works bound to it that have not completed are handed to the
// watch's callback, which aborts the communicator and fails them (c10d has
// no counterpart: a torch collective takes no context).
//
// It costs one context.AfterFunc registration per distinct ctx (Done
// channel), not one per op: a training loop that passes the same
// cancellable ctx (signal.NotifyContext, a job-wide WithCancel) to every op
// binds each op with a map lookup and two list links under a mutex, and
// allocates nothing. A registration whose ctx has no Work in flight stays
// for the next op with that ctx, up to ctxWatchIdle of them; past that,
// binding a new ctx stops those idle ones, so a long-lived communicator
// fed a new ctx per step does not accumulate them. A ctx that ends drops
// its registration; Close stops them all. Safe for concurrent use.
type CtxWatch struct {
	mu      sync.Mutex
	entries map[<-chan struct{}]*ctxEntry
	closed  bool
	fire    func(ctx context.Context, ps []*Promise)
}

// ctxWatchIdle is how many registrations without Works in flight a
// CtxWatch keeps before binding a new ctx stops them.
const ctxWatchIdle = 4

// ctxEntry is one watched ctx and the Works bound to it, oldest first,
// linked through their ctxLink.
type ctxEntry struct {
	ctx        context.Context
	stop       func() bool
	head, tail *Promise
	n          int // Works linked
}

// ctxLink is a Work's place in its CtxWatch. watch is set by Bind (and
// read by complete, which unbinds); entry, prev and next are guarded by
// the watch's mutex.
type ctxLink struct {
	watch      atomic.Pointer[CtxWatch]
	entry      *ctxEntry
	prev, next *Promise
}

// NewCtxWatch returns a CtxWatch that calls fire, on a goroutine of its
// own, with a ctx that is done and the Promises bound to it whose Works
// had not completed when it ended (in bind order; fire must itself skip
// those that complete meanwhile). The Promises are held for fire's call
// only (Promise.Retain): fire must not keep them after it returns.
func NewCtxWatch(fire func(ctx context.Context, ps []*Promise)) *CtxWatch {
	return &CtxWatch{entries: make(map[<-chan struct{}]*ctxEntry), fire: fire}
}

// Bind watches ctx for p's Work until the Work completes. A nil ctx, one
// that is never done, a Work already complete and a closed CtxWatch bind
// nothing; a ctx already done fires at once. Call it at most once per
// Promise.
func (cw *CtxWatch) Bind(ctx context.Context, p *Promise) {
	if ctx == nil {
		return
	}
	d := ctx.Done()
	if d == nil {
		return
	}
	w := &p.w
	// watch is stored before the state is read under the lock, and
	// complete moves the state before it loads watch: either this Bind
	// sees the Work complete and links nothing, or complete sees watch
	// and unlinks what Bind linked.
	w.bound.watch.Store(cw)
	cw.mu.Lock()
	defer cw.mu.Unlock()
	if cw.closed || w.state.Load() != workPending {
		return
	}
	e := cw.entries[d]
	if e == nil {
		if len(cw.entries) >= ctxWatchIdle {
			cw.sweepLocked()
		}
		e = &ctxEntry{ctx: ctx}
		cw.entries[d] = e
		e.stop = context.AfterFunc(ctx, func() { cw.done(d, e) })
	}
	w.bound.entry, w.bound.prev = e, e.tail
	if e.tail != nil {
		e.tail.w.bound.next = p
	} else {
		e.head = p
	}
	e.tail = p
	e.n++
}

// sweepLocked stops and forgets the registrations without Works in
// flight (cw.mu held).
func (cw *CtxWatch) sweepLocked() {
	for d, e := range cw.entries {
		if e.n == 0 {
			e.stop()
			delete(cw.entries, d)
		}
	}
}

// unbind unlinks p, whose Work has completed, from its entry (if the
// entry has not fired meanwhile).
func (cw *CtxWatch) unbind(p *Promise) {
	cw.mu.Lock()
	if l := &p.w.bound; l.entry != nil {
		e, prev, next := l.entry, l.prev, l.next
		if prev != nil {
			prev.w.bound.next = next
		} else {
			e.head = next
		}
		if next != nil {
			next.w.bound.prev = prev
		} else {
			e.tail = prev
		}
		l.entry, l.prev, l.next = nil, nil, nil
		e.n--
	}
	cw.mu.Unlock()
}

// done runs when entry e's ctx (Done channel d) is done: it forgets the
// entry, detaches its Works and hands those still in flight to fire. It
// holds each one's Promise (Promise.Retain) until fire returns: a Work
// detached here may complete meanwhile, and a blocking op's block must
// not be reused under fire. A linked Work is held by its completion
// (whose unbind needs cw.mu), so retaining it under cw.mu is sound.
func (cw *CtxWatch) done(d <-chan struct{}, e *ctxEntry) {
	cw.mu.Lock()
	if cw.entries[d] == e {
		delete(cw.entries, d)
	}
	var ps []*Promise
	for p := e.head; p != nil; {
		l := &p.w.bound
		next := l.next
		l.entry, l.prev, l.next = nil, nil, nil
		p.Retain()
		ps = append(ps, p)
		p = next
	}
	e.head, e.tail, e.n = nil, nil, 0
	cw.mu.Unlock()
	if len(ps) > 0 && cw.fire != nil {
		cw.fire(e.ctx, ps)
	}
	for _, p := range ps {
		p.Release()
	}
}

// Close stops every registration; later Binds bind nothing. Idempotent.
func (cw *CtxWatch) Close() {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	cw.closed = true
	for d, e := range cw.entries {
		e.stop()
		delete(cw.entries, d)
	}
}

// Registrations is the number of contexts the watch is registered with
// (tests and diagnostics).
func (cw *CtxWatch) Registrations() int {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return len(cw.entries)
}
