package comm_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu"
	"github.com/ranktree/ranktree/internal/testrank"
)

// sumOn all-reduces the caller's global rank over g and checks the sum
// and g's members against want (global ranks, sorted).
func sumOn(ctx context.Context, g *comm.ProcessGroup, me int, want []int) error {
	if !slices.Equal(g.Ranks(), want) || g.Size() != len(want) || g.Rank() != slices.Index(want, me) {
		return fmt.Errorf("group %v has ranks %v, want %v with this rank (%d) at %d", g, g.Ranks(), want, me, slices.Index(want, me))
	}
	s := []int64{int64(me)}
	if err := g.AllReduce(ctx, comm.HostBuffer(s), comm.Sum).Wait(ctx); err != nil {
		return fmt.Errorf("allreduce on %v: %w", g, err)
	}
	var w int64
	for _, r := range want {
		w += int64(r)
	}
	if s[0] != w {
		return fmt.Errorf("allreduce on %v: %d, want %d", g, s[0], w)
	}
	return nil
}

// sameOnEveryRank checks that err's text is the same on every member of pg.
func sameOnEveryRank(ctx context.Context, pg *comm.ProcessGroup, err error) error {
	all, xerr := pg.AllGatherBytes(ctx, []byte(fmt.Sprint(err)))
	if xerr != nil {
		return xerr
	}
	for r, b := range all {
		if string(b) != fmt.Sprint(err) {
			return fmt.Errorf("rank %d got %q, this rank %q", r, b, err)
		}
	}
	return nil
}

// checkLocalGroups: NewGroup with local synchronization is called by the
// members only — the parity groups by their members, the same ranks a
// second time (a new name), pairs created concurrently by their two
// members — and a non-member caller gets its Rank -1 view at once.
func checkLocalGroups(ctx context.Context, pg *comm.ProcessGroup) error {
	n, me := pg.Size(), pg.Ranks()[pg.Rank()]
	// Subgroups are destroyed after the closing barrier on pg: a member
	// that destroys a group while a peer still finishes an op on it fails
	// that op (docs/semantics.md).
	var made []*comm.ProcessGroup
	var mu sync.Mutex
	keep := func(g *comm.ProcessGroup) {
		mu.Lock()
		made = append(made, g)
		mu.Unlock()
	}
	defer func() {
		for _, g := range made {
			g.Destroy(ctx)
		}
	}()
	var mine []int
	for g := range n {
		if g%2 == me%2 {
			mine = append(mine, g)
		}
	}
	tag := func(rs []int) string {
		s := make([]string, len(rs))
		for i, r := range rs {
			s[i] = fmt.Sprint(r)
		}
		return strings.Join(s, "_")
	}
	rev := slices.Clone(mine)
	slices.Reverse(rev) // any order
	for k := 1; k <= 2; k++ {
		lg, err := pg.NewGroup(ctx, rev, comm.WithLocalSynchronization())
		if err != nil {
			return fmt.Errorf("parity group %v (call %d): %w", mine, k, err)
		}
		keep(lg)
		want := "default_pg.local-" + tag(mine)
		if k == 2 {
			want += ".2"
		}
		if lg.Name() != want {
			return fmt.Errorf("parity group name %q, want %q", lg.Name(), want)
		}
		if err := sumOn(ctx, lg, me, mine); err != nil {
			return err
		}
	}
	if n >= 3 {
		// Each rank creates its two neighbour pairs at once; each pair's
		// two members create it, nobody else.
		pairs := [][]int{{me, (me + 1) % n}, {(me + n - 1) % n, me}}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, p := range pairs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				g, err := pg.NewGroup(ctx, p, comm.WithLocalSynchronization())
				if err != nil {
					errs[i] = fmt.Errorf("pair %v: %w", p, err)
					return
				}
				keep(g)
				sorted := slices.Sorted(slices.Values(p))
				errs[i] = sumOn(ctx, g, me, sorted)
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
	}
	if n >= 2 {
		other := (me + 1) % n
		start := time.Now()
		v, err := pg.NewGroup(ctx, []int{other}, comm.WithLocalSynchronization())
		if err != nil || v.Rank() != -1 || v.Size() != -1 || time.Since(start) > time.Second {
			return fmt.Errorf("non-member caller: %v, %v after %v; want a Rank -1 view at once", v, err, time.Since(start))
		}
	}
	// Bad ranks fail the caller alone, with no store traffic.
	if _, err := pg.NewGroup(ctx, []int{me, n}, comm.WithLocalSynchronization()); !errors.Is(err, comm.ErrInvalidArgument) || !strings.Contains(err.Error(), fmt.Sprintf("global rank %d is not a member", n)) {
		return fmt.Errorf("local NewGroup with rank %d: %v, want ErrInvalidArgument naming it", n, err)
	}
	return pg.Barrier(ctx).Wait(ctx)
}

