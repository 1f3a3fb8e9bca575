package supervisor

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// flaky is a child that panics on "boom" and counts everything else.
type flaky struct{ handled *atomic.Int32 }

func (f *flaky) Receive(ctx actor.Context) {
	switch ctx.Message() {
	case "boom":
		panic("injected panic")
	case "work":
		f.handled.Add(1)
	}
}

func flakyProps(n *atomic.Int32) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return &flaky{handled: n} })
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

func TestRootRestartContainsPanic(t *testing.T) {
	sys := newSystem()
	rec := &recorder{}
	root := StartRoot(sys, RootConfig{Policy: func(*actor.PID, any) Decision { return Restart }, MaxRestarts: 2,
		Within: time.Minute, Exit: rec.Exit, Dumper: rec, Events: rec})
	defer root.Stop(5 * time.Second)
	var n atomic.Int32
	pid := root.Spawn(flakyProps(&n))
	if pid == nil {
		t.Fatal("spawn failed")
	}
	sys.Root.Send(pid, "boom")
	sys.Root.Send(pid, "work")
	sys.Root.Send(pid, "boom")
	sys.Root.Send(pid, "work")
	eventually(t, "two handled messages after two restarts", func() bool { return n.Load() == 2 })
	if rec.exited.Load() != 0 {
		t.Fatal("restart escalated early")
	}
	// The third panic within the window exceeds MaxRestarts: escalate.
	sys.Root.Send(pid, "boom")
	eventually(t, "escalation", func() bool { return rec.exited.Load() != 0 })
	log, evs := rec.snapshot()
	if rec.exited.Load() != ExitEscalate || len(log) != 2 || !strings.Contains(log[0], "injected panic") {
		t.Errorf("exit %d log %v", rec.exited.Load(), log)
	}
	if len(evs) != 3 || evs[0].Action != "restart" || evs[2].Action != "escalate" {
		t.Errorf("events %+v", evs)
	}
}

func TestRootStopChildCallsOnStopped(t *testing.T) {
	sys := newSystem()
	rec := &recorder{}
	stopped := make(chan any, 1)
	root := StartRoot(sys, RootConfig{Policy: func(*actor.PID, any) Decision { return StopChild }, Exit: rec.Exit,
		OnStopped: func(_ *actor.PID, reason any) { stopped <- reason }})
	defer root.Stop(5 * time.Second)
	var n atomic.Int32
	pid := root.Spawn(flakyProps(&n))
	sys.Root.Send(pid, "boom")
	select {
	case r := <-stopped:
		if r != "injected panic" {
			t.Errorf("OnStopped reason %v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("OnStopped not called")
	}
	if rec.exited.Load() != 0 {
		t.Error("StopChild exited the process")
	}
}

func TestRootDefaultEscalates(t *testing.T) {
	sys := newSystem()
	rec := &recorder{}
	root := StartRoot(sys, RootConfig{Exit: rec.Exit})
	defer root.Stop(5 * time.Second)
	var n atomic.Int32
	sys.Root.Send(root.Spawn(flakyProps(&n)), "boom")
	eventually(t, "escalation", func() bool { return rec.exited.Load() == ExitEscalate })
}

// TestRootSupervisesRankActors spawns the rank's own actors under the root.
func TestRootSupervisesRankActors(t *testing.T) {
	sys := newSystem()
	rec := &recorder{}
	root := StartRoot(sys, RootConfig{Exit: rec.Exit})
	wd, err := NewWatchdog(WatchdogConfig{Exit: rec.Exit, Cfg: Config{WatchdogInterval: 5 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if wd.Start(sys, root) == nil {
		t.Fatal("watchdog not spawned")
	}
	m, _ := NewHeartbeatMonitor(HeartbeatConfig{Beat: wd.Heartbeat(), Timeout: time.Minute, Exit: rec.Exit})
	m.Start(sys, root)
	eventually(t, "watchdog heartbeats", func() bool { return wd.Heartbeat().Load() > 3 })
	if err := root.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	m.Stop()
	beats := wd.Heartbeat().Load()
	time.Sleep(50 * time.Millisecond)
	if wd.Heartbeat().Load() > beats+1 {
		t.Error("watchdog still ticking after the root stopped")
	}
}
