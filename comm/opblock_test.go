package comm

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// fnLauncher is a Launcher that hands each Submit to submit.
type fnLauncher struct {
	submit func(ctx context.Context, op *Op, p *Promise)
}

func (l fnLauncher) Submit(ctx context.Context, op *Op, p *Promise) { l.submit(ctx, op, p) }
func (l fnLauncher) Abort(error)                                    {}
func (l fnLauncher) Close(context.Context) error                    { return nil }

// launcherGroup is a one-rank group (two for P2P) over submit.
func launcherGroup(t *testing.T, size int, submit func(ctx context.Context, op *Op, p *Promise)) *ProcessGroup {
	t.Helper()
	pg, err := NewProcessGroup(GroupConfig{Name: "g", Rank: 0, Size: size, Launcher: fnLauncher{submit}, Engine: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	return pg
}

// panics reports whether f panics with a use-after-release message.
func panics(f func()) (yes bool) {
	defer func() {
		if r := recover(); r != nil {
			s, _ := r.(string)
			yes = strings.Contains(s, "released")
		}
	}()
	f()
	return false
}

var sinkCfg OpConfig

func applyVariadic(opts ...OpOption) OpConfig { return ApplyOpOptions(opts) }

// TestOpOptions: options fold in order, the zero option sets nothing, and
// passing options to a call allocates nothing (they are values, not
// funcs).
func TestOpOptions(t *testing.T) {
	c := ApplyOpOptions([]OpOption{WithOpTimeout(time.Second), {}, Blocking(), WithOpTimeout(2 * time.Second)})
	if c != (OpConfig{Timeout: 2 * time.Second, Blocking: true}) {
		t.Fatalf("folded %+v", c)
	}
	if c := ApplyOpOptions(nil); c != (OpConfig{}) {
		t.Fatalf("no options: %+v", c)
	}
	if a := testing.AllocsPerRun(100, func() { sinkCfg = applyVariadic(WithOpTimeout(time.Second), Blocking()) }); a != 0 {
		t.Fatalf("%v allocations to pass two options", a)
	}
}

// TestBlockingSuccessRecycles: a blocking op that succeeds returns the
// shared done Work, and its block goes back to the pool once its last
// holder lets go: the launcher's own reference keeps it, and once
// released the old Promise is poisoned (a read panics).
func TestBlockingSuccessRecycles(t *testing.T) {
	ctx := context.Background()
	var held *Promise
	hold := true
	pg := launcherGroup(t, 1, func(_ context.Context, op *Op, p *Promise) {
		held = p
		if hold {
			p.Retain()
		}
		p.SetSeq(7)
		p.Complete(nil)
	})
	w := pg.AllReduce(ctx, HostBuffer(make([]float32, 4)), Sum, Blocking())
	if w != &doneWorks[OpAllReduce].w || !w.IsCompleted() || !w.IsSuccess() || w.Err() != nil || w.Wait(ctx) != nil {
		t.Fatalf("blocking success returned %p (done %v, err %v), want the shared done Work", w, w.IsCompleted(), w.Err())
	}
	if w.Seq() != 0 || w.OpType() != OpAllReduce || w.Fingerprint() != (Fingerprint{}) || !w.Timings().Created.Equal(clockBase) {
		t.Fatalf("done Work: seq %d op %v fp %v", w.Seq(), w.OpType(), w.Fingerprint())
	}
	select {
	case <-w.Done():
	default:
		t.Fatal("done Work's Done channel is open")
	}
	// The launcher's reference keeps the block: the Work is still readable.
	if n := held.w.ref.Load(); n != 1 || !held.Work().IsCompleted() || held.Work().Seq() != 7 {
		t.Fatalf("held block: ref %d, completed %v, seq %d", n, held.Work().IsCompleted(), held.Work().Seq())
	}
	held.Release()
	if n := held.w.ref.Load(); n != refFreed {
		t.Fatalf("after the last release ref is %d, want refFreed", n)
	}
	if !panics(func() { held.Work().IsCompleted() }) || !panics(func() { held.Work().Timings() }) ||
		!panics(func() { held.Retain() }) || !panics(func() { held.Release() }) || !panics(func() { held.Complete(nil) }) {
		t.Fatal("using a released Promise did not panic")
	}
	if held.TryRetain() {
		t.Fatal("TryRetain pinned a released Promise")
	}
	// Without a holder, the caller's release is the last one.
	hold = false
	pg.Barrier(ctx, Blocking())
	if n := held.w.ref.Load(); n != refFreed {
		t.Fatalf("blocking barrier without holders: ref %d after return, want refFreed", n)
	}
}

// TestBlockingFailureKeepsWork: a blocking op that fails returns its own
// Work, which stays valid (its block is never reused).
func TestBlockingFailureKeepsWork(t *testing.T) {
	boom := errors.New("boom")
	var held *Promise
	pg := launcherGroup(t, 1, func(_ context.Context, op *Op, p *Promise) {
		held = p
		p.Retain()
		p.SetSeq(3)
		p.Complete(boom)
	})
	w := pg.Broadcast(context.Background(), HostBuffer(make([]int32, 2)), 0, Blocking())
	if w != held.Work() || !errors.Is(w.Err(), boom) || w.Seq() != 3 || !w.IsCompleted() {
		t.Fatalf("blocking failure returned %p err %v seq %d, want the op's own Work (%p)", w, w.Err(), w.Seq(), held.Work())
	}
	held.Release() // the last runtime holder: the caller's reference stays
	if n := held.w.ref.Load(); n != 1 || !errors.Is(w.Err(), boom) {
		t.Fatalf("failed op's block: ref %d, err %v", n, w.Err())
	}
}

// TestBlockingCtxEnds: a ctx that ends before the op returns a Work failed
// with ctx's error, as Wait would, and leaves the op (in flight) alone.
func TestBlockingCtxEnds(t *testing.T) {
	got := make(chan *Promise, 1)
	pg := launcherGroup(t, 1, func(_ context.Context, op *Op, p *Promise) { got <- p })
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan *Work, 1)
	go func() { res <- pg.AllReduce(ctx, HostBuffer(make([]float32, 1)), Sum, Blocking()) }()
	p := <-got
	cancel()
	w := <-res
	if w == p.Work() || !w.IsCompleted() || !errors.Is(w.Err(), context.Canceled) || w.OpType() != OpAllReduce {
		t.Fatalf("ctx ended: %p completed %v err %v", w, w.IsCompleted(), w.Err())
	}
	if p.Work().IsCompleted() {
		t.Fatal("the op was completed by the caller's ctx")
	}
	p.Complete(nil) // the op ends later
	if n := p.w.ref.Load(); n != 1 {
		t.Fatalf("op's block after a wait that ctx ended: ref %d, want 1 (the caller's, kept)", n)
	}
	if !p.Work().IsSuccess() {
		t.Fatal("the op's Work is not readable")
	}
}

// TestAsyncNotCounted: an async op's Promise is not counted: Retain and
// Release do nothing, and its Work stays the caller's.
func TestAsyncNotCounted(t *testing.T) {
	var held *Promise
	pg := launcherGroup(t, 1, func(_ context.Context, op *Op, p *Promise) {
		held = p
		p.Release() // no effect
		p.Complete(nil)
	})
	w := pg.AllReduce(context.Background(), HostBuffer(make([]float32, 1)), Sum, WithOpTimeout(time.Minute))
	held.Retain()
	held.Release()
	held.Release()
	if w != held.Work() || held.w.ref.Load() != refUncounted || !held.TryRetain() || !w.IsSuccess() {
		t.Fatalf("async op: ref %d, work %p vs %p", held.w.ref.Load(), w, held.Work())
	}
}

// TestBlockingRejectedInput: a blocking call with bad input fails before
// anything is submitted, and its unused block goes back to the pool.
func TestBlockingRejectedInput(t *testing.T) {
	pg := launcherGroup(t, 2, func(context.Context, *Op, *Promise) { t.Error("submitted") })
	w := pg.AllGatherInto(context.Background(), HostBuffer(make([]float32, 3)), HostBuffer(make([]float32, 1)), Blocking())
	if !errors.Is(w.Err(), ErrInvalidArgument) {
		t.Fatalf("bad input: %v", w.Err())
	}
}

// TestBlockingBatchP2P: a blocking BatchP2P returns per-op Works that are
// complete.
func TestBlockingBatchP2P(t *testing.T) {
	pg := launcherGroup(t, 2, func(_ context.Context, op *Op, p *Promise) {
		go func() {
			time.Sleep(time.Millisecond)
			p.SetSeq(1)
			p.Complete(nil)
		}()
	})
	ws, err := pg.BatchP2P(context.Background(), []P2POp{
		{Op: OpSend, Buf: HostBuffer(make([]float32, 1)), Peer: 1},
		{Op: OpRecv, Buf: HostBuffer(make([]float32, 1)), Peer: 1},
	}, Blocking())
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range ws {
		if !w.IsSuccess() || w.Seq() != 1 {
			t.Fatalf("ops[%d]: completed %v seq %d", i, w.IsCompleted(), w.Seq())
		}
	}
	if ws[1].Source() != 1 {
		t.Fatalf("recv source %d", ws[1].Source())
	}
}

// TestCtxWatchHoldsDuringFire: the ctx watch holds the Promises it hands
// to its callback, so that a blocking op that completes and is released
// meanwhile is not reused under the callback.
func TestCtxWatchHoldsDuringFire(t *testing.T) {
	b := getBlock()
	p := &b.p
	p.init(OpAllReduce)
	p.w.ref.Store(refStart)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var readable bool
	cw := NewCtxWatch(func(_ context.Context, ps []*Promise) {
		defer close(done)
		// The op ends, and its caller lets go of it, while the callback
		// runs: the watch's reference keeps the block.
		ps[0].Complete(nil)
		ps[0].Release() // the caller's
		readable = !panics(func() { ps[0].Work().IsCompleted() }) && ps[0].Work().IsSuccess()
	})
	cw.Bind(ctx, p)
	cancel()
	<-done
	if !readable {
		t.Fatal("the Work was released under the ctx watch's callback")
	}
	// The watch releases its reference once the callback has returned.
	for end := time.Now().Add(5 * time.Second); p.w.ref.Load() != refFreed; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("after the callback: ref %d, want refFreed", p.w.ref.Load())
		}
	}
}

