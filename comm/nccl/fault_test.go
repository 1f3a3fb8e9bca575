package nccl_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cuda"
	"github.com/ranktree/ranktree/comm/nccl"
	"github.com/ranktree/ranktree/internal/fakegpu"
	"github.com/ranktree/ranktree/store"
)

// hangCallerStream blocks a new caller stream with cuStreamWaitValue32 on
// a zeroed flag and returns a device buffer ordered on it plus a func that
// releases the stream (to call after the test's aborts).
func hangCallerStream(t *testing.T, v *env) (comm.Buffer, func()) {
	t.Helper()
	caller, err := v.cu.StreamCreate(cuda.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	side, _ := v.cu.StreamCreate(cuda.StreamNonBlocking, 0)
	flag := v.dev(comm.Int32, make([]byte, 4), 0)
	must(t, v.cu.StreamWaitValue32(caller, cuda.DevicePtr(flag.DevicePtr()), 1, cuda.StreamWaitValueGEQ))
	buf := v.dev(comm.Float32, make([]byte, 64), caller)
	buf = comm.DeviceBuffer(buf.DevicePtr(), buf.Len(), comm.Float32, 0, uintptr(caller))
	release := func() {
		// Bounded: on a GPU, while an ncclCommAbort is blocked behind
		// this stream these CUDA calls block too (seen on an H200).
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = v.cu.MemsetD32Async(cuda.DevicePtr(flag.DevicePtr()), 1, 1, side)
			_ = v.cu.StreamSynchronize(caller)
			_ = v.cu.StreamDestroy(caller)
			_ = v.cu.StreamDestroy(side)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cudaWedged.Store(true)
			t.Log("releasing the hung stream did not finish in 10 s (CUDA calls blocked behind the abort); leaking it")
		}
	}
	return buf, release
}

// TestHungStreamAbort: an op behind a hung stream never completes; Abort
// (what the watchdog calls, with ncclCommAbort inside) fails it promptly
// with ErrAborted carrying the reason, later ops fail too, Close works.
// On a GPU, ncclCommAbort itself blocks while NCCL's kernel waits behind
// the hung stream: Abort then returns after Options.AbortTimeout, the
// engine reports the wedged communicator, and Close may report that the
// launch goroutine is blocked (it is, in the driver) but returns.
func TestHungStreamAbort(t *testing.T) {
	v := newEnv(t)
	e := v.engine("hung", nccl.Options{EagerInit: true, AbortTimeout: time.Second, FinalizeTimeout: time.Second})
	buf, release := hangCallerStream(t, v)
	defer release()
	w := launch(e, &comm.Op{Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{buf}, FP: fp(comm.OpAllReduce, comm.Float32, 16, 1)})
	if err := wait(t, w, 200*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("op on a hung stream: %v; want still in flight", err)
	}
	if err := e.AsyncError(); err != nil {
		t.Fatalf("AsyncError on a merely hung stream = %v", err)
	}
	reason := errors.New("watchdog: seq 1 timed out")
	start := time.Now()
	e.Abort(reason)
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Abort took %v", took)
	}
	err := wait(t, w, 5*time.Second)
	if !errors.Is(err, comm.ErrAborted) || !errors.Is(err, reason) {
		t.Fatalf("hung op after Abort: %v; want ErrAborted wrapping the reason", err)
	}
	if err := wait(t, launch(e, &comm.Op{Type: comm.OpBarrier}), 5*time.Second); !errors.Is(err, comm.ErrAborted) {
		t.Fatalf("op after Abort: %v", err)
	}
	e.Abort(errors.New("again")) // idempotent
	if err := e.Close(); err != nil {
		if !onGPU() {
			t.Fatal(err)
		}
		t.Logf("Close behind a wedged abort: %v", err)
	}
	t.Logf("engine async error after the abort: %v", e.AsyncError())
}

