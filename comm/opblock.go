package comm

import (
	"context"
	"sync"
	"testing"
)

// Op blocks. A ProcessGroup method lowers its call into one opBlock: the
// op descriptor and the Promise (with the caller's Work inside) that
// submit hands to the launcher with it, so an op on the public path
// costs one allocation. A blocking call (Blocking) gives no handle to its
// own Work out on success, so its block is recycled: it comes from a
// pool (opSetup) and goes back to it (release) once the last of its
// holders has released it:
//
//   - the caller, until its wait ends (await; a failed op's caller keeps
//     its reference, so that the Work it returns stays valid);
//   - the op's completion, until Promise.Complete returns (its tail
//     unlinks the Work from its ctx watch after waking the waiter);
//   - every runtime holder that keeps the Promise past the call that
//     handed it over: the communicator's launch queue for an op that
//     another Submit launches, the communicator's last submitted op (for
//     Close's grace), the ctx watch while it hands a cancelled
//     ctx's ops to its callback, the watchdog (its inbox, its in-flight
//     list and each group's newest Work), the flight recorder's ring slot
//     until it has copied the ended Work's state (docs/architecture.md,
//     "The op block's lifetime").
//
// An async op's block (no Blocking option) is never counted and never
// recycled: its caller holds the *Work.

// opBlock is the one allocation of an op a ProcessGroup method lowers:
// 512 bytes, a size class of its own.
type opBlock struct {
	op Op
	p  Promise
}

// pooledBlock is a blocking op's block: an opBlock and the backing array
// of a single-buffer Out (Op.setOut), which an async op allocates apart
// (an opBlock keeps only In's, to stay within 512 bytes).
type pooledBlock struct {
	opBlock
	out [1]Buffer
}

// Work.ref values besides a count of holders (≥ 1).
const (
	refUncounted int32 = 0        // not counted: Retain and Release do nothing
	refStart     int32 = 2        // a blocking op at submit: its caller and its completion
	refFreed     int32 = -1 << 30 // released to the pool
)

// recycleOps turns the recycling of blocking ops' blocks on; false makes
// every blocking op allocate its block, as an async op does (flip it to
// see what recycling saves: TestBlockingPublicPathAllocs then fails).
var recycleOps = true

// blocks holds released op blocks for blocking calls to reuse.
var blocks = sync.Pool{New: func() any {
	b := new(pooledBlock)
	b.p.blk = b
	return b
}}

// getBlock takes a block from the pool, ready for newOp (which writes
// the whole Op): it clears the Work here rather than at release, so that
// the block's memory is written once per reuse, by the goroutine about to
// use it, while it is in that core's caches.
func getBlock() *opBlock {
	b := blocks.Get().(*pooledBlock)
	b.p.w = Work{}
	return &b.opBlock
}

// opSetup folds a call's options and, for a blocking call, takes the
// pooled block its op is lowered into (nil: newOp allocates one).
func opSetup(opts []OpOption) (OpConfig, *opBlock) {
	cfg := ApplyOpOptions(opts)
	if !cfg.Blocking || !recycleOps {
		return cfg, nil
	}
	return cfg, getBlock()
}

// discard returns a pooled block that was never handed out (the call's
// input was rejected) to the pool; nil does nothing.
func (b *opBlock) discard() {
	if b != nil {
		b.p.blk.release()
	}
}

// release marks the block's Work freed, so that a use after release
// panics until it is reused, and puts it back in the pool, through the
// quarantine in test binaries. It writes one of the block's cache lines
// (the last holder, often the watchdog draining a batch, finds it cold);
// getBlock and newOp clear the rest when the block is reused. Until then
// the pooled block still refers to its last op's buffers (a recently
// completed op's, which the pool keeps for two garbage collections at
// most).
func (b *pooledBlock) release() {
	b.p.w.state.Store(workFreed)
	b.p.w.ref.Store(refFreed)
	if quarantine.on {
		b = quarantine.swap(b)
		if b == nil {
			return
		}
	}
	blocks.Put(b)
}

// quarantineLen is how many released blocks a test binary holds back
// from reuse.
const quarantineLen = 256

// quarantine holds the last quarantineLen released blocks back from the
// pool in test binaries (testing.Testing), poisoned (workFreed), so that
// a holder that reads a Work after releasing it panics, as long as it
// does so within the next quarantineLen releases, instead of silently
// reading another op's state.
var quarantine = &blockQuarantine{on: testing.Testing()}