// TestOpBlockSize: an async op's one allocation stays in the 512-byte
// size class (it was before blocking ops existed), a blocking op's pooled
// block in the next one.
func TestOpBlockSize(t *testing.T) {
	if n := unsafe.Sizeof(opBlock{}); n > 512 {
		t.Errorf("opBlock is %d bytes, more than 512", n)
	}
	if n := unsafe.Sizeof(pooledBlock{}); n > 576 {
		t.Errorf("pooledBlock is %d bytes, more than 576", n)
	}
}

// BenchmarkSubmit times a 4-byte AllReduce through a ProcessGroup whose
// launcher completes it at once (no engine, no observers): the op path's
// own cost, async (one block allocated per op, garbage for the collector)
// against blocking (a pooled block, its holders counted). The test
// binary's quarantine of released blocks is off here, as in a program.
func BenchmarkSubmit(b *testing.B) {
	q := quarantine.on
	quarantine.on = false
	defer func() { quarantine.on = q }()
	pg, err := NewProcessGroup(GroupConfig{Name: "g", Rank: 0, Size: 1, Engine: "cpu",
		Launcher: fnLauncher{func(_ context.Context, op *Op, p *Promise) { p.Complete(nil) }}})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	buf := HostBuffer(make([]float32, 1))
	for _, c := range []struct {
		name string
		opts []OpOption
	}{{"async", nil}, {"blocking", []OpOption{Blocking()}}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if err := pg.AllReduce(ctx, buf, Sum, c.opts...).Wait(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
