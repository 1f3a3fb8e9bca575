package reducer

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"testing"

	"github.com/ranktree/ranktree/comm"
)

// countGroup wraps a Group and counts the allreduces this rank launched.
type countGroup struct {
	Group
	allreduces atomic.Int64
}

func (c *countGroup) AllReduce(ctx context.Context, buf comm.Buffer, op comm.ReduceOp, opts ...comm.OpOption) *comm.Work {
	c.allreduces.Add(1)
	return c.Group.AllReduce(ctx, buf, op, opts...)
}

// TestDelayAllReduce: with Config.DelayAllReduce no allreduce starts
// between the iteration's first GradReady and EndBackward (the overlapped
// path launches several), EndBackward launches one per bucket, and the
// averaged gradients are bit-identical to the overlapped path's, over
// three iterations (the rebuild included), with and without a comm hook
// and unused-parameter search.
func TestDelayAllReduce(t *testing.T) {
	for _, variant := range []string{"plain", "fp16 hook", "find unused"} {
		t.Run(variant, func(t *testing.T) {
			eachWorld(t, 3, func(t *testing.T, groups []Group, _ *memWorld) {
				cgs := make([]*countGroup, len(groups))
				for r, g := range groups {
					cgs[r] = &countGroup{Group: g}
					groups[r] = cgs[r]
				}
				runRanks(t, groups, func(rank int, g Group) error {
					cg := cgs[rank]
					var results [2][][][]float32 // [delay][iteration][param]
					for di, delay := range []bool{false, true} {
						m := newModel(7, 5, 9, 3)
						cfg := Config{FirstBucketBytes: 40, BucketCapBytes: 40, DelayAllReduce: delay, FindUnusedParameters: variant == "find unused"}
						red, err := New(bg, g, m.params, cfg)
						if err != nil {
							return err
						}
						if variant == "fp16 hook" {
							if err := red.RegisterCommHook(FP16CompressHook()); err != nil {
								return err
							}
						}
						buckets := len(red.Stats().BucketSizes)
						for it := range 3 {
							before := cg.allreduces.Load()
							for _, p := range []int{3, 2, 1, 0} {
								for i := range m.grads[p] {
									m.grads[p][i] = float32(math.Sin(float64(100*rank+10*p+i+it))) * float32(p+1)
								}
								if err := red.GradReady(p, comm.HostBuffer(m.grads[p])); err != nil {
									return err
								}
							}
							during := cg.allreduces.Load() - before
							if err := red.EndBackward(bg); err != nil {
								return err
							}
							total := cg.allreduces.Load() - before
							if delay && during != 0 {
								return fmt.Errorf("iteration %d: %d allreduces started before EndBackward with DelayAllReduce", it, during)
							}
							if !delay && during == 0 {
								return fmt.Errorf("iteration %d: the overlapped path started no allreduce before EndBackward", it)
							}
							if total < int64(buckets) {
								return fmt.Errorf("iteration %d: %d allreduces for %d buckets", it, total, buckets)
							}
							var snap [][]float32
							for p := range m.grads {
								snap = append(snap, append([]float32(nil), m.grads[p]...))
							}
							results[di] = append(results[di], snap)
						}
						if s := red.Stats(); s.DelayAllReduce != delay || s.Iterations != 3 {
							return fmt.Errorf("stats: DelayAllReduce %v iterations %d", s.DelayAllReduce, s.Iterations)
						}
					}
					for it := range results[0] {
						for p := range results[0][it] {
							for i, v := range results[0][it][p] {
								if d := results[1][it][p][i]; d != v {
									return fmt.Errorf("iteration %d param %d [%d]: delayed %v, overlapped %v", it, p, i, d, v)
								}
							}
						}
					}
					return nil
				})
			})
		})
	}
}
