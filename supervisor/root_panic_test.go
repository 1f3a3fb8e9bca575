package supervisor

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/internal/testrank"
	"github.com/ranktree/ranktree/store"
)

// exits records every exit request, in order, with whether the trace dump
// was already in the store at that moment.
type exits struct {
	mu        sync.Mutex
	codes     []int
	dumpFirst []bool
	st        store.Store // nil: dumpFirst not checked
	rank      int
}

func (e *exits) Exit(code int) {
	dumped := false
	if e.st != nil {
		dumped, _ = e.st.Check(context.Background(), []string{TraceKey(e.rank)})
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.codes = append(e.codes, code)
	e.dumpFirst = append(e.dumpFirst, dumped)
}

func (e *exits) snapshot() ([]int, []bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]int(nil), e.codes...), append([]bool(nil), e.dumpFirst...)
}

// panickyGroup is a communicator over a Recorder whose Launch panics at
// collective seq panicAt, spawned under parent, and its process group.
func panickyGroup(t *testing.T, sys *actor.ActorSystem, parent actors.Spawner, obs actors.Observer, panicAt uint64) (*actors.Communicator, *comm.ProcessGroup, *testrank.Recorder) {
	t.Helper()
	be := testrank.NewRecorder(0, 2)
	be.OnLaunch(func(op *comm.Op, _ *comm.Promise) {
		if op.FP.Seq == panicAt {
			panic("injected engine panic")
		}
	})
	c, err := actors.NewCommunicator(sys, be, actors.CommunicatorConfig{Group: "g", Epoch: 7, Observer: obs, Parent: parent, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	pg, err := comm.NewProcessGroup(comm.GroupConfig{Name: "g", Epoch: 7, Rank: 0, Size: 2, Launcher: c, Engine: "recorder"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := pg.Destroy(ctx); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	return c, pg, be
}

func allreduce(pg *comm.ProcessGroup) (*comm.Work, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w := pg.AllReduce(ctx, comm.NewHostBuffer(comm.Float32, 4), comm.Sum)
	return w, w.Wait(ctx)
}

// mustEngineError checks that err is the panic's *EngineError at seq.
func mustEngineError(t *testing.T, err error, seq uint64) {
	t.Helper()
	var ee *comm.EngineError
	if !errors.As(err, &ee) || !errors.Is(err, comm.ErrEngine) || ee.FP.Seq != seq || !strings.Contains(err.Error(), "injected engine panic") {
		t.Fatalf("panicking op: %v, want an *EngineError at seq %d naming the panic", err, seq)
	}
}

// TestCommunicatorPanicEscalates: under the default policy a communicator
// actor's panic fails its op with ErrEngine, the root dumps, then exits
// with ExitEscalate; the stopped actor fails later ops with ErrClosed and
// closes at once.
func TestCommunicatorPanicEscalates(t *testing.T) {
	sys := newSystem()
	rec := &recorder{}
	root := StartRoot(sys, RootConfig{Exit: rec.Exit, Dumper: rec, Events: rec})
	defer root.Stop(5 * time.Second)
	c, pg, _ := panickyGroup(t, sys, root, nil, 2)
	if !strings.HasPrefix(c.PID().Id, root.PID().Id+"/comm-g-e7-") {
		t.Errorf("communicator %q is not a named child of the root %q", c.PID().Id, root.PID().Id)
	}
	if _, err := allreduce(pg); err != nil {
		t.Fatalf("op 1: %v", err)
	}
	_, err := allreduce(pg)
	mustEngineError(t, err, 2)
	eventually(t, "escalation", func() bool { return rec.exited.Load() != 0 })
	if code := rec.exited.Load(); code != ExitEscalate {
		t.Errorf("exit code %d, want %d", code, ExitEscalate)
	}
	log, evs := rec.snapshot()
	if len(log) != 2 || !strings.HasPrefix(log[0], "dump: ") || !strings.Contains(log[0], `group "g"`) ||
		!strings.Contains(log[0], "injected engine panic") || log[1] != "exit" {
		t.Errorf("want a dump naming the group and the panic, then exit; got %q", log)
	}
	if len(evs) != 1 || evs[0].Kind != actors.KindRestart || evs[0].Action != "escalate" {
		t.Errorf("events %+v", evs)
	}
	if pe := c.PanicErr(); !errors.Is(pe, comm.ErrEngine) {
		t.Errorf("PanicErr() = %v", pe)
	}
	eventually(t, "the escalated actor stopped", c.Stopped)
	if _, err := allreduce(pg); !errors.Is(err, comm.ErrClosed) {
		t.Errorf("op after escalation: %v, want ErrClosed", err)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil || time.Since(start) > 3*time.Second {
		t.Errorf("Close of the stopped communicator: %v after %v", err, time.Since(start))
	}
}

// TestCommunicatorPanicRestart: under PanicRestart the root restarts the
// actor in place; OnRestarted gets the *actors.Panic naming group and seq,
// and the actor serves later ops with its counters kept.
func TestCommunicatorPanicRestart(t *testing.T) {
	sys := newSystem()
	rec := &recorder{}
	restarted := make(chan any, 1)
	root := StartRoot(sys, RootConfig{Policy: PanicRestart.Decide, Exit: rec.Exit, Dumper: rec, Events: rec,
		OnRestarted: func(_ *actor.PID, reason any) { restarted <- reason }})
	defer root.Stop(5 * time.Second)
	_, pg, _ := panickyGroup(t, sys, root, nil, 2)
	if _, err := allreduce(pg); err != nil {
		t.Fatalf("op 1: %v", err)
	}
	_, err := allreduce(pg)
	mustEngineError(t, err, 2)
	select {
	case reason := <-restarted:
		p, ok := reason.(*actors.Panic)
		if !ok || p.Group != "g" || p.Epoch != 7 || p.FP.Seq != 2 || p.Value != "injected engine panic" || len(p.Stack) == 0 {
			t.Errorf("OnRestarted reason %#v", reason)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("OnRestarted not called")
	}
	w, err := allreduce(pg)
	if err != nil || w.Seq() != 3 {
		t.Fatalf("op after the restart: seq %d err %v, want seq 3 and success", w.Seq(), err)
	}
	if rec.exited.Load() != 0 {
		t.Error("restart policy exited the process")
	}
	if _, evs := rec.snapshot(); len(evs) != 1 || evs[0].Action != "restart" {
		t.Errorf("events %+v", evs)
	}
}

// TestRankPanicPolicies runs a communicator under a whole rank's
// supervision (root, watchdog, store) and checks both policies end to end:
// escalate exits once with ExitEscalate after the dump, although the
// watchdog also reacts to the failed op in TearDown mode; restart keeps the
// process, and the watchdog aborts the group, writes abort/<comm-id> and
// the restarted actor fails later ops with ErrAborted.
func TestRankPanicPolicies(t *testing.T) {
	for _, policy := range []PanicPolicy{PanicEscalate, PanicRestart} {
		t.Run(policy.String(), func(t *testing.T) {
			st := store.NewMemStore()
			defer st.Close()
			ex := &exits{st: st}
			cfg, err := Config{ActorPanic: policy, WatchdogInterval: 5 * time.Millisecond}.Validate()
			if err != nil {
				t.Fatal(err)
			}
			if want := map[PanicPolicy]ErrorHandling{PanicEscalate: TearDown, PanicRestart: CleanupOnly}[policy]; cfg.ErrorHandling != want {
				t.Fatalf("error handling %v under %v, want %v", cfg.ErrorHandling, policy, want)
			}
			sys := newSystem()
			r, err := StartRank(sys, RankConfig{Job: "pp", Rank: 0, WorldSize: 2, Cfg: cfg, Store: st, Exit: ex.Exit, Log: zerolog.Nop()})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close(2 * time.Second)
			be := testrank.NewRecorder(0, 2)
			be.OnLaunch(func(op *comm.Op, _ *comm.Promise) {
				if op.FP.Seq == 2 {
					panic("injected engine panic")
				}
			})
			obs := r.AttachGroup(GroupSpec{Name: "g", Epoch: 7, Engine: "recorder", Members: []int{0, 1}}, 0, be)
			c, err := actors.NewCommunicator(sys, be, actors.CommunicatorConfig{Group: "g", Epoch: 7, Observer: obs, Parent: r.Root,
				OnPanic: func(p *actors.Panic) { r.ActorPanicked(p) }, Log: zerolog.Nop()})
			if err != nil {
				t.Fatal(err)
			}
			pg, err := comm.NewProcessGroup(comm.GroupConfig{Name: "g", Epoch: 7, Rank: 0, Size: 2, Launcher: c, Engine: "recorder"})
			if err != nil {
				t.Fatal(err)
			}
			defer pg.Destroy(context.Background())
			if _, err := allreduce(pg); err != nil {
				t.Fatalf("op 1: %v", err)
			}
			_, err = allreduce(pg)
			mustEngineError(t, err, 2)
			// Either way the watchdog sees the failed op: abort and announce.
			eventually(t, "abort/g.7 in the store", func() bool {
				ok, _ := st.Check(context.Background(), []string{AbortKey(CommID("g", 7))})
				return ok
			})
			eventually(t, "engine aborted", func() bool { return errors.Is(be.AsyncError(), comm.ErrEngine) })
			time.Sleep(100 * time.Millisecond) // let a second exit request, if any, arrive
			codes, dumpFirst := ex.snapshot()
			switch policy {
			case PanicEscalate:
				if len(codes) != 1 || codes[0] != ExitEscalate || !dumpFirst[0] || r.ExitCode() != ExitEscalate {
					t.Errorf("exits %v (dump first: %v), rank exit code %d; want one exit %d after the dump", codes, dumpFirst, r.ExitCode(), ExitEscalate)
				}
			case PanicRestart:
				if len(codes) != 0 {
					t.Errorf("restart policy exited: %v", codes)
				}
				if _, err := allreduce(pg); !errors.Is(err, comm.ErrAborted) {
					t.Errorf("op on the aborted group: %v, want ErrAborted", err)
				}
			}
		})
	}
}

func TestRankEscalateOnce(t *testing.T) {
	st := store.NewMemStore()
	defer st.Close()
	ex := &exits{st: st, rank: 3}
	r, err := StartRank(newSystem(), RankConfig{Job: "eo", Rank: 3, WorldSize: 4, Store: st, Exit: ex.Exit, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(2 * time.Second)
	r.Escalate("restart of group g failed")
	r.exit(ExitTearDown)
	r.Escalate("again")
	codes, dumpFirst := ex.snapshot()
	if len(codes) != 1 || codes[0] != ExitEscalate || !dumpFirst[0] {
		t.Errorf("exits %v (dump first %v), want one %d after the dump", codes, dumpFirst, ExitEscalate)
	}
}

func TestConfigActorPanic(t *testing.T) {
	c, err := ConfigFromEnv(env(map[string]string{EnvActorPanic: "Restart"}))
	if err != nil || c.ActorPanic != PanicRestart || c.ErrorHandling != CleanupOnly {
		t.Errorf("restart: %+v, %v; want PanicRestart selecting CleanupOnly", c, err)
	}
	c, err = ConfigFromEnv(env(map[string]string{EnvActorPanic: "restart", EnvAsyncErrorHandling: "2"}))
	if err != nil || c.ActorPanic != PanicRestart || c.ErrorHandling != CleanupOnly {
		t.Errorf("restart + CleanupOnly: %+v, %v", c, err)
	}
	c, err = ConfigFromEnv(env(map[string]string{EnvActorPanic: "escalate", EnvAsyncErrorHandling: "NoHandling"}))
	if err != nil || c.ActorPanic != PanicEscalate || c.ErrorHandling != NoHandling {
		t.Errorf("escalate: %+v, %v", c, err)
	}
	if c, _ := ConfigFromEnv(env(nil)); c.ActorPanic.Decide(nil, "x") != Escalate {
		t.Errorf("default policy decides %v, want escalate", c.ActorPanic.Decide(nil, "x"))
	}
	for _, bad := range []map[string]string{
		{EnvActorPanic: "abc"},
		{EnvActorPanic: "-1"},
		{EnvActorPanic: "restart", EnvAsyncErrorHandling: "TearDown"},
		{EnvActorPanic: "restart", EnvTorchAsyncErrorHandling: "3"},
		{EnvActorPanic: "restart", EnvAsyncErrorHandling: "0"},
	} {
		_, err := ConfigFromEnv(env(bad))
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Var != EnvActorPanic || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), EnvActorPanic) {
			t.Errorf("%v: %v, want a *ConfigError naming %s", bad, err, EnvActorPanic)
		}
	}
	if _, err := ParsePanicPolicy("stop"); err == nil {
		t.Error("ParsePanicPolicy accepted stop")
	}
}
