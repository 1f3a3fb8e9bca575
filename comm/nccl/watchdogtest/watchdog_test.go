package watchdogtest

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cuda"
	"github.com/ranktree/ranktree/comm/nccl"
	"github.com/ranktree/ranktree/internal/fakegpu"
	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/supervisor"
)

func TestMain(m *testing.M) { fakegpu.Main(m) }

func onGPU() bool { return os.Getenv("RANKTREE_GPU_TESTS") == "1" }

type exitRecorder struct{ code atomic.Int32 }

func (r *exitRecorder) Exit(code int) { r.code.Store(int32(code) + 1) }

// setup loads the libraries (fake in CI) and makes device 0's primary
// context current on the locked test thread.
func setup(t *testing.T) *cuda.Lib {
	t.Helper()
	if !onGPU() {
		fakegpu.Build(t)
		fakegpu.Reset()
	}
	cu, err := cuda.Load()
	if err != nil {
		t.Fatal(err)
	}
	if err := cu.Init(); err != nil {
		t.Fatal(err)
	}
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	d, _ := cu.DeviceGet(0)
	ctx, err := cu.PrimaryCtxRetain(d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cu.PrimaryCtxRelease(d) })
	if err := cu.CtxSetCurrent(ctx); err != nil {
		t.Fatal(err)
	}
	return cu
}

func startWatchdog(t *testing.T, exit *exitRecorder) *supervisor.Watchdog {
	t.Helper()
	wd, err := supervisor.NewWatchdog(supervisor.WatchdogConfig{Rank: 0, Exit: exit.Exit,
		Cfg: supervisor.Config{ErrorHandling: supervisor.CleanupOnly, Timeout: time.Minute, WatchdogInterval: 5 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}))
	wd.Start(sys, nil)
	t.Cleanup(func() { _ = wd.Stop(5 * time.Second) })
	return wd
}