// TestHangInsideNCCL (fake): a collective that never finishes on the NCCL
// stream (fault hang_after) is released by Abort's ncclCommAbort.
func TestHangInsideNCCL(t *testing.T) {
	fakeOnly(t)
	v := newEnv(t)
	e := v.engine("hang-nccl", nccl.Options{EagerInit: true})
	base := fakegpu.Live("comms")
	fakegpu.Set("reset_count", 0)
	fakegpu.Set("hang_after", 0)
	b := v.dev(comm.Float32, make([]byte, 16), 0)
	w := launch(e, &comm.Op{Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{b}, FP: fp(comm.OpAllReduce, comm.Float32, 4, 1)})
	if err := wait(t, w, 200*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hung collective: %v", err)
	}
	e.Abort(errors.New("deadline"))
	if err := wait(t, w, 5*time.Second); !errors.Is(err, comm.ErrAborted) {
		t.Fatalf("after Abort: %v", err)
	}
	if got := fakegpu.Live("comms"); got != base-1 {
		t.Fatalf("live communicators %d after Abort, want %d (ncclCommAbort not called)", got, base-1)
	}
	fakegpu.Reset()
}

// TestAsyncErrorSurfaced (fake): ncclCommGetAsyncError reporting
// ncclSystemError fails the in-flight op with an *comm.EngineError that
// carries ncclGetLastError's text, AsyncError returns it, and the engine
// aborts itself.
func TestAsyncErrorSurfaced(t *testing.T) {
	fakeOnly(t)
	v := newEnv(t)
	e := v.engine("async", nccl.Options{EagerInit: true, AsyncErrorInterval: time.Millisecond})
	fakegpu.Set("reset_count", 0)
	fakegpu.Set("async_error_after", 0)
	fakegpu.Set("hang_after", 0)
	defer fakegpu.Reset()
	b := v.dev(comm.Float32, make([]byte, 16), 0)
	w := launch(e, &comm.Op{Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{b}, FP: fp(comm.OpAllReduce, comm.Float32, 4, 7)})
	err := wait(t, w, 10*time.Second)
	var ee *comm.EngineError
	if !errors.Is(err, comm.ErrEngine) || !errors.As(err, &ee) || ee.Engine != "nccl" || ee.FP.Seq != 7 ||
		!strings.Contains(err.Error(), "injected async error") || !strings.Contains(err.Error(), "ncclSystemError") {
		t.Fatalf("in-flight op on async error: %v", err)
	}
	aerr := e.AsyncError()
	if !errors.Is(aerr, comm.ErrEngine) || !strings.Contains(aerr.Error(), "injected async error") {
		t.Fatalf("AsyncError = %v", aerr)
	}
	if err := wait(t, launch(e, &comm.Op{Type: comm.OpBarrier}), 5*time.Second); !errors.Is(err, comm.ErrAborted) || !errors.Is(err, comm.ErrEngine) {
		t.Fatalf("op after the async error: %v; want ErrAborted wrapping the engine error", err)
	}
}

// TestAsyncErrorPolled (fake): with nothing in flight the error is found
// by AsyncError (the watchdog's poll) alone.
func TestAsyncErrorPolled(t *testing.T) {
	fakeOnly(t)
	v := newEnv(t)
	e := v.engine("async-idle", nccl.Options{EagerInit: true})
	if err := e.AsyncError(); err != nil {
		t.Fatalf("healthy engine: AsyncError = %v", err)
	}
	fakegpu.Set("reset_count", 0)
	fakegpu.Set("async_error_after", 0)
	defer fakegpu.Reset()
	b := v.dev(comm.Float32, make([]byte, 16), 0)
	_ = wait(t, launch(e, &comm.Op{Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{b}}), 10*time.Second)
	if err := e.AsyncError(); !errors.Is(err, comm.ErrEngine) || !strings.Contains(err.Error(), "ncclSystemError") {
		t.Fatalf("AsyncError = %v", err)
	}
}

