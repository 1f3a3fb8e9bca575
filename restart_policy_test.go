package ranktree

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu"
	"github.com/ranktree/ranktree/internal/testrank"
	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/supervisor"
)

// panicOnce makes Init use the CPU engine (TCP), except that the first
// world-group engine of global rank `rank` panics in Launch at seq.
func panicOnce(rank int, seq uint64) Option {
	inner := cpu.Factory(cpu.Options{Transport: "tcp"})
	var armed atomic.Bool
	armed.Store(true)
	return WithBackend(func(ctx context.Context, cfg comm.BackendConfig) (comm.Backend, error) {
		be, err := inner(ctx, cfg)
		if err != nil || cfg.Group != WorldGroupName || cfg.GlobalRanks[cfg.Rank] != rank || !armed.CompareAndSwap(true, false) {
			return be, err
		}
		return testrank.PanicAtSeq(be, seq), nil
	})
}

// exitRecorder records exit codes and whether rank 1's dump was in its
// store when each came.
type exitRecorder struct {
	mu      sync.Mutex
	codes   []int
	dumped  []bool
	dumpKey store.Store
}

func (e *exitRecorder) exit(code int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ok := false
	if e.dumpKey != nil {
		ok, _ = e.dumpKey.Check(context.Background(), []string{supervisor.TraceKey(1)})
	}
	e.codes = append(e.codes, code)
	e.dumped = append(e.dumped, ok)
}

func (e *exitRecorder) snapshot() ([]int, []bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]int(nil), e.codes...), append([]bool(nil), e.dumped...)
}

func clearSupervisionEnv(t *testing.T) {
	for _, v := range []string{EnvFault, supervisor.EnvActorPanic, supervisor.EnvAsyncErrorHandling,
		supervisor.EnvTorchAsyncErrorHandling, supervisor.EnvTimeout} {
		t.Setenv(v, "")
	}
}

// TestActorPanicRestartPolicy: rank 1's communicator actor panics at seq 2
// under the restart policy. Every rank's op at seq 2 fails, every rank
// ends up on epoch+1 by itself (World, Group and Restarted agree), the old
// handle fails with ErrAborted, and the next all-reduce on the new world
// group gives the right sum. No process exits.
func TestActorPanicRestartPolicy(t *testing.T) {
	for _, how := range []string{"env", "option"} {
		t.Run(how, func(t *testing.T) {
			clearSupervisionEnv(t)
			ex := &exitRecorder{}
			opts := []Option{panicOnce(1, 2), WithExit(ex.exit)}
			if how == "env" {
				t.Setenv(supervisor.EnvActorPanic, "restart")
			} else {
				opts = append(opts, WithActorPanic(supervisor.PanicRestart))
			}
			const n = 3
			rts := startRanks(t, n, opts...)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			eachRank(t, rts, func(rt *Runtime) error {
				old := rt.World()
				if err := sumCheck(ctx, old, rt.Rank(), n); err != nil {
					return fmt.Errorf("seq 1: %w", err)
				}
				err := sumCheck(ctx, old, rt.Rank(), n)
				switch {
				case err == nil:
					t.Errorf("rank %d: seq 2 succeeded despite rank 1's panic", rt.Rank())
				case rt.Rank() == 1 && !errors.Is(err, comm.ErrEngine):
					t.Errorf("rank 1: seq 2: %v, want ErrEngine", err)
				}
				npg, err := rt.Restarted(ctx, old)
				if err != nil {
					return fmt.Errorf("waiting for the restart: %w", err)
				}
				if npg.Epoch() != old.Epoch()+1 || rt.World() != npg || rt.Group(WorldGroupName) != npg {
					t.Errorf("rank %d: restarted epoch %d (old %d); World is it: %v, Group is it: %v",
						rt.Rank(), npg.Epoch(), old.Epoch(), rt.World() == npg, rt.Group(WorldGroupName) == npg)
				}
				if err := sumCheck(ctx, old, rt.Rank(), n); !errors.Is(err, comm.ErrAborted) {
					t.Errorf("rank %d: op on the old handle: %v, want ErrAborted", rt.Rank(), err)
				}
				for i := 0; i < 3; i++ {
					if err := sumCheck(ctx, rt.World(), rt.Rank(), n); err != nil {
						return fmt.Errorf("all-reduce %d on the restarted group: %w", i+1, err)
					}
				}
				return nil
			})
			if codes, _ := ex.snapshot(); len(codes) != 0 {
				t.Errorf("restart policy exited: %v", codes)
			}
		})
	}
}

