package actors_test

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
)

// failures is a supervisor strategy that records each failure's reason and
// then applies decide (restart or stop).
type failures struct {
	mu      sync.Mutex
	reasons []any
	stop    bool
}

func (f *failures) HandleFailure(_ *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, _ *actor.RestartStatistics, reason, _ any) {
	f.mu.Lock()
	f.reasons = append(f.reasons, reason)
	stop := f.stop
	f.mu.Unlock()
	if stop {
		sup.StopChildren(child)
	} else {
		sup.RestartChildren(child)
	}
}

func (f *failures) seen() []any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]any(nil), f.reasons...)
}

// parent is an actor that spawns children on request under strategy; it
// implements actors.Spawner and SpawnPrefix (plainSpawner hides the latter).
type parent struct {
	system *actor.ActorSystem
	pid    *actor.PID
}

type spawnMsg struct {
	props  *actor.Props
	prefix string
}

func newParent(system *actor.ActorSystem, strategy actor.SupervisorStrategy) *parent {
	pid := system.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		if m, ok := ctx.Message().(spawnMsg); ok {
			if m.prefix == "" {
				ctx.Respond(ctx.Spawn(m.props))
			} else {
				ctx.Respond(ctx.SpawnPrefix(m.props, m.prefix))
			}
		}
	}, actor.WithSupervisor(strategy)))
	return &parent{system: system, pid: pid}
}

func (p *parent) SpawnPrefix(props *actor.Props, prefix string) *actor.PID {
	res, err := p.system.Root.RequestFuture(p.pid, spawnMsg{props: props, prefix: prefix}, 5*time.Second).Result()
	if err != nil {
		return nil
	}
	return res.(*actor.PID)
}

func (p *parent) Spawn(props *actor.Props) *actor.PID { return p.SpawnPrefix(props, "") }

// plainSpawner hides SpawnPrefix.
type plainSpawner struct{ p *parent }

func (s plainSpawner) Spawn(props *actor.Props) *actor.PID { return s.p.Spawn(props) }

// nilSpawner is a parent that has stopped.
type nilSpawner struct{}

func (nilSpawner) Spawn(*actor.Props) *actor.PID { return nil }

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func panicking(seq uint64) *testrank.Recorder {
	rec := testrank.NewRecorder(0, 2)
	rec.OnLaunch(func(op *comm.Op, p *comm.Promise) {
		if op.FP.Seq == seq {
			panic("engine exploded")
		}
	})
	return rec
}