// checkNewSubgroups: NewSubgroups and NewSubgroupsByEnumeration return the
// caller's subgroup (working) and all of them (others as Rank -1 views);
// bad input fails every rank with the same ErrInvalidArgument; ranks that
// disagree all fail with a *NewGroupMismatchError. The parent stays usable.
func checkNewSubgroups(ctx context.Context, pg *comm.ProcessGroup) error {
	n, me := pg.Size(), pg.Ranks()[pg.Rank()]
	var made []*comm.ProcessGroup // destroyed after the closing barrier, as in checkLocalGroups
	defer func() {
		for _, g := range made {
			g.Destroy(ctx)
		}
	}()
	for gs := 1; gs <= n; gs++ {
		if n%gs != 0 {
			continue
		}
		cur, all, err := pg.NewSubgroups(ctx, gs)
		if err != nil {
			return fmt.Errorf("NewSubgroups(%d): %w", gs, err)
		}
		if len(all) != n/gs || all[me/gs] != cur {
			return fmt.Errorf("NewSubgroups(%d): %d subgroups, current %v", gs, len(all), cur)
		}
		for i, g := range all {
			want := make([]int, gs)
			for j := range want {
				want[j] = i*gs + j
			}
			if i == me/gs {
				if err := sumOn(ctx, g, me, want); err != nil {
					return fmt.Errorf("NewSubgroups(%d): %w", gs, err)
				}
			} else if g.IsMember() || !slices.Equal(g.Ranks(), want) {
				return fmt.Errorf("NewSubgroups(%d): subgroup %d is %v with ranks %v, want a Rank -1 view of %v", gs, i, g, g.Ranks(), want)
			}
		}
		made = append(made, cur)
	}
	// By enumeration: the first and last ranks together, the others in
	// one group; then only rank 0 covered.
	lists := [][]int{{n - 1, 0}}
	if n > 2 {
		var mid []int
		for g := n - 2; g >= 1; g-- {
			mid = append(mid, g)
		}
		lists = append(lists, mid)
	}
	if n == 1 {
		lists = [][]int{{0}}
	}
	cur, all, err := pg.NewSubgroupsByEnumeration(ctx, lists, comm.WithGroupName("enum"))
	if err != nil {
		return fmt.Errorf("NewSubgroupsByEnumeration(%v): %w", lists, err)
	}
	if len(all) != len(lists) {
		return fmt.Errorf("NewSubgroupsByEnumeration(%v): %d subgroups", lists, len(all))
	}
	for i, l := range lists {
		sorted := slices.Sorted(slices.Values(l))
		if all[i].Name() != fmt.Sprintf("enum.%d", i) {
			return fmt.Errorf("subgroup %d named %q", i, all[i].Name())
		}
		if slices.Contains(l, me) {
			if all[i] != cur {
				return fmt.Errorf("subgroup %d is not the current one", i)
			}
			if err := sumOn(ctx, cur, me, sorted); err != nil {
				return err
			}
		} else if all[i].IsMember() {
			return fmt.Errorf("subgroup %d %v: this rank is a member", i, l)
		}
	}
	made = append(made, cur)
	cur, all, err = pg.NewSubgroupsByEnumeration(ctx, [][]int{{0}})
	if err != nil || len(all) != 1 || (me == 0) != cur.IsMember() || (me != 0 && cur.Size() != -1) {
		return fmt.Errorf("partial enumeration [[0]]: current %v, %d subgroups, %v", cur, len(all), err)
	}
	if me == 0 {
		if err := sumOn(ctx, cur, me, []int{0}); err != nil {
			return err
		}
		made = append(made, cur)
	}

	// Bad input: the same ErrInvalidArgument on every rank.
	bad := []struct {
		call func() error
		want string
	}{
		{func() error { _, _, err := pg.NewSubgroups(ctx, 0); return err }, "group_size 0 must be positive"},
		{func() error { _, _, err := pg.NewSubgroups(ctx, n+1); return err }, fmt.Sprintf("the group size %d is not divisible by group_size %d", n, n+1)},
		{func() error { _, _, err := pg.NewSubgroupsByEnumeration(ctx, nil); return err }, "cannot be empty"},
		{func() error { _, _, err := pg.NewSubgroupsByEnumeration(ctx, [][]int{{0}, {}}); return err }, "subgroup 1 is an empty rank list"},
		{func() error { _, _, err := pg.NewSubgroupsByEnumeration(ctx, [][]int{{0, n}}); return err }, fmt.Sprintf("lists global rank %d, which is not a member", n)},
		{func() error { _, _, err := pg.NewSubgroupsByEnumeration(ctx, [][]int{{0}, {n - 1, 0}}); return err }, "Rank 0 has appeared in both subgroup 0 [0] and subgroup 1"},
		{func() error { _, _, err := pg.NewSubgroupsByEnumeration(ctx, [][]int{{0, 0}}); return err }, "rank 0 appears twice in subgroup 0"},
		{func() error { _, _, err := pg.NewSubgroups(ctx, 1, comm.WithLocalSynchronization()); return err }, "WithLocalSynchronization does not apply"},
	}
	for i, b := range bad {
		err := b.call()
		if !errors.Is(err, comm.ErrInvalidArgument) || !strings.Contains(err.Error(), b.want) {
			return fmt.Errorf("bad input %d: %v, want ErrInvalidArgument containing %q", i, err, b.want)
		}
		if err := sameOnEveryRank(ctx, pg, err); err != nil {
			return fmt.Errorf("bad input %d: %w", i, err)
		}
	}
	if n >= 2 {
		// Rank 0 disagrees: every rank fails with the mismatch, rank 0's
		// valid size and the others' invalid one alike.
		gs := n + 1
		if me == 0 {
			gs = 1
		}
		_, _, err := pg.NewSubgroups(ctx, gs)
		var mm *comm.NewGroupMismatchError
		if !errors.As(err, &mm) || !strings.Contains(err.Error(), "ranks [0] passed NewSubgroups(group_size=1)") {
			return fmt.Errorf("NewSubgroups with rank 0 disagreeing: %v, want a *NewGroupMismatchError naming rank 0's call", err)
		}
		if err := sameOnEveryRank(ctx, pg, err); err != nil {
			return err
		}
	}
	return pg.Barrier(ctx).Wait(ctx)
}

