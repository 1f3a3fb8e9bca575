package comm_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu"
	"github.com/ranktree/ranktree/internal/testrank"
	"github.com/ranktree/ranktree/store"
)

// mbTimeout is the MonitoredBarrier timeout of the failure cases: long
// enough that ranks aligned by a Barrier all arrive within it on a loaded
// machine; late ranks sleep mbTimeout+mbLate, past every verdict.
const (
	mbTimeout = time.Second
	mbLate    = 700 * time.Millisecond
)

// wantMB checks that err is a *MonitoredBarrierError naming exactly
// missing, decided by a rank in deciders.
func wantMB(err error, missing []int, deciders ...int) error {
	var e *comm.MonitoredBarrierError
	if !errors.As(err, &e) || !errors.Is(err, comm.ErrTimeout) {
		return fmt.Errorf("MonitoredBarrier returned %v, want a *MonitoredBarrierError naming ranks %v", err, missing)
	}
	if !slices.Equal(e.Missing, missing) || !slices.Contains(deciders, e.DecidedBy) || e.Timeout != mbTimeout {
		return fmt.Errorf("verdict %q: missing %v decided by %d timeout %v, want missing %v decided by one of %v timeout %v",
			e, e.Missing, e.DecidedBy, e.Timeout, missing, deciders, mbTimeout)
	}
	if !strings.Contains(e.Error(), "failed to pass monitoredBarrier in 1s") {
		return fmt.Errorf("verdict %q is not in torch's words", e)
	}
	return nil
}

// checkMonitoredBarrier: every member passes when all arrive; when some
// arrive late, every member (the late ones too, on arrival) fails with the
// same verdict naming the lowest late rank, or all of them with
// waitAllRanks; when rank 0 is late another member decides and names it.
// The communicator is untouched by a failed verdict.
func checkMonitoredBarrier(ctx context.Context, pg *comm.ProcessGroup) error {
	n, r := pg.Size(), pg.Rank()
	for _, all := range []bool{false, true, false} {
		if err := pg.MonitoredBarrier(ctx, 30*time.Second, all); err != nil {
			return fmt.Errorf("all arriving (wait_all_ranks=%v): %w", all, err)
		}
	}
	if n == 1 {
		return nil
	}
	// Ranks 1 and n-1 are late (one rank with n == 2).
	late := []int{1, n - 1}
	if n == 2 {
		late = late[:1]
	}
	for _, all := range []bool{false, true} {
		if err := pg.Barrier(ctx).Wait(ctx); err != nil {
			return err
		}
		if slices.Contains(late, r) {
			time.Sleep(mbTimeout + mbLate)
		}
		want := late[:1]
		if all {
			want = late
		}
		if err := wantMB(pg.MonitoredBarrier(ctx, mbTimeout, all), want, 0); err != nil {
			return fmt.Errorf("ranks %v late (wait_all_ranks=%v): %w", late, all, err)
		}
	}
	// Rank 0 late: a member whose timeout ends first decides, naming it.
	if err := pg.Barrier(ctx).Wait(ctx); err != nil {
		return err
	}
	if r == 0 {
		time.Sleep(mbTimeout + mbLate)
	}
	deciders := make([]int, 0, n-1)
	for i := 1; i < n; i++ {
		deciders = append(deciders, i)
	}
	if err := wantMB(pg.MonitoredBarrier(ctx, mbTimeout, true), []int{0}, deciders...); err != nil {
		return fmt.Errorf("rank 0 late: %w", err)
	}
	// The group still works, and the next monitored barrier passes.
	if err := pg.AllReduce(ctx, comm.HostBuffer([]int32{1}), comm.Sum).Wait(ctx); err != nil {
		return fmt.Errorf("allreduce after a failed monitored barrier: %w", err)
	}
	return pg.MonitoredBarrier(ctx, 30*time.Second, true)
}

// recordedWorld builds n ranks' world groups over Recorder engines named
// engine, sharing st.
func recordedWorld(t *testing.T, n int, engine string, st store.Store) []*comm.ProcessGroup {
	t.Helper()
	pgs := make([]*comm.ProcessGroup, n)
	for r := range n {
		f := testrank.RecorderFactory(testrank.QuietSystem(), nil)
		f.Engine, f.Store = engine, st
		pg, err := f.World(context.Background(), r, n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pg.Destroy(context.Background()) })
		pgs[r] = pg
	}
	return pgs
}

