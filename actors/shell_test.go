package actors

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// counter counts int messages; a negative one panics, and one equal to
// block blocks until release closes.
type counter struct {
	n       atomic.Int64
	block   chan struct{}
	release chan struct{}
}

func (c *counter) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case int:
		if m < 0 {
			panic("negative")
		}
		if m == 99 {
			close(c.block)
			<-c.release
		}
		c.n.Add(1)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// TestPersistentPropsSurviveRestart: a panic restarts the actor (default
// strategy) and the count carried in its state goes on.
func TestPersistentPropsSurviveRestart(t *testing.T) {
	sys := actor.NewActorSystem()
	defer sys.Shutdown()
	c := &counter{}
	pid := SpawnUnder(sys, nil, PersistentProps(c), "ctr-")
	if !strings.Contains(pid.Id, "ctr-") {
		t.Fatalf("pid %q does not carry the prefix", pid.Id)
	}
	sys.Root.Send(pid, 1)
	sys.Root.Send(pid, -1)
	sys.Root.Send(pid, 2)
	waitFor(t, "two counted messages", func() bool { return c.n.Load() == 2 })
	if !StopWithin(sys, pid, StopNow, 2*time.Second) {
		t.Fatal("idle actor did not stop")
	}
}

// TestSpawnUnderParent: a parent without SpawnPrefix still spawns.
func TestSpawnUnderParent(t *testing.T) {
	sys := actor.NewActorSystem()
	defer sys.Shutdown()
	var plain Spawner = spawnOnly{sys.Root}
	pid := SpawnUnder(sys, plain, PersistentProps(&counter{}), "ignored-")
	if pid == nil || strings.Contains(pid.Id, "ignored-") {
		t.Fatalf("pid = %v", pid)
	}
}

type spawnOnly struct{ r *actor.RootContext }

func (s spawnOnly) Spawn(p *actor.Props) *actor.PID { return s.r.Spawn(p) }

// TestStopWithin: StopDrain handles the queued messages first; a stop
// that cannot finish in time reports false within the bound.
func TestStopWithin(t *testing.T) {
	sys := actor.NewActorSystem()
	defer sys.Shutdown()
	c := &counter{}
	pid := SpawnUnder(sys, nil, PersistentProps(c), "")
	for i := range 50 {
		sys.Root.Send(pid, i)
	}
	if !StopWithin(sys, pid, StopDrain, 5*time.Second) || c.n.Load() != 50 {
		t.Fatalf("drained %d of 50 messages", c.n.Load())
	}

	b := &counter{block: make(chan struct{}), release: make(chan struct{})}
	pid = SpawnUnder(sys, nil, PersistentProps(b), "")
	sys.Root.Send(pid, 99)
	<-b.block
	start := time.Now()
	if StopWithin(sys, pid, StopNow, 50*time.Millisecond) {
		t.Fatal("a blocked actor reported stopped")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("StopWithin took %v past its bound", d)
	}
	close(b.release)
	if !StopWithin(sys, nil, StopNow, time.Millisecond) {
		t.Fatal("nil pid not treated as stopped")
	}
}
