package e2e

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu"
	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/supervisor"
)

// TestHangEndToEndInProcess wires the real pieces of three ranks in one
// process: CPU engines over the in-memory transport with
// RANKTREE_FAULT=hang@rank=1,seq=3, communicator actors observed by the
// flight recorder and the watchdog, process groups, one store. Seqs 1-2
// all-reduce correctly; at seq 3 every rank gets a typed error within the
// bound, every rank dumps to the store, and the merged dumps point at seq 3.
func TestHangEndToEndInProcess(t *testing.T) {
	const world = 3
	const timeout = time.Second
	faults, err := comm.ParseFaults("hang@rank=1,seq=3")
	if err != nil {
		t.Fatal(err)
	}
	st := store.NewMemStore()
	defer st.Close()
	hub := cpu.NewInmemHub()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	engines := make([]comm.Backend, world)
	var wg sync.WaitGroup
	errs := make([]error, world)
	for r := 0; r < world; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			engines[r], errs[r] = cpu.New(ctx, comm.BackendConfig{Group: "default_pg", Rank: r, Size: world,
				GlobalRanks: []int{0, 1, 2}, Store: st, Device: -1, Timeout: 20 * time.Second, Faults: faults,
				Log: zerolog.Nop()}, cpu.Options{Transport: "inmem", Hub: hub})
		}(r)
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d engine: %v", r, err)
		}
	}

	pgs := make([]*comm.ProcessGroup, world)
	exits := make([]*exitRecorder, world)
	wds := make([]*supervisor.Watchdog, world)
	systems := make([]*actor.ActorSystem, world)
	for r := 0; r < world; r++ {
		sys := newSystem()
		systems[r] = sys
		rec := supervisor.NewFlightRecorder(supervisor.RecorderConfig{Job: "e2e", Rank: r, WorldSize: world})
		rec.AddGroup("default_pg", 0, r, []int{0, 1, 2})
		exits[r] = &exitRecorder{}
		wd, err := supervisor.NewWatchdog(supervisor.WatchdogConfig{Rank: r, Store: st, Dumper: supervisor.Dumper{Rec: rec, Store: st}, Exit: exits[r].Exit,
			Cfg:              supervisor.Config{ErrorHandling: supervisor.CleanupOnly, Timeout: timeout, WatchdogInterval: 10 * time.Millisecond},
			ProgressInterval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		wd.Start(sys, nil)
		defer wd.Stop(5 * time.Second)
		wds[r] = wd
		wd.Register(supervisor.GroupSpec{Name: "default_pg", Engine: "cpu", Members: []int{0, 1, 2}}, engines[r], engines[r])
		c, err := actors.NewCommunicator(sys, engines[r], actors.CommunicatorConfig{Group: "default_pg", Log: zerolog.Nop(),
			Observer: actors.Observers{rec.Observer("default_pg", func() time.Duration { return timeout }), wd.Observer("default_pg")}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		pgs[r], err = comm.NewProcessGroup(comm.GroupConfig{Name: "default_pg", Rank: r, Size: world, Launcher: c,
			Engine: "cpu", Timeout: timeout, Log: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
	}

	results := make([][]error, world)
	took := make([]time.Duration, world)
	for r := 0; r < world; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			for seq := 1; seq <= 3; seq++ {
				buf := []float32{float32(r + 1), float32(10 * (r + 1))}
				start := time.Now()
				err := pgs[r].AllReduce(ctx, comm.HostBuffer(buf), comm.Sum).Wait(ctx)
				took[r] = time.Since(start)
				results[r] = append(results[r], err)
				if err == nil && (buf[0] != 6 || buf[1] != 60) {
					t.Errorf("rank %d seq %d: %v, want [6 60]", r, seq, buf)
				}
			}
		}(r)
	}
	wg.Wait()
	for r := 0; r < world; r++ {
		if results[r][0] != nil || results[r][1] != nil {
			t.Fatalf("rank %d: seqs 1-2 failed: %v", r, results[r])
		}
		err := results[r][2]
		if err == nil {
			t.Fatalf("rank %d: seq 3 succeeded despite the hang", r)
		}
		if !errors.Is(err, comm.ErrTimeout) && !errors.Is(err, comm.ErrRemoteAbort) && !errors.Is(err, comm.ErrAborted) && !errors.Is(err, comm.ErrTransport) {
			t.Errorf("rank %d: seq 3 error %v is not a timeout, abort or transport error", r, err)
		}
		if took[r] > timeout+4*time.Second {
			t.Errorf("rank %d: error after %v, bound %v", r, took[r], timeout+4*time.Second)
		}
		t.Logf("rank %d after %v: %v", r, took[r].Round(time.Millisecond), err)
		if exits[r].code.Load() != 0 {
			t.Errorf("rank %d exited in CleanupOnly mode", r)
		}
	}
	// Every rank dumped (the timed-out rank and those that saw its abort).
	var dumps []supervisor.Dump
	eventually(t, "all dumps in the store", func() bool {
		dumps, err = supervisor.ReadDumps(ctx, st, world)
		return err == nil && len(dumps) == world
	})
	rep := supervisor.MergeDumps(dumps)
	t.Logf("merged report:\n%s", rep)
	g := rep.Groups[0]
	if g.StuckSeq != 3 || !slices.Contains(rep.Stuck, 1) {
		t.Errorf("merged report stuck at %d on %v, want seq 3 including rank 1", g.StuckSeq, rep.Stuck)
	}
	// When the engine injects the hang before marking the op started, rank 1
	// is the only rank that never started seq 3: then the report and the
	// timeout message must single it out.
	if g.Progress[1].AtStuckSeq != "" && g.Progress[1].LastStarted < 3 {
		if !slices.Equal(rep.Stuck, []int{1}) {
			t.Errorf("rank 1 never started seq 3, but the report blames %v", rep.Stuck)
		}
		for r := 0; r < world; r++ {
			err := results[r][2]
			if !errors.Is(err, comm.ErrTimeout) && !errors.Is(err, comm.ErrRemoteAbort) {
				continue // a transport error raced the abort
			}
			if msg := err.Error(); !strings.Contains(msg, "[1] have not reached seq 3") {
				t.Errorf("rank %d: %q does not name rank 1", r, msg)
			}
		}
	}

	// Communicator restart without restarting processes: every rank agrees
	// on epoch 1 through the store, connects a new engine, and all-reduces.
	newEngines := make([]comm.Backend, world)
	for r := 0; r < world; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			var epoch uint32
			epoch, errs[r] = supervisor.RestartEpoch(ctx, st, "default_pg", 0, r, world, 20*time.Second)
			if errs[r] != nil {
				return
			}
			newEngines[r], errs[r] = cpu.New(ctx, comm.BackendConfig{Group: "default_pg", Epoch: epoch, Rank: r, Size: world,
				GlobalRanks: []int{0, 1, 2}, Store: st, Device: -1, Timeout: 20 * time.Second, Log: zerolog.Nop()},
				cpu.Options{Transport: "inmem", Hub: hub})
		}(r)
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d restart: %v", r, err)
		}
	}
	for r := 0; r < world; r++ {
		wds[r].Register(supervisor.GroupSpec{Name: "default_pg", Epoch: 1, Engine: "cpu", Members: []int{0, 1, 2}}, newEngines[r], newEngines[r])
		c, err := actors.NewCommunicator(systems[r], newEngines[r], actors.CommunicatorConfig{Group: "default_pg", Epoch: 1,
			Log: zerolog.Nop(), Observer: wds[r].Observer("default_pg")})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		pgs[r], err = comm.NewProcessGroup(comm.GroupConfig{Name: "default_pg", Epoch: 1, Rank: r, Size: world, Launcher: c,
			Engine: "cpu", Timeout: timeout, Log: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
	}
	for r := 0; r < world; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			buf := []float32{float32(r + 1)}
			if err := pgs[r].AllReduce(ctx, comm.HostBuffer(buf), comm.Sum).Wait(ctx); err != nil || buf[0] != 6 {
				t.Errorf("rank %d after restart: %v, %v; want [6]", r, buf, err)
			}
		}(r)
	}
	wg.Wait()
}