// TestWatchdogTimesOutHungStream is gpu-check step 3: an allreduce behind
// a stream hung by cuStreamWaitValue32 is failed by the watchdog with
// ErrTimeout, the communicator is aborted (ncclCommAbort), later ops fail
// with ErrAborted, and under CleanupOnly the process is not torn down.
func TestWatchdogTimesOutHungStream(t *testing.T) {
	cu := setup(t)
	base := int64(0)
	if !onGPU() {
		base = fakegpu.Live("comms")
	}
	exit := &exitRecorder{}
	wd := startWatchdog(t, exit)
	cfg := comm.BackendConfig{Group: "default_pg", Epoch: 0, Rank: 0, Size: 1, Store: store.NewMemStore(), Device: 0,
		Timeout: 30 * time.Second, Log: zerolog.Nop()}
	// AbortTimeout 2 s: on a GPU, ncclCommAbort blocks while NCCL's kernel
	// waits behind the hung stream (engine.abortComms).
	e, err := nccl.New(context.Background(), cfg, nccl.Options{EagerInit: true, AbortTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	wd.Register(supervisor.GroupSpec{Name: "default_pg", Engine: "nccl", Members: []int{0}, Timeout: time.Minute}, e, e)

	caller, _ := cu.StreamCreate(cuda.StreamNonBlocking, 0)
	side, _ := cu.StreamCreate(cuda.StreamNonBlocking, 0)
	flag, _ := cu.MemAlloc(4)
	data, _ := cu.MemAlloc(64)
	defer func() {
		// Release the stream before freeing. Bounded: with an abort
		// still blocked in the driver, these calls may block too.
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = cu.MemsetD32Async(flag, 1, 1, side)
			_ = cu.StreamSynchronize(caller)
			_ = cu.MemFree(flag)
			_ = cu.MemFree(data)
			_ = cu.StreamDestroy(caller)
			_ = cu.StreamDestroy(side)
		}()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Log("releasing the hung stream did not finish in 20 s (CUDA calls blocked behind the abort); leaking it")
		}
	}()
	if err := cu.MemsetD32Async(flag, 0, 1, side); err != nil {
		t.Fatal(err)
	}
	_ = cu.StreamSynchronize(side)
	if err := cu.StreamWaitValue32(caller, flag, 1, cuda.StreamWaitValueGEQ); err != nil {
		t.Fatal(err)
	}
	fp := comm.Fingerprint{Group: comm.GroupHash("default_pg"), Seq: 1, Op: comm.OpAllReduce, DType: comm.Float32, RedOp: comm.RedSum, Count: 16, Root: -1}
	op := &comm.Op{FP: fp, Type: comm.OpAllReduce, Reduce: comm.Sum,
		In: []comm.Buffer{comm.DeviceBuffer(uintptr(data), 16, comm.Float32, 0, uintptr(caller))}}
	p := comm.NewPromise(comm.OpAllReduce)
	p.SetSeq(1)
	wd.Track("default_pg", fp, 300*time.Millisecond, p)
	e.Launch(op, p)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = p.Work().Wait(ctx)
	if !errors.Is(err, comm.ErrTimeout) {
		t.Fatalf("hung op: %v; want ErrTimeout from the watchdog", err)
	}
	t.Logf("watchdog: %v", err)
	t.Logf("engine async error after the abort: %v", e.AsyncError())
	// The watchdog aborts the communicator: later ops fail with ErrAborted.
	deadline := time.Now().Add(10 * time.Second)
	for {
		w2 := comm.NewPromise(comm.OpBarrier)
		e.Launch(&comm.Op{Type: comm.OpBarrier}, w2)
		ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
		err2 := w2.Work().Wait(ctx2)
		cancel2()
		if errors.Is(err2, comm.ErrAborted) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine not aborted by the watchdog: last op %v", err2)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !onGPU() {
		// Abort stores its error before it calls ncclCommAbort, so the op
		// above can fail first: wait for the abort itself.
		for got := fakegpu.Live("comms"); got != base; got = fakegpu.Live("comms") {
			if time.Now().After(deadline) {
				t.Fatalf("%d live communicators after the watchdog's abort, want %d", got, base)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if c := exit.code.Load(); c != 0 {
		t.Fatalf("CleanupOnly tore the process down (exit %d)", c-1)
	}
}

// TestWatchdogAbortBlocked (fake): when ncclCommAbort blocks (as the real
// one does while NCCL's kernel waits behind a stream that never moves),
// the watchdog still fails the hung op with ErrTimeout after
// Options.AbortTimeout, later ops fail with ErrAborted at once, the engine
// reports the wedged communicator through AsyncError, the process is not
// torn down, and once the abort returns the communicator is freed and
// Close returns.
func TestWatchdogAbortBlocked(t *testing.T) {
	if onGPU() {
		t.Skip("uses the fake library's abort_blocks fault (TestWatchdogTimesOutHungStream is its GPU counterpart)")
	}
	setup(t)
	base := fakegpu.Live("comms")
	exit := &exitRecorder{}
	wd := startWatchdog(t, exit)
	cfg := comm.BackendConfig{Group: "pg_wedged", Rank: 0, Size: 1, Store: store.NewMemStore(), Device: 0,
		Timeout: 30 * time.Second, Log: zerolog.Nop()}
	e, err := nccl.New(context.Background(), cfg, nccl.Options{EagerInit: true, AbortTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	released := false
	release := func() {
		if !released {
			released = true
			fakegpu.Set("abort_blocks", 0)
		}
	}
	defer release()
	wd.Register(supervisor.GroupSpec{Name: "pg_wedged", Engine: "nccl", Members: []int{0}, Timeout: time.Minute}, e, e)
	fakegpu.Set("hang_after", 0)
	fakegpu.Set("abort_blocks", 1)

	fp := comm.Fingerprint{Group: comm.GroupHash("pg_wedged"), Seq: 1, Op: comm.OpBarrier, Root: -1}
	p := comm.NewPromise(comm.OpBarrier)
	p.SetSeq(1)
	wd.Track("pg_wedged", fp, 100*time.Millisecond, p)
	start := time.Now()
	e.Launch(&comm.Op{FP: fp, Type: comm.OpBarrier}, p)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Work().Wait(ctx); !errors.Is(err, comm.ErrTimeout) {
		t.Fatalf("hung op behind a blocked abort: %v; want ErrTimeout", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("ErrTimeout after %v; want about the op timeout + AbortTimeout", d)
	}
	var ee *comm.EngineError
	if aerr := e.AsyncError(); !errors.As(aerr, &ee) || !strings.Contains(aerr.Error(), "did not return within") {
		t.Fatalf("AsyncError after a blocked abort: %v; want an *comm.EngineError saying the abort did not return", aerr)
	}
	w2 := comm.NewPromise(comm.OpBarrier)
	t0 := time.Now()
	e.Launch(&comm.Op{Type: comm.OpBarrier}, w2)
	if err := w2.Work().Wait(ctx); !errors.Is(err, comm.ErrAborted) || time.Since(t0) > time.Second {
		t.Fatalf("op after the abort: %v after %v; want ErrAborted at once", err, time.Since(t0))
	}
	if c := exit.code.Load(); c != 0 {
		t.Fatalf("CleanupOnly tore the process down (exit %d)", c-1)
	}
	if got := fakegpu.Live("comms"); got == base {
		t.Fatal("communicator freed while ncclCommAbort is still blocked")
	}
	release()
	deadline := time.Now().Add(10 * time.Second)
	for got := fakegpu.Live("comms"); got != base; got = fakegpu.Live("comms") {
		if time.Now().After(deadline) {
			t.Fatalf("%d live communicators after the abort returned, want %d", got, base)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("Close after the abort returned: %v", err)
	}
}

// TestWatchdogSeesAsyncError (fake): an NCCL async error found by the
// watchdog's AsyncError poll makes it abort the communicator.
func TestWatchdogSeesAsyncError(t *testing.T) {
	if onGPU() {
		t.Skip("uses the fake library's async-error fault")
	}
	cu := setup(t)
	exit := &exitRecorder{}
	wd := startWatchdog(t, exit)
	cfg := comm.BackendConfig{Group: "pg_async", Rank: 0, Size: 1, Store: store.NewMemStore(), Device: 0,
		Timeout: 30 * time.Second, Log: zerolog.Nop()}
	e, err := nccl.New(context.Background(), cfg, nccl.Options{EagerInit: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	wd.Register(supervisor.GroupSpec{Name: "pg_async", Engine: "nccl", Members: []int{0}}, e, e)
	data, _ := cu.MemAlloc(64)
	defer cu.MemFree(data)
	fakegpu.Set("reset_count", 0)
	fakegpu.Set("async_error_after", 0)
	defer fakegpu.Reset()
	buf := comm.DeviceBuffer(uintptr(data), 16, comm.Float32, 0, 0)
	p := comm.NewPromise(comm.OpAllReduce)
	e.Launch(&comm.Op{Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{buf}}, p)
	_ = p.Work().Wait(context.Background())
	deadline := time.Now().Add(10 * time.Second)
	for {
		w2 := comm.NewPromise(comm.OpBarrier)
		e.Launch(&comm.Op{Type: comm.OpBarrier}, w2)
		err2 := w2.Work().Wait(context.Background())
		if errors.Is(err2, comm.ErrAborted) {
			t.Logf("after the async error: %v", err2)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("watchdog did not abort on the async error; last op: %v", err2)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if c := exit.code.Load(); c != 0 {
		t.Fatalf("CleanupOnly tore the process down (exit %d)", c-1)
	}
}