type blockQuarantine struct {
	on   bool
	mu   sync.Mutex
	ring [quarantineLen]*pooledBlock
	next int
}

// swap puts b in the quarantine and returns the block it displaces (nil
// while the ring fills).
func (q *blockQuarantine) swap(b *pooledBlock) *pooledBlock {
	q.mu.Lock()
	old := q.ring[q.next]
	q.ring[q.next] = b
	q.next = (q.next + 1) % quarantineLen
	q.mu.Unlock()
	return old
}

// Retain records one more holder of p and reports whether p is counted.
// A runtime holder that keeps p, or reads its Work, after the call that
// handed p to it has returned (an Observer, an engine or a launcher that
// queues it, a ctx watch) calls Retain during that call and Release once
// it no longer reads or completes p. The Promise of a blocking op
// (Blocking) counts its holders, and its block (the Op, the Promise and
// its Work) is reused for another op once the last one has released it;
// every other Promise is not counted: Retain does nothing and reports
// false, and the holder need not call Release (which would do nothing
// either): a holder that keeps many Promises may remember the result and
// skip touching an uncounted one again. Call it only while p is held
// (during the call that handed it over); retaining a released Promise
// panics.
func (p *Promise) Retain() (counted bool) {
	n := p.w.ref.Load()
	if n == refUncounted {
		return false
	}
	if n < 0 {
		panicFreed()
	}
	p.w.ref.Add(1)
	return true
}

// Release drops a reference taken with Retain (or the runtime's own, see
// opblock.go). Once nothing holds p, its block goes back to the pool: p,
// its Work and its Op must not be used again by this holder. Releasing
// more than was retained panics. Nothing on an uncounted Promise.
func (p *Promise) Release() {
	for {
		n := p.w.ref.Load()
		switch {
		case n == refUncounted:
			return
		case n < 0:
			panicFreed()
		case n == 1:
			if p.w.ref.CompareAndSwap(1, refFreed) {
				p.blk.release()
				return
			}
		default:
			if p.w.ref.CompareAndSwap(n, n-1) {
				return
			}
		}
	}
}

// TryRetain is Retain for a pointer to p read from shared state whose
// reference another goroutine may drop at any moment (the communicator's
// last submitted op, which the next Submit swaps out and releases; see
// Communicator.pinLast): it takes a reference and reports true unless p's
// block has been released to the pool (false: the op it was ended and
// nothing is left to read).
// The block may have been reused since for another op, which the
// reference then holds: the caller must check that p is still the op it
// means (and Release it if not).
func (p *Promise) TryRetain() bool {
	for {
		n := p.w.ref.Load()
		switch {
		case n == refUncounted:
			return true
		case n < 0:
			return false
		case p.w.ref.CompareAndSwap(n, n+1):
			return true
		}
	}
}

func panicFreed() {
	panic("comm: use of a released Promise or Work: its op block was recycled (a holder read it after its last Release; see comm/opblock.go)")
}

// doneWorks are the shared Works a blocking call returns on success, one
// per op type: completed without error, with no Seq, Fingerprint or
// Timings of their own. Nothing completes them again (no Promise of
// theirs is handed out).
var doneWorks [OpCoalesced + 1]Promise

func init() {
	for i := range doneWorks {
		w := &doneWorks[i].w
		w.op = OpType(i)
		w.source.Store(-1)
		w.done.Store(closedChan)
		w.state.Store(workDone)
	}
}

// await is the end of a blocking call (Blocking): it waits for p's Work
// with ctx, as the caller of the async form would (Work.Wait), and
// returns a completed Work: if the Wait ended before the op (ctx, or the
// blocking-wait deadline), a Work failed with the Wait's error, while the
// op goes on under the communicator, as after an early Wait; else a
// shared done Work if the op succeeded, after releasing the caller's
// reference, or the op's own Work if it failed (the caller keeps its
// reference: that block is never reused).
func await(ctx context.Context, p *Promise) *Work {
	w := &p.w
	if ctx == nil {
		ctx = context.Background()
	}
	if err := w.Wait(ctx); err != nil && !w.IsCompleted() {
		return FailedWork(w.op, err)
	}
	if w.err != nil {
		return w
	}
	t := w.op
	p.Release()
	return &doneWorks[t].w
}
