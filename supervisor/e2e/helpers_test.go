package e2e

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/supervisor"
)

// fakeEngine is an Abortable + AsyncErrorSource recording the first abort.
type fakeEngine struct {
	mu      sync.Mutex
	aborted error
}

func (f *fakeEngine) Abort(reason error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.aborted == nil {
		f.aborted = reason
	}
}

func (f *fakeEngine) AsyncError() error { return nil }

func (f *fakeEngine) abortReason() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.aborted
}

// exitRecorder records exit codes instead of exiting.
type exitRecorder struct{ code atomic.Int32 }

func (r *exitRecorder) Exit(code int) { r.code.Store(int32(code)) }

func newSystem() *actor.ActorSystem {
	return actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}))
}

func startWatchdog(t *testing.T, rank int, mode supervisor.ErrorHandling, st store.Store) *supervisor.Watchdog {
	t.Helper()
	wd, err := supervisor.NewWatchdog(supervisor.WatchdogConfig{Rank: rank, Store: st, Exit: (&exitRecorder{}).Exit,
		Cfg:              supervisor.Config{ErrorHandling: mode, Timeout: time.Minute, WatchdogInterval: 5 * time.Millisecond},
		ProgressInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	wd.Start(newSystem(), nil)
	t.Cleanup(func() { _ = wd.Stop(5 * time.Second) })
	return wd
}

func fpAt(seq uint64) comm.Fingerprint {
	return comm.Fingerprint{Group: comm.GroupHash("default_pg"), Seq: seq, Op: comm.OpAllReduce, DType: comm.Float32,
		RedOp: comm.RedSum, Count: 1024, Root: -1}
}

func waitWork(t *testing.T, w *comm.Work, within time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	err := w.Wait(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("work still in flight after %v", within)
	}
	return err
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