// TestLocalGroupMultiProcess: ranks as processes (FileStore, TCP). A
// local-synchronization NewGroup whose members' calls differ (rank 0 names
// [0 1], ranks 1 and 2 [0 1 2], under one explicit name) fails every
// caller with ErrMismatch, promptly; one that a member never calls fails
// the others at the timeout with a *NewGroupTimeoutError naming it; then a
// good one works among its members while rank 2 does something else, and
// the timed-out one works when all three call it again.
func TestLocalGroupMultiProcess(t *testing.T) {
	if p, ok := testrank.Current(t); ok {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		pg, err := p.World(ctx, "cpu", cpu.Factory(cpu.Options{Transport: cpu.TransportTCP}), zerolog.New(io.Discard))
		if err != nil {
			t.Fatal(err)
		}
		defer pg.Destroy(ctx)
		ranks := []int{0, 1, 2}
		if p.Rank == 0 {
			ranks = []int{0, 1}
		}
		start := time.Now()
		g, err := pg.NewGroup(ctx, ranks, comm.WithLocalSynchronization(), comm.WithGroupName("x"), comm.WithGroupTimeout(20*time.Second))
		if g != nil || !errors.Is(err, comm.ErrMismatch) || time.Since(start) > 10*time.Second {
			t.Fatalf("rank %d: differing calls: %v, %v after %v; want ErrMismatch promptly", p.Rank, g, err, time.Since(start))
		}
		t.Logf("rank %d: %v", p.Rank, err)
		if err := pg.Barrier(ctx).Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if p.Rank != 2 {
			_, err := pg.NewGroup(ctx, []int{0, 1, 2}, comm.WithLocalSynchronization(), comm.WithGroupTimeout(time.Second))
			var te *comm.NewGroupTimeoutError
			if !errors.As(err, &te) || !errors.Is(err, comm.ErrTimeout) || !slices.Equal(te.Missing, []int{2}) {
				t.Fatalf("rank %d: a member never calling: %v, want a *NewGroupTimeoutError naming global rank 2", p.Rank, err)
			}
			t.Logf("rank %d: %v", p.Rank, err)
			g, err := pg.NewGroup(ctx, []int{1, 0}, comm.WithLocalSynchronization())
			if err != nil {
				t.Fatalf("rank %d: %v", p.Rank, err)
			}
			if err := sumOn(ctx, g, p.Rank, []int{0, 1}); err != nil {
				t.Fatalf("rank %d: %v", p.Rank, err)
			}
			defer g.Destroy(ctx) // after the barriers below
		}
		if err := pg.Barrier(ctx).Wait(ctx); err != nil {
			t.Fatal(err)
		}
		// The timed-out creation did not count: all three retry it, rank 2
		// for the first time, and meet under the same name.
		g, err = pg.NewGroup(ctx, []int{0, 1, 2}, comm.WithLocalSynchronization())
		if err != nil || g.Name() != "default_pg.local-0_1_2" {
			t.Fatalf("rank %d: retry after the timeout: %v, %v", p.Rank, g, err)
		}
		if err := sumOn(ctx, g, p.Rank, []int{0, 1, 2}); err != nil {
			t.Fatalf("rank %d: %v", p.Rank, err)
		}
		defer g.Destroy(ctx)
		if err := pg.Barrier(ctx).Wait(ctx); err != nil {
			t.Fatal(err)
		}
		return
	}
	if testing.Short() {
		t.Skip("multi-process test skipped with -short")
	}
	testrank.Spawn(t, 3, 2*time.Minute)
}
