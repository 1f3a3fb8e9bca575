package comm

import (
	"context"
	"testing"
	"time"
)

// fakeStream completes the Work of the Promise it holds when asked to run
// it, counting the runs and the Progress calls.
type fakeStream struct {
	p        *Promise
	ran      int
	progress int
}

func (s *fakeStream) Progress(*Work) { s.progress++ }

func (s *fakeStream) RunInline(w *Work) bool {
	if w != s.p.Work() {
		return false
	}
	s.ran++
	s.p.Complete(nil)
	return true
}

// TestWaitRunsInlineOnlyWhenNothingEndsItEarlier checks Wait's rule for
// running a queued op on the waiting goroutine: with a ctx that is never
// done, or the op's own ctx (without deadline); not with another
// cancellable ctx, a ctx deadline, or blocking wait, where Wait tells the
// stream (Progress) before it blocks.
func TestWaitRunsInlineOnlyWhenNothingEndsItEarlier(t *testing.T) {
	opCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	other, cancelOther := context.WithCancel(context.Background())
	cancelOther()
	dl, cancelDL := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancelDL()
	for _, c := range []struct {
		name     string
		ctx      context.Context
		opCtx    context.Context
		blocking bool
		inline   bool
	}{
		{"background", context.Background(), nil, false, true},
		{"the op's ctx", opCtx, opCtx, false, true},
		{"another ctx", other, opCtx, false, false},
		{"a deadline", dl, dl, false, false},
		{"blocking wait", context.Background(), nil, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := NewPromise(OpAllReduce)
			w := p.Work()
			if c.opCtx != nil {
				w.opDone = c.opCtx.Done()
			}
			if c.blocking {
				p.SetDeadline(time.Now().Add(time.Millisecond), func(time.Duration) error { return ErrTimeout })
			}
			s := &fakeStream{p: p}
			p.SetInline(s)
			err := w.Wait(c.ctx)
			if c.inline != (s.ran == 1) {
				t.Fatalf("ran inline %d times, want inline %v (Wait: %v)", s.ran, c.inline, err)
			}
			if c.inline == (s.progress > 0) {
				t.Fatalf("Progress called %d times, want it called only when the waiter does not run the op", s.progress)
			}
			if c.inline && err != nil {
				t.Fatalf("Wait after running inline: %v", err)
			}
			if !c.inline && err == nil {
				t.Fatal("Wait returned nil for a Work nobody completed")
			}
		})
	}
}

// TestWorkIsSuccess: false in flight and after a failure, true after success.
func TestWorkIsSuccess(t *testing.T) {
	okP, badP := NewPromise(OpAllReduce), NewPromise(OpAllReduce)
	ok, bad := okP.Work(), badP.Work()
	if ok.IsSuccess() {
		t.Fatal("IsSuccess in flight")
	}
	okP.Complete(nil)
	badP.Complete(ErrTimeout)
	if !ok.IsSuccess() || bad.IsSuccess() {
		t.Fatalf("IsSuccess: %v after success, %v after failure", ok.IsSuccess(), bad.IsSuccess())
	}
}

// doneLauncher completes every op at once.
type doneLauncher struct{}

func (doneLauncher) Submit(_ context.Context, op *Op, p *Promise) {
	p.SetFingerprint(op.FP)
	p.Complete(nil)
}
func (doneLauncher) Abort(error) {}
func (doneLauncher) Close(context.Context) error {
	return nil
}

// TestAllReduceSubmitAllocs bounds what ProcessGroup.AllReduce allocates
// per op before the launcher (issue 15): one block holding the Op, its
// one-buffer input and the Promise with its Work (newOp); no options
// object, no separate input slice, no done channel for a Work nobody
// blocks on.
func TestAllReduceSubmitAllocs(t *testing.T) {
	pg, err := NewProcessGroup(GroupConfig{Name: "g", Rank: 0, Size: 2, Launcher: doneLauncher{}, Engine: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	buf := HostBuffer(make([]float32, 1))
	ctx := context.Background()
	if a := testing.AllocsPerRun(200, func() {
		if err := pg.AllReduce(ctx, buf, Sum).Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}); a > 1 {
		t.Fatalf("%v allocations per AllReduce through the ProcessGroup, want at most 1 (the Op with its Promise)", a)
	}
}