// TestActorPanicEscalates: under the default policy rank 1's panic fails
// its op with ErrEngine, and rank 1 exits once with ExitEscalate after its
// flight-recorder dump is in the store (its peers tear down on the remote
// abort with ExitTearDown, as TearDown mode says).
func TestActorPanicEscalates(t *testing.T) {
	clearSupervisionEnv(t)
	ex := &exitRecorder{}
	const n = 3
	rts := startRanks(t, n, panicOnce(1, 2), WithExit(ex.exit))
	ex.mu.Lock()
	ex.dumpKey = rts[1].Store()
	ex.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	eachRank(t, rts, func(rt *Runtime) error {
		old := rt.World()
		if err := sumCheck(ctx, old, rt.Rank(), n); err != nil {
			return fmt.Errorf("seq 1: %w", err)
		}
		err := sumCheck(ctx, old, rt.Rank(), n)
		if err == nil || (rt.Rank() == 1 && !errors.Is(err, comm.ErrEngine)) {
			t.Errorf("rank %d: seq 2: %v, want an error (ErrEngine on rank 1)", rt.Rank(), err)
		}
		return nil
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		codes, dumped := ex.snapshot()
		escalations := 0
		for i, c := range codes {
			switch c {
			case supervisor.ExitEscalate:
				escalations++
				if !dumped[i] {
					t.Error("exit 4 before rank 1's dump reached the store")
				}
			case supervisor.ExitTearDown:
			default:
				t.Errorf("unexpected exit code %d (all: %v)", c, codes)
			}
		}
		if escalations > 1 {
			t.Fatalf("exit %d requested %d times", supervisor.ExitEscalate, escalations)
		}
		if escalations == 1 && len(codes) == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("exits %v: want one %d (rank 1) and %d from each peer", codes, supervisor.ExitEscalate, supervisor.ExitTearDown)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestWithActorPanicOption(t *testing.T) {
	clearSupervisionEnv(t)
	base := []Option{WithStore(store.NewMemStore()), WithRank(0), WithWorldSize(1), WithLocalRank(0), WithLocalWorldSize(1),
		WithNodeRank(0), WithRestartCount(0), WithJob("ap"), quiet(), WithTimeout(10 * time.Second)}
	var oe *OptionError
	if _, err := Init(context.Background(), append(base, WithActorPanic(0))...); !errors.As(err, &oe) || !errors.Is(err, ErrInvalidOption) {
		t.Errorf("WithActorPanic(0): %v, want an *OptionError", err)
	}
	if _, err := Init(context.Background(), append(base, WithExit(nil))...); !errors.As(err, &oe) {
		t.Errorf("WithExit(nil): %v, want an *OptionError", err)
	}
	t.Setenv(supervisor.EnvAsyncErrorHandling, "TearDown")
	if _, err := Init(context.Background(), append(base, WithActorPanic(supervisor.PanicRestart))...); !errors.As(err, &oe) ||
		oe.Option != "WithActorPanic(restart)" {
		t.Errorf("WithActorPanic(restart) under TearDown: %v, want an *OptionError", err)
	}
	t.Setenv(supervisor.EnvAsyncErrorHandling, "")
	t.Setenv(supervisor.EnvActorPanic, "sometimes")
	var ee *EnvError
	if _, err := Init(context.Background(), base...); !errors.As(err, &ee) || ee.Var != supervisor.EnvActorPanic {
		t.Errorf("RANKTREE_ACTOR_PANIC=sometimes: %v, want an *EnvError naming it", err)
	}
}

// TestActorPanicRestartBound: rank 1's engine panics at seq 1 of every
// epoch. The restart policy re-creates the group MaxAutoRestarts times, then
// every rank escalates (exit 4) instead of restarting again.
func TestActorPanicRestartBound(t *testing.T) {
	clearSupervisionEnv(t)
	t.Setenv(supervisor.EnvActorPanic, "restart")
	inner := cpu.Factory(cpu.Options{Transport: "tcp"})
	always := WithBackend(func(ctx context.Context, cfg comm.BackendConfig) (comm.Backend, error) {
		be, err := inner(ctx, cfg)
		if err != nil || cfg.Group != WorldGroupName || cfg.GlobalRanks[cfg.Rank] != 1 {
			return be, err
		}
		return testrank.PanicAtSeq(be, 1), nil
	})
	ex := &exitRecorder{}
	const n = 3
	rts := startRanks(t, n, always, WithExit(ex.exit))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	eachRank(t, rts, func(rt *Runtime) error {
		restarts := 0
		for {
			pg := rt.World()
			if err := sumCheck(ctx, pg, rt.Rank(), n); err == nil {
				return fmt.Errorf("epoch %d: all-reduce succeeded despite the panic", pg.Epoch())
			}
			wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
			_, err := rt.Restarted(wctx, pg)
			wcancel()
			if err != nil {
				if !errors.Is(err, comm.ErrAborted) {
					t.Errorf("rank %d: Restarted after too many restarts: %v, want ErrAborted", rt.Rank(), err)
				}
				break
			}
			restarts++
		}
		if restarts != MaxAutoRestarts {
			t.Errorf("rank %d: %d automatic restarts, want %d", rt.Rank(), restarts, MaxAutoRestarts)
		}
		return nil
	})
	deadline := time.Now().Add(10 * time.Second)
	codes, _ := ex.snapshot()
	for len(codes) < n && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		codes, _ = ex.snapshot()
	}
	if len(codes) != n {
		t.Fatalf("exits %v, want %d escalations", codes, n)
	}
	for _, c := range codes {
		if c != supervisor.ExitEscalate {
			t.Errorf("exits %v, want only %d", codes, supervisor.ExitEscalate)
		}
	}
}