// TestPanicReachesParent checks that a panic while handling an op fails
// the op's Work with an *EngineError, calls OnPanic first, and reaches the
// parent's supervisor as an *actors.Panic; after the parent's restart the
// actor keeps its counters and serves later ops.
func TestPanicReachesParent(t *testing.T) {
	sys := testrank.QuietSystem()
	strat := &failures{}
	par := newParent(sys, strat)
	var onPanic []*actors.Panic
	var mu sync.Mutex
	c, err := actors.NewCommunicator(sys, panicking(2), actors.CommunicatorConfig{Group: "g", Epoch: 5, Parent: par, Log: zerolog.Nop(),
		OnPanic: func(p *actors.Panic) { mu.Lock(); onPanic = append(onPanic, p); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(c.PID().Id, par.pid.Id+"/comm-g-e5-") {
		t.Errorf("actor id %q: not a named child of %q", c.PID().Id, par.pid.Id)
	}
	pg, err := comm.NewProcessGroup(comm.GroupConfig{Name: "g", Epoch: 5, Rank: 0, Size: 2, Launcher: c, Engine: "recorder"})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Destroy(context.Background())
	ctx := context.Background()
	for i := uint64(1); i <= 3; i++ {
		w := pg.AllReduce(ctx, comm.NewHostBuffer(comm.Int32, 1), comm.Sum)
		err := w.Wait(ctx)
		if i != 2 {
			if err != nil || w.Seq() != i {
				t.Fatalf("op %d: seq %d err %v", i, w.Seq(), err)
			}
			continue
		}
		var ee *comm.EngineError
		if !errors.As(err, &ee) || ee.FP.Seq != 2 || !strings.Contains(err.Error(), "engine exploded") {
			t.Fatalf("op 2: %v, want an *EngineError at seq 2 naming the panic", err)
		}
		if pe := c.PanicErr(); pe == nil || pe.Error() != err.Error() {
			t.Errorf("PanicErr() = %v, want the op's error", pe)
		}
		waitFor(t, "the parent's strategy", func() bool { return len(strat.seen()) == 1 })
	}
	p, ok := strat.seen()[0].(*actors.Panic)
	if !ok || p.Group != "g" || p.Epoch != 5 || p.FP.Seq != 2 || p.Value != "engine exploded" || len(p.Stack) == 0 ||
		!strings.Contains(p.Error(), `group "g" (epoch 5)`) {
		t.Errorf("parent saw %#v", strat.seen()[0])
	}
	mu.Lock()
	defer mu.Unlock()
	if len(onPanic) != 1 || onPanic[0] != p {
		t.Errorf("OnPanic got %v, want the same *Panic once", onPanic)
	}
}

// TestStoppedByParent checks that once the parent stops the panicked
// actor, later ops fail with ErrClosed instead of being lost, and Close
// returns at once.
func TestStoppedByParent(t *testing.T) {
	sys := testrank.QuietSystem()
	par := newParent(sys, &failures{stop: true})
	c, err := actors.NewCommunicator(sys, panicking(1), actors.CommunicatorConfig{Group: "g", Parent: plainSpawner{par}, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(c.PID().Id, "comm-g") {
		t.Errorf("a Spawner without SpawnPrefix named the actor %q", c.PID().Id)
	}
	p := comm.NewPromise(comm.OpBarrier)
	c.Submit(context.Background(), &comm.Op{Type: comm.OpBarrier}, p)
	if err := p.Work().Err(); !errors.Is(err, comm.ErrEngine) {
		t.Fatalf("panicking op: %v", err)
	}
	waitFor(t, "the actor stopped", c.Stopped)
	p = comm.NewPromise(comm.OpBarrier)
	c.Submit(context.Background(), &comm.Op{Type: comm.OpBarrier}, p)
	if err := p.Work().Err(); !errors.Is(err, comm.ErrClosed) || !strings.Contains(err.Error(), "supervisor") {
		t.Errorf("op after the stop: %v, want ErrClosed naming the supervisor", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := c.Close(ctx); err != nil || time.Since(start) > 2*time.Second {
		t.Errorf("Close: %v after %v", err, time.Since(start))
	}
}

func TestNewCommunicatorStoppedParent(t *testing.T) {
	rec := testrank.NewRecorder(0, 1)
	_, err := actors.NewCommunicator(testrank.QuietSystem(), rec, actors.CommunicatorConfig{Group: "g", Parent: nilSpawner{}})
	if !errors.Is(err, comm.ErrClosed) || rec.Closed() {
		t.Errorf("stopped parent: %v (backend closed: %v), want ErrClosed and the backend left open", err, rec.Closed())
	}
}

// TestPanicHandsOverQueuedLaunches: callers on many goroutines submit
// while a launch on one of their goroutines panics (duty 5). The panic
// reaches the parent once; the op that panicked fails with an
// *EngineError; every other op, including those queued behind it and
// those submitted later (now through the actor's mailbox), is launched
// once, in seq order, and succeeds after the parent's restart.
func TestPanicHandsOverQueuedLaunches(t *testing.T) {
	sys := testrank.QuietSystem()
	strat := &failures{}
	par := newParent(sys, strat)
	const callers, per, bad = 6, 100, 150
	c, err := actors.NewCommunicator(sys, panicking(bad), actors.CommunicatorConfig{Group: "g", Parent: par, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	pg, err := comm.NewProcessGroup(comm.GroupConfig{Name: "g", Rank: 0, Size: 2, Launcher: c, Engine: "recorder"})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Destroy(context.Background())
	ctx := context.Background()
	works := make([][]*comm.Work, callers)
	var wg sync.WaitGroup
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range per {
				works[g] = append(works[g], pg.AllReduce(ctx, comm.NewHostBuffer(comm.Int32, 1), comm.Sum))
			}
		}()
	}
	wg.Wait()
	seqs := map[uint64]bool{}
	for _, ws := range works {
		for _, w := range ws {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := w.Wait(wctx)
			cancel()
			var ee *comm.EngineError
			switch {
			case w.Seq() == bad && !errors.As(err, &ee):
				t.Fatalf("the panicking op (seq %d): %v, want an *EngineError", bad, err)
			case w.Seq() != bad && err != nil:
				t.Fatalf("op seq %d: %v", w.Seq(), err)
			}
			if seqs[w.Seq()] {
				t.Fatalf("seq %d given twice", w.Seq())
			}
			seqs[w.Seq()] = true
		}
	}
	waitFor(t, "the parent's strategy", func() bool { return len(strat.seen()) == 1 })
	if p, ok := strat.seen()[0].(*actors.Panic); !ok || p.FP.Seq != bad {
		t.Fatalf("parent saw %#v, want the *Panic of seq %d", strat.seen()[0], bad)
	}
	rec := c.Backend().(*testrank.Recorder)
	for i, op := range rec.Ops() {
		if op.FP.Seq != uint64(i+1) {
			t.Fatalf("launch %d has seq %d: launch order broken", i+1, op.FP.Seq)
		}
	}
	if n := len(rec.Ops()); n != callers*per {
		t.Fatalf("%d launches, want %d", n, callers*per)
	}
}
