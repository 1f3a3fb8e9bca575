package ranktree

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// TestRuntimeLocalGroupsAndMonitoredBarrier: through a Runtime (its store
// handed to every group), a local-synchronization NewGroup is created by
// its members only while the other rank does nothing, its name is known to
// Runtime.Group, NewSubgroupsByEnumeration on the world connects each
// caller's subgroup, and MonitoredBarrier passes and then fails on every
// rank alike, naming the late one.
func TestRuntimeLocalGroupsAndMonitoredBarrier(t *testing.T) {
	clearSupervisionEnv(t)
	const n = 3
	rts := startRanks(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	eachRank(t, rts, func(rt *Runtime) error {
		if rt.Rank() == 1 {
			return nil // not a member: need not call
		}
		g, err := rt.NewGroup(ctx, []int{2, 0}, comm.WithLocalSynchronization())
		if err != nil {
			return err
		}
		if g.Name() != "default_pg.local-0_2" || rt.Group(g.Name()) != g {
			t.Errorf("rank %d: local group %v, Runtime.Group(%q) = %v", rt.Rank(), g, g.Name(), rt.Group(g.Name()))
		}
		x := []int32{int32(rt.Rank())}
		if err := g.AllReduce(ctx, comm.HostBuffer(x), comm.Sum).Wait(ctx); err != nil {
			return err
		}
		if x[0] != 2 {
			t.Errorf("rank %d: allreduce on the local group: %d, want 2", rt.Rank(), x[0])
		}
		return nil
	})
	eachRank(t, rts, func(rt *Runtime) error {
		cur, all, err := rt.World().NewSubgroupsByEnumeration(ctx, [][]int{{1, 0}, {2}})
		if err != nil {
			return err
		}
		want := []int{0, 1}
		if rt.Rank() == 2 {
			want = []int{2}
		}
		if len(all) != 2 || !slices.Equal(cur.Ranks(), want) {
			t.Errorf("rank %d: subgroup %v of %d, want ranks %v", rt.Rank(), cur.Ranks(), len(all), want)
		}
		if err := cur.Barrier(ctx).Wait(ctx); err != nil {
			return err
		}
		if err := rt.World().MonitoredBarrier(ctx, 20*time.Second, true); err != nil {
			return err
		}
		if err := rt.World().Barrier(ctx).Wait(ctx); err != nil {
			return err
		}
		if rt.Rank() == 2 {
			time.Sleep(1200 * time.Millisecond)
		}
		err = rt.World().MonitoredBarrier(ctx, 500*time.Millisecond, false)
		var mb *comm.MonitoredBarrierError
		if !errors.As(err, &mb) || !slices.Equal(mb.Missing, []int{2}) || mb.DecidedBy != 0 {
			t.Errorf("rank %d: rank 2 late: %v, want rank 0's verdict naming rank 2", rt.Rank(), err)
		}
		return nil
	})
}
