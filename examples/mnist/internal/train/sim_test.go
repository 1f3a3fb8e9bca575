package train

import (
	"context"
	"fmt"
	"sync"

	"github.com/ranktree/ranktree/comm"
)

// simGroup runs n ranks in one process: each collective is a barrier where
// the last rank to arrive reduces every rank's buffers in place. It stands
// in for ranktree's process group and reducer in tests.
type simGroup struct {
	n       int
	mu      sync.Mutex
	cond    *sync.Cond
	gen     int
	waiting []any
	// tamper, if set, runs on every rank's averaged gradient views after
	// each EndBackward (fault injection).
	tamper func(rank int, views [][]float32)
}

func newSimGroup(n int) *simGroup {
	g := &simGroup{n: n, waiting: make([]any, n)}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// collective deposits this rank's buffers; the last arrival runs reduce over
// all of them; everyone returns after that.
func (g *simGroup) collective(rank int, mine any, reduce func(all []any) error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	gen := g.gen
	g.waiting[rank] = mine
	arrived := 0
	for _, w := range g.waiting {
		if w != nil {
			arrived++
		}
	}
	if arrived == g.n {
		err := reduce(g.waiting)
		g.waiting = make([]any, g.n)
		g.gen++
		g.cond.Broadcast()
		return err
	}
	for g.gen == gen {
		g.cond.Wait()
	}
	return nil
}

// simRank is one rank's Sync: it records the gradient views and averages
// them across ranks at EndBackward, like DDP's reducer.
type simRank struct {
	g     *simGroup
	rank  int
	views [][]float32
	order []int
}

func (s *simRank) Rank() int { return s.rank }
func (s *simRank) Size() int { return s.g.n }

func (s *simRank) GradReady(param int, grad []float32) error {
	s.order = append(s.order, param)
	s.views = append(s.views, grad)
	return nil
}

func (s *simRank) EndBackward(ctx context.Context) error {
	views := s.views
	s.views = nil
	return s.g.collective(s.rank, views, func(all []any) error {
		for v := range views {
			for i := range views[v] {
				var sum float32
				for _, a := range all {
					sum += a.([][]float32)[v][i]
				}
				for _, a := range all {
					a.([][]float32)[v][i] = sum / float32(len(all))
				}
			}
		}
		if s.g.tamper != nil {
			for r, a := range all {
				s.g.tamper(r, a.([][]float32))
			}
		}
		return nil
	})
}

func (s *simRank) AllReduceInt64(ctx context.Context, x []int64, op comm.ReduceOp) error {
	return s.g.collective(s.rank, x, func(all []any) error {
		for i := range x {
			acc := all[0].([]int64)[i]
			for _, a := range all[1:] {
				v := a.([]int64)[i]
				switch op {
				case comm.Sum:
					acc += v
				case comm.Max:
					acc = max(acc, v)
				default:
					return fmt.Errorf("sim: op %v not simulated", op)
				}
			}
			for _, a := range all {
				a.([]int64)[i] = acc
			}
		}
		return nil
	})
}
