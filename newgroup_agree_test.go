package ranktree

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// TestNewGroupDifferentListsFailEverywhere (issue 14, case 5): rank 0
// passes [0 1] to NewGroup while ranks 1 and 2 pass [0 1 2]. Every rank
// fails at once with a *comm.NewGroupMismatchError naming both lists and
// who passed them; nobody gets a group. A later NewGroup with one list
// works, and a non-member sees Rank -1 and Size -1 from NewGroup and Split.
func TestNewGroupDifferentListsFailEverywhere(t *testing.T) {
	clearSupervisionEnv(t)
	rts := startRanks(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	eachRank(t, rts, func(rt *Runtime) error {
		ranks := []int{0, 1, 2}
		if rt.Rank() == 0 {
			ranks = []int{0, 1}
		}
		pg, err := rt.NewGroup(ctx, ranks)
		var me *comm.NewGroupMismatchError
		if pg != nil || !errors.Is(err, comm.ErrMismatch) || !errors.As(err, &me) {
			t.Errorf("rank %d: NewGroup(%v) = %v, %v; want a *NewGroupMismatchError", rt.Rank(), ranks, pg, err)
			return nil
		}
		msg := err.Error()
		if !strings.Contains(msg, "ranks [0] passed") || !strings.Contains(msg, "[0 1]") || !strings.Contains(msg, "ranks [1 2] passed") || !strings.Contains(msg, "[0 1 2]") {
			t.Errorf("rank %d: %v does not name both lists and who passed them", rt.Rank(), err)
		}
		return nil
	})
	if d := time.Since(start); d > time.Second {
		t.Errorf("mismatch took %v, want < 1 s", d)
	}
	eachRank(t, rts, func(rt *Runtime) error {
		pg, err := rt.NewGroup(ctx, []int{1, 2})
		if err != nil {
			return err
		}
		if rt.Rank() == 0 {
			if pg.Rank() != -1 || pg.Size() != -1 {
				t.Errorf("non-member of NewGroup: Rank %d Size %d, want -1 -1", pg.Rank(), pg.Size())
			}
		} else if err := pg.AllReduce(ctx, comm.HostBuffer([]float32{1}), comm.Sum).Wait(ctx); err != nil {
			return err
		}
		color := 0
		if rt.Rank() == 2 {
			color = -1
		}
		sp, err := rt.World().Split(ctx, color, 0)
		if err != nil {
			return err
		}
		if rt.Rank() == 2 && (sp.Rank() != -1 || sp.Size() != -1) {
			t.Errorf("non-member of Split: Rank %d Size %d, want -1 -1", sp.Rank(), sp.Size())
		}
		return nil
	})
}
