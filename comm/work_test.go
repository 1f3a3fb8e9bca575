package comm_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// TestWorkSpinWait: a spinning Wait returns the result of a completion
// that arrives within the spin, and once the spin is over without one it
// honours ctx and the blocking-wait deadline as a plain Wait does.
func TestWorkSpinWait(t *testing.T) {
	want := errors.New("engine failure")
	p := comm.NewPromise(comm.OpAllReduce)
	w := p.Work()
	p.SetSpinWait(time.Second)
	if w.SpinWait() != time.Second {
		t.Fatalf("SpinWait = %v", w.SpinWait())
	}
	go func() {
		time.Sleep(2 * time.Millisecond)
		p.Complete(want)
	}()
	start := time.Now()
	if err := w.Wait(context.Background()); err != want {
		t.Fatalf("Wait = %v, want %v", err, want)
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Fatalf("Wait took %v for a completion after 2 ms", d)
	}

	// Nothing completes: ctx ends during the spin; Wait returns ctx's error
	// once the spin is over, not before and not much after.
	p = comm.NewPromise(comm.OpAllReduce)
	w = p.Work()
	p.SetSpinWait(20 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	start = time.Now()
	if err := w.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v, want the ctx deadline", err)
	}
	if d := time.Since(start); d < 20*time.Millisecond || d > 5*time.Second {
		t.Fatalf("Wait returned after %v, want after the 20 ms spin", d)
	}

	// Blocking wait's deadline still applies after the spin.
	p = comm.NewPromise(comm.OpAllReduce)
	w = p.Work()
	p.SetDeadline(time.Now().Add(time.Millisecond), func(time.Duration) error { return comm.ErrTimeout })
	p.SetSpinWait(5 * time.Millisecond)
	if err := w.Wait(context.Background()); !errors.Is(err, comm.ErrTimeout) {
		t.Fatalf("Wait = %v, want the blocking-wait timeout", err)
	}

	// Off: d ≤ 0.
	p = comm.NewPromise(comm.OpAllReduce)
	w = p.Work()
	p.SetSpinWait(-1)
	p.Complete(nil)
	if err := w.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestWorkSpinWaitRace sets the spin while waiters already wait and the
// Work completes, as an engine taking a Work the caller waits on does; run
// under -race.
func TestWorkSpinWaitRace(t *testing.T) {
	for range 200 {
		p := comm.NewPromise(comm.OpBarrier)
		w := p.Work()
		var wg sync.WaitGroup
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := w.Wait(context.Background()); err != nil {
					t.Error(err)
				}
			}()
		}
		p.SetSpinWait(time.Millisecond)
		p.Complete(nil)
		wg.Wait()
	}
}

// TestWorkIsReadOnly lists the exported methods of *Work and fails if a
// producer method is among them: the handle a ProcessGroup method returns
// reads, and only its Promise completes it or records identity, source,
// start time, deadline, spin or inline stream (issue 17).
func TestWorkIsReadOnly(t *testing.T) {
	producer := func(name string) bool {
		return name == "Complete" || name == "MarkStarted" || strings.HasPrefix(name, "Set") ||
			strings.HasPrefix(name, "Fail") || strings.HasPrefix(name, "Cancel")
	}
	wt := reflect.TypeFor[*comm.Work]()
	var names []string
	for m := range wt.Methods() {
		names = append(names, m.Name)
		if producer(m.Name) {
			t.Errorf("*comm.Work has producer method %s; it belongs on *comm.Promise", m.Name)
		}
	}
	// The consumer side stays: these are what callers use (c10d Work's
	// wait, is_completed, is_success, exception, ...).
	for _, want := range []string{"Wait", "Done", "IsCompleted", "IsSuccess", "Err", "Seq", "Fingerprint", "OpType", "Source", "Timings"} {
		if _, ok := wt.MethodByName(want); !ok {
			t.Errorf("*comm.Work lacks %s (methods: %v)", want, names)
		}
	}
	// And the producer side is on the Promise.
	pt := reflect.TypeFor[*comm.Promise]()
	for _, want := range []string{"Complete", "Work", "SetSeq", "SetFingerprint", "SetSource", "MarkStarted", "SetDeadline", "SetSpinWait", "SetInline"} {
		if _, ok := pt.MethodByName(want); !ok {
			t.Errorf("*comm.Promise lacks %s", want)
		}
	}
}

// TestPromiseCompletesOnce: the first Complete returns true and decides
// the result; later ones return false and change nothing; Work() is the
// same handle every time and sees the result; waiters blocked before the
// completion wake with it.
func TestPromiseCompletesOnce(t *testing.T) {
	p := comm.NewPromise(comm.OpBroadcast)
	w := p.Work()
	if p.Work() != w {
		t.Fatal("Work() returned a different handle on the second call")
	}
	if w.IsCompleted() || w.Err() != nil || w.OpType() != comm.OpBroadcast || w.Seq() != 0 || w.Source() != -1 {
		t.Fatalf("new Work: completed %v err %v op %v seq %d source %d", w.IsCompleted(), w.Err(), w.OpType(), w.Seq(), w.Source())
	}
	select {
	case <-w.Done():
		t.Fatal("Done closed before Complete")
	default:
	}
	fp := comm.Fingerprint{Group: comm.GroupHash("g"), Epoch: 2, Seq: 7, Op: comm.OpBroadcast, DType: comm.Float32, Count: 3, Root: 1}
	p.SetFingerprint(fp)
	p.SetSource(1)
	p.MarkStarted()
	want := &comm.EngineError{Engine: "cpu", Rank: 0, FP: fp, Msg: "first"}
	const waiters = 3
	errs := make(chan error, waiters)
	var started sync.WaitGroup
	for range waiters {
		started.Add(1)
		go func() {
			started.Done()
			errs <- w.Wait(context.Background())
		}()
	}
	started.Wait()
	if !p.Complete(want) {
		t.Fatal("first Complete returned false")
	}
	if p.Complete(nil) || p.Complete(errors.New("third")) {
		t.Fatal("a later Complete returned true")
	}
	for range waiters {
		select {
		case err := <-errs:
			if err != want {
				t.Fatalf("waiter woke with %v, want %v", err, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a waiter did not wake after Complete")
		}
	}
	if !w.IsCompleted() || w.IsSuccess() || w.Err() != want {
		t.Fatalf("after Complete: completed %v success %v err %v", w.IsCompleted(), w.IsSuccess(), w.Err())
	}
	if w.Seq() != 7 || w.Fingerprint() != fp || w.Source() != 1 {
		t.Fatalf("identity: seq %d fp %+v source %d", w.Seq(), w.Fingerprint(), w.Source())
	}
	tm := w.Timings()
	if tm.Created.IsZero() || tm.Started.Before(tm.Created) || tm.Completed.Before(tm.Started) {
		t.Fatalf("timings out of order: %+v", tm)
	}
	select {
	case <-w.Done():
	default:
		t.Fatal("Done not closed after Complete")
	}
}

// TestFailedWorkIsComplete: FailedWork hands out a Work already complete
// with its error (nil: an op that does nothing).
func TestFailedWorkIsComplete(t *testing.T) {
	w := comm.FailedWork(comm.OpSend, comm.ErrClosed)
	if !w.IsCompleted() || !errors.Is(w.Err(), comm.ErrClosed) || w.OpType() != comm.OpSend {
		t.Fatalf("FailedWork: completed %v err %v op %v", w.IsCompleted(), w.Err(), w.OpType())
	}
	if ok := comm.FailedWork(comm.OpBarrier, nil); !ok.IsSuccess() {
		t.Fatal("FailedWork(nil) is not a success")
	}
}
