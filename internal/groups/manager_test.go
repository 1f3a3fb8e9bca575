package groups

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu"
	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/supervisor"
)

// startManagers starts n Managers (one per in-process rank) over one
// MemStore and the in-memory transport, and closes them at cleanup.
func startManagers(t *testing.T, n int) []*Manager {
	t.Helper()
	st, hub := store.NewMemStore(), cpu.NewInmemHub()
	sup, err := supervisor.Config{ErrorHandling: supervisor.CleanupOnly}.Validate()
	if err != nil {
		t.Fatal(err)
	}
	ms := make([]*Manager, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			ms[r], errs[r] = Start(context.Background(), Config{
				Job: "groups-test", Rank: r, WorldSize: n, Store: st, Timeout: 10 * time.Second,
				Factory: cpu.Factory(cpu.Options{Transport: cpu.TransportInmem, Hub: hub}), Device: -1,
				Supervision: sup, Exit: func(code int) { t.Errorf("rank %d: exit %d", r, code) }, Log: zerolog.Nop(),
			})
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: Start: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, m := range ms {
			if err := m.Close(context.Background()); err != nil {
				t.Errorf("Close: %v", err)
			}
		}
	})
	return ms
}

// TestOwnerLoopAnswersWhileRestartWaits: rank 0 restarts the world group
// alone, so its restart waits in the store barrier for rank 1; meanwhile
// the owner loop still answers Group and World at once (the barrier runs
// off the loop). Once rank 1 restarts too, both are on the next epoch,
// Group and Restarted return the new handle, the old one fails with
// ErrAborted and an all-reduce on the new group is right.
func TestOwnerLoopAnswersWhileRestartWaits(t *testing.T) {
	ms := startManagers(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old := []*comm.ProcessGroup{ms[0].World(), ms[1].World()}
	type result struct {
		pg  *comm.ProcessGroup
		err error
	}
	res0 := make(chan result, 1)
	go func() {
		pg, err := ms[0].Restart(ctx, old[0])
		res0 <- result{pg, err}
	}()
	time.Sleep(200 * time.Millisecond) // rank 0 is in the barrier now
	start := time.Now()
	for range 100 {
		_ = ms[0].Group(WorldGroupName)
		if ms[0].World() == nil {
			t.Fatal("World is nil during a restart")
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("100 Group calls took %v while a restart waited in the barrier", d)
	}
	select {
	case r := <-res0:
		t.Fatalf("rank 0's restart returned before rank 1 arrived: %v, %v", r.pg, r.err)
	default:
	}
	pg1, err := ms[1].Restart(ctx, old[1])
	if err != nil {
		t.Fatalf("rank 1: Restart: %v", err)
	}
	r0 := <-res0
	if r0.err != nil {
		t.Fatalf("rank 0: Restart: %v", r0.err)
	}
	for r, pg := range []*comm.ProcessGroup{r0.pg, pg1} {
		if pg.Epoch() != old[r].Epoch()+1 || ms[r].World() != pg || ms[r].Group(WorldGroupName) != pg {
			t.Errorf("rank %d: new epoch %d (old %d), World %v, Group %v", r, pg.Epoch(), old[r].Epoch(), ms[r].World(), ms[r].Group(WorldGroupName))
		}
		if got, err := ms[r].Restarted(ctx, old[r]); got != pg || err != nil {
			t.Errorf("rank %d: Restarted(old) = %v, %v", r, got, err)
		}
		if err := old[r].Barrier(ctx).Wait(ctx); !errors.Is(err, comm.ErrAborted) {
			t.Errorf("rank %d: op on the old handle: %v, want ErrAborted", r, err)
		}
	}
	var wg sync.WaitGroup
	for r, pg := range []*comm.ProcessGroup{r0.pg, pg1} {
		wg.Go(func() {
			x := []int32{int32(r + 1)}
			if err := pg.AllReduce(ctx, comm.HostBuffer(x), comm.Sum).Wait(ctx); err != nil || x[0] != 3 {
				t.Errorf("rank %d: all-reduce on the new group: %v, %d, want 3", r, err, x[0])
			}
		})
	}
	wg.Wait()
}

// TestClosedManagerRefuses: after Close, creating and restarting groups
// fail with ErrClosed, Group answers nil and Restarted does not wait.
func TestClosedManagerRefuses(t *testing.T) {
	ms := startManagers(t, 1)
	m := ms[0]
	world := m.World()
	if err := m.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := m.CreateGroup(ctx, comm.GroupSpec{Name: "g", GlobalRanks: []int{0}}); !errors.Is(err, comm.ErrClosed) {
		t.Errorf("CreateGroup after Close: %v, want ErrClosed", err)
	}
	if _, err := m.Restart(ctx, world); !errors.Is(err, comm.ErrClosed) {
		t.Errorf("Restart after Close: %v, want ErrClosed", err)
	}
	if _, err := m.Restarted(ctx, world); !errors.Is(err, comm.ErrClosed) {
		t.Errorf("Restarted after Close: %v, want ErrClosed", err)
	}
	if g := m.Group(WorldGroupName); g != nil {
		t.Errorf("Group after Close: %v, want nil", g)
	}
}

// TestNextIncarnationPinsTheStore: a store named by its address is kept
// referenced, so a fresh store allocated after the first was collected
// never shares its address and inherits its count (a flake of
// TestInitFailsWhenARankDies: the second test's Init waited on "init.1").
func TestNextIncarnationPinsTheStore(t *testing.T) {
	for i := range 2000 {
		st := new([64]byte) // a store-sized object; each is a different store
		if k := NextIncarnation(fmt.Sprintf("%p|pin-test", st), st); k != 0 {
			t.Fatalf("store %d of 2000: incarnation %d, want 0 (its address was a collected store's)", i, k)
		}
		runtime.GC()
	}
}