// TestInitTimeout: nonblocking init whose peer never joins ends at the
// deadline with an *InitTimeoutError (ErrTimeout) and the half-made
// communicator is aborted; a rank whose rank 0 never publishes the unique
// id times out waiting in the store; lazy init fails the first op and
// every later one.
func TestInitTimeout(t *testing.T) {
	v := newEnv(t)
	base := int64(0)
	if !onGPU() {
		base = fakegpu.Live("comms")
	}
	st := store.NewMemStore()
	start := time.Now()
	_, err := nccl.New(context.Background(), testConfig("lonely", 2, 0, st), nccl.Options{EagerInit: true, InitTimeout: 300 * time.Millisecond})
	var ite *nccl.InitTimeoutError
	if !errors.Is(err, comm.ErrTimeout) || !errors.As(err, &ite) || !strings.Contains(ite.Phase, "in progress") {
		t.Fatalf("rank 0 without its peer: %v", err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("init timeout took %v", took)
	}
	if !onGPU() {
		if got := fakegpu.Live("comms"); got != base {
			t.Fatalf("%d communicators left after init timeout, want %d", got, base)
		}
	}
	_, err = nccl.New(context.Background(), testConfig("no-root", 2, 1, st), nccl.Options{EagerInit: true, InitTimeout: 200 * time.Millisecond})
	if !errors.Is(err, comm.ErrTimeout) || !errors.As(err, &ite) || !strings.Contains(ite.Phase, "unique id") {
		t.Fatalf("rank 1 without rank 0: %v", err)
	}
	e, err := nccl.New(context.Background(), testConfig("lazy", 2, 0, st), nccl.Options{InitTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("lazy New: %v", err)
	}
	defer e.Close()
	b := v.dev(comm.Float32, make([]byte, 16), 0)
	for i := 0; i < 2; i++ {
		if err := wait(t, launch(e, &comm.Op{Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{b}}), 20*time.Second); !errors.Is(err, comm.ErrTimeout) {
			t.Fatalf("op %d on a lazily initialized communicator missing a peer: %v", i, err)
		}
	}
}

// TestAbortDuringInit: Abort unblocks an op waiting for a lazy init.
func TestAbortDuringInit(t *testing.T) {
	v := newEnv(t)
	e, err := nccl.New(context.Background(), testConfig("abort-init", 2, 0, store.NewMemStore()), nccl.Options{InitTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	b := v.dev(comm.Float32, make([]byte, 16), 0)
	w := launch(e, &comm.Op{Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{b}})
	time.Sleep(100 * time.Millisecond)
	e.Abort(errors.New("peer gone"))
	if err := wait(t, w, 5*time.Second); !errors.Is(err, comm.ErrAborted) {
		t.Fatalf("op during init after Abort: %v", err)
	}
}

// TestInjectedFaults: RANKTREE_FAULT's hang and error faults at a seq.
func TestInjectedFaults(t *testing.T) {
	v := newEnv(t)
	faults, err := comm.ParseFaults("hang@rank=0,seq=2;error@rank=0,seq=3")
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig("faulty", 1, 0, store.NewMemStore())
	cfg.Faults = faults
	e, err := nccl.New(context.Background(), cfg, nccl.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	b := v.dev(comm.Float32, make([]byte, 16), 0)
	op := func(seq uint64) *comm.Work {
		return launch(e, &comm.Op{Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{b}, FP: fp(comm.OpAllReduce, comm.Float32, 4, seq)})
	}
	if err := wait(t, op(1), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	hung := op(2)
	if err := wait(t, op(3), 10*time.Second); !errors.Is(err, comm.ErrEngine) {
		t.Fatalf("error fault: %v", err)
	}
	if err := wait(t, hung, 100*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hang fault: %v", err)
	}
	e.Abort(errors.New("timeout"))
	if err := wait(t, hung, 5*time.Second); !errors.Is(err, comm.ErrAborted) {
		t.Fatalf("hang fault after Abort: %v", err)
	}
}

// TestCloseFailsInFlight: Close fails in-flight ops with ErrClosed and
// releases the communicator. On a GPU, NCCL's teardown of a communicator
// whose kernel waits behind the hung stream blocks (ncclCommDestroy, seen
// on an H200): Close then returns its bounded error instead, after
// FinalizeTimeout + 10 s, and the in-flight op has failed all the same.
func TestCloseFailsInFlight(t *testing.T) {
	v := newEnv(t)
	e := v.engine("closing", nccl.Options{EagerInit: true, FinalizeTimeout: time.Second})
	buf, release := hangCallerStream(t, v)
	w := launch(e, &comm.Op{Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{buf}})
	if err := e.Close(); err != nil {
		if !onGPU() {
			t.Fatal(err)
		}
		t.Logf("Close with an op behind a hung stream: %v", err)
	}
	if err := wait(t, w, 5*time.Second); !errors.Is(err, comm.ErrClosed) {
		t.Fatalf("in-flight op at Close: %v", err)
	}
	release()
	if err := wait(t, launch(e, &comm.Op{Type: comm.OpBarrier}), time.Second); !errors.Is(err, comm.ErrClosed) {
		t.Fatalf("op after Close: %v", err)
	}
}
