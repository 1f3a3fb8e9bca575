package comm

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// fired collects what a CtxWatch's callback was handed.
type fired struct {
	mu  sync.Mutex
	got [][]*Promise
	ch  chan struct{}
}

func newFired() *fired { return &fired{ch: make(chan struct{}, 16)} }

func (f *fired) fire(_ context.Context, ps []*Promise) {
	f.mu.Lock()
	f.got = append(f.got, ps)
	f.mu.Unlock()
	f.ch <- struct{}{}
}

func (f *fired) wait(t *testing.T) []*Promise {
	t.Helper()
	select {
	case <-f.ch:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch never fired")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.got[len(f.got)-1]
}

// TestCtxWatchOneRegistrationPerCtx: every op bound to the same ctx shares
// one registration; Works that completed are unlinked; when the ctx is
// cancelled the callback gets exactly the Works still in flight, in bind
// order, and the registration is gone.
func TestCtxWatchOneRegistrationPerCtx(t *testing.T) {
	f := newFired()
	cw := NewCtxWatch(f.fire)
	ctx, cancel := context.WithCancel(context.Background())
	var ps []*Promise
	for i := range 10 {
		p := NewPromise(OpAllReduce)
		cw.Bind(ctx, p)
		ps = append(ps, p)
		if i%3 == 0 {
			p.Complete(nil)
		}
	}
	if n := cw.Registrations(); n != 1 {
		t.Fatalf("%d registrations for one ctx, want 1", n)
	}
	cw.Bind(context.Background(), NewPromise(OpBarrier)) // never done: nothing to watch
	if n := cw.Registrations(); n != 1 {
		t.Fatalf("%d registrations after binding a ctx that is never done, want 1", n)
	}
	cancel()
	got := f.wait(t)
	var want []*Promise
	for i, p := range ps {
		if i%3 != 0 {
			want = append(want, p)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("callback got %d Works, want the %d in flight", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("callback's Work %d is not the %d-th in flight", i, i)
		}
	}
	if n := cw.Registrations(); n != 0 {
		t.Fatalf("%d registrations after the ctx ended, want 0", n)
	}
	// A Work bound to the ended ctx fires at once; one already complete
	// binds nothing.
	done := NewPromise(OpBarrier)
	done.Complete(nil)
	cw.Bind(ctx, done)
	p := NewPromise(OpBarrier)
	cw.Bind(ctx, p)
	if got := f.wait(t); len(got) != 1 || got[0] != p {
		t.Fatalf("bound to an ended ctx: callback got %d Works, want only the incomplete one", len(got))
	}
}

// TestCtxWatchIdleAndClose: registrations without Works in flight are
// kept up to ctxWatchIdle and swept past that; Close stops every one (a
// cancel then fires nothing) and later Binds bind nothing.
func TestCtxWatchIdleAndClose(t *testing.T) {
	f := newFired()
	cw := NewCtxWatch(f.fire)
	var cancels []context.CancelFunc
	for i := range 3 * ctxWatchIdle {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		p := NewPromise(OpAllReduce)
		cw.Bind(ctx, p)
		if n := cw.Registrations(); n > ctxWatchIdle {
			t.Fatalf("after %d ctxs: %d registrations, want at most %d", i+1, n, ctxWatchIdle)
		}
		p.Complete(nil)
	}
	// A ctx with a Work in flight is never swept.
	ctx, cancel := context.WithCancel(context.Background())
	held := NewPromise(OpAllReduce)
	cw.Bind(ctx, held)
	for range 2 * ctxWatchIdle {
		c, cl := context.WithCancel(context.Background())
		cancels = append(cancels, cl)
		p := NewPromise(OpAllReduce)
		cw.Bind(c, p)
		p.Complete(nil)
	}
	cancel()
	if got := f.wait(t); len(got) != 1 || got[0] != held {
		t.Fatalf("the held Work's ctx ended: callback got %d Works, want the held one (its registration was swept?)", len(got))
	}
	held = NewPromise(OpAllReduce)
	ctx, cancel = context.WithCancel(context.Background())
	cw.Bind(ctx, held)
	cw.Close()
	if n := cw.Registrations(); n != 0 {
		t.Fatalf("%d registrations after Close", n)
	}
	cancel()
	for _, c := range cancels {
		c()
	}
	p := NewPromise(OpAllReduce)
	cw.Bind(ctx, p)
	select {
	case <-f.ch:
		t.Fatal("a closed watch fired")
	case <-time.After(50 * time.Millisecond):
	}
	if held.Work().IsCompleted() || p.Work().IsCompleted() {
		t.Fatal("a closed watch completed a Work")
	}
}

// TestCtxWatchBindAllocs: binding an op to a ctx already watched, and
// unbinding it on completion, allocates nothing.
func TestCtxWatchBindAllocs(t *testing.T) {
	cw := NewCtxWatch(func(context.Context, []*Promise) {})
	defer cw.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ps := make([]*Promise, 1100)
	for i := range ps {
		ps[i] = NewPromise(OpAllReduce)
	}
	i := 0
	step := func() {
		cw.Bind(ctx, ps[i])
		ps[i].Complete(nil)
		i++
	}
	step()
	if a := testing.AllocsPerRun(1000, step); a != 0 {
		t.Fatalf("%v allocations per Bind and Complete on a watched ctx, want 0", a)
	}
}

// TestCtxWatchRace binds, completes and cancels from many goroutines
// (run it with -race): every Work ends up completed exactly once, either
// by its op or by the callback, which never sees a Work twice.
func TestCtxWatchRace(t *testing.T) {
	errCanceled := errors.New("canceled")
	var seen sync.Map
	cw := NewCtxWatch(func(_ context.Context, ps []*Promise) {
		for _, p := range ps {
			if _, dup := seen.LoadOrStore(p, true); dup {
				t.Error("a Work was handed to the callback twice")
			}
			p.Complete(errCanceled)
		}
	})
	defer cw.Close()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				ctx, cancel := context.WithCancel(context.Background())
				var ps []*Promise
				for i := range 20 {
					p := NewPromise(OpAllReduce)
					cw.Bind(ctx, p)
					ps = append(ps, p)
					if (i+g)%2 == 0 {
						go p.Complete(nil)
					}
				}
				cancel()
				for _, p := range ps {
					select {
					case <-p.Work().Done():
					case <-time.After(10 * time.Second):
						t.Error("a Work bound to a cancelled ctx never completed")
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}