// TestMonitoredBarrierStoreOnly: MonitoredBarrier runs over the store, so
// it works on a device (NCCL) group too, launches nothing on the engine,
// and a rank that never arrives is named by every member that did
// (waitAllRanks), identically. Without a store it is ErrUnsupported; after
// Destroy ErrClosed; a non-member and a group of one pass at once.
func TestMonitoredBarrierStoreOnly(t *testing.T) {
	st := store.NewMemStore(store.WithMemTimeout(10 * time.Second))
	pgs := recordedWorld(t, 4, "nccl", st)
	ctx := context.Background()
	if err := testrank.Ranks(4, 20*time.Second, func(r int) error {
		return pgs[r].MonitoredBarrier(ctx, 10*time.Second, true)
	}); err != nil {
		t.Fatal(err)
	}
	// Ranks 1 and 3 never come.
	errs := make([]error, 4)
	if err := testrank.Ranks(4, 20*time.Second, func(r int) error {
		if r == 1 || r == 3 {
			return nil
		}
		errs[r] = pgs[r].MonitoredBarrier(ctx, 300*time.Millisecond, true)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []int{0, 2} {
		var e *comm.MonitoredBarrierError
		if !errors.As(errs[r], &e) || !slices.Equal(e.Missing, []int{1, 3}) || e.DecidedBy != 0 || e.Rank != r {
			t.Fatalf("rank %d: %v, want a verdict of rank 0 naming ranks 1 and 3", r, errs[r])
		}
		if !strings.Contains(e.Error(), "Ranks 1, 3 failed to pass monitoredBarrier in 300ms") {
			t.Errorf("rank %d: %q", r, e)
		}
	}
	// A subgroup names global ranks beside group ranks.
	e := &comm.MonitoredBarrierError{Group: "g", Missing: []int{1}, Members: []int{2, 5}, Timeout: time.Second}
	if !strings.Contains(e.Error(), "Rank 1 (global rank 5) failed") {
		t.Errorf("subgroup verdict %q does not name the global rank", e)
	}

	noStore, _, _ := newRecorded(t, 0, 2)
	if err := noStore.MonitoredBarrier(ctx, time.Second, false); !errors.Is(err, comm.ErrUnsupported) {
		t.Errorf("no store: %v, want ErrUnsupported", err)
	}
	one := recordedWorld(t, 1, "cpu", st)[0]
	if err := one.MonitoredBarrier(ctx, time.Millisecond, true); err != nil {
		t.Errorf("group of one: %v", err)
	}
	sub, err := pgs[0].NewGroup(ctx, []int{1, 2}) // rank 0 is not a member (no exchange on a device parent)
	if err != nil || sub.IsMember() {
		t.Fatalf("non-member view: %v, %v", sub, err)
	}
	if err := sub.MonitoredBarrier(ctx, time.Millisecond, true); err != nil {
		t.Errorf("non-member: %v", err)
	}
	pgs[2].Destroy(ctx)
	if err := pgs[2].MonitoredBarrier(ctx, time.Second, true); !errors.Is(err, comm.ErrClosed) {
		t.Errorf("after Destroy: %v, want ErrClosed", err)
	}
}

// TestMonitoredBarrierMultiProcess: ranks as processes (FileStore, the CPU
// engine over TCP); rank 2 leaves without entering the barrier, as a
// stuck or dead rank would. Ranks 0 and 1 both fail with the verdict of
// rank 0 naming rank 2, and neither returns nil.
func TestMonitoredBarrierMultiProcess(t *testing.T) {
	if p, ok := testrank.Current(t); ok {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		pg, err := p.World(ctx, "cpu", cpu.Factory(cpu.Options{Transport: cpu.TransportTCP}), zerolog.New(io.Discard))
		if err != nil {
			t.Fatal(err)
		}
		defer pg.Destroy(ctx)
		if err := pg.MonitoredBarrier(ctx, 30*time.Second, true); err != nil {
			t.Fatalf("rank %d: all arriving: %v", p.Rank, err)
		}
		if p.Rank == 2 {
			return
		}
		err = pg.MonitoredBarrier(ctx, mbTimeout, false)
		if err := wantMB(err, []int{2}, 0); err != nil {
			t.Fatalf("rank %d: %v", p.Rank, err)
		}
		t.Logf("rank %d: %v", p.Rank, err)
		return
	}
	if testing.Short() {
		t.Skip("multi-process test skipped with -short")
	}
	testrank.Spawn(t, 3, 2*time.Minute)
}
