package cpu

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"testing/quick"

	"github.com/ranktree/ranktree/comm"
)

// TestQuickAllReduceVsNaive checks the ring and recursive-doubling
// allreduce, and reduce-scatter + allgather, against a naive elementwise
// reference on random int64 data, world sizes and counts (etcd's
// quorum/quick_test.go style).
func TestQuickAllReduceVsNaive(t *testing.T) {
	for n := 1; n <= 5; n++ {
		for _, algo := range []string{"ring", "recdoubling"} {
			t.Run(fmt.Sprintf("n=%d/%s", n, algo), func(t *testing.T) {
				opts := Options{Transport: TransportSHM, ShmRingBytes: 16 << 10, RingThreshold: 1}
				if algo == "recdoubling" {
					opts.RingThreshold = 1 << 40
				}
				g := newGroup(t, n, opts)
				f := func(seed uint64, c uint16, op uint8) bool {
					count := int(c) % 3000
					red := []comm.ReduceOp{comm.Sum, comm.Max, comm.BXor}[int(op)%3]
					rng := rand.New(rand.NewPCG(seed, 7))
					data := make([][]int64, n)
					want := make([]int64, count)
					for r := range n {
						data[r] = make([]int64, count)
						for i := range count {
							v := rng.Int64N(1<<40) - 1<<39
							data[r][i] = v
							switch {
							case r == 0:
								want[i] = v
							case red == comm.Sum:
								want[i] += v
							case red == comm.Max:
								want[i] = max(want[i], v)
							default:
								want[i] ^= v
							}
						}
					}
					_, errs := g.run(func(r int, fp fpFunc) *comm.Op {
						return &comm.Op{FP: fp(comm.OpAllReduce, comm.Int64, count, -1, red), Type: comm.OpAllReduce, Reduce: red, In: []comm.Buffer{comm.HostBuffer(data[r])}}
					})
					for r := range n {
						if errs[r] != nil {
							t.Log(errs[r])
							return false
						}
						for i := range count {
							if data[r][i] != want[i] {
								return false
							}
						}
					}
					return true
				}
				if err := quick.Check(f, &quick.Config{MaxCount: 25}); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestQuickAllGatherVsNaive checks Bruck's and the ring allgather on random
// uneven block sizes (AllGatherV, zero-length blocks included) and world
// sizes against the expected concatenation.
func TestQuickAllGatherVsNaive(t *testing.T) {
	for n := 1; n <= 5; n++ {
		for _, algo := range []string{"ring", "bruck"} {
			t.Run(fmt.Sprintf("n=%d/%s", n, algo), func(t *testing.T) {
				opts := Options{Transport: TransportSHM, ShmRingBytes: 16 << 10, RingThreshold: 1}
				if algo == "bruck" {
					opts.RingThreshold = 1 << 40
				}
				g := newGroup(t, n, opts)
				f := func(seed uint64) bool {
					rng := rand.New(rand.NewPCG(seed, 9))
					counts := make([]int, n)
					total := 0
					for i := range n {
						counts[i] = rng.IntN(4000)
						if rng.IntN(4) == 0 {
							counts[i] = 0
						}
						total += counts[i]
					}
					want := make([]int64, 0, total)
					ins := make([][]int64, n)
					for r := range n {
						ins[r] = make([]int64, counts[r])
						for i := range ins[r] {
							ins[r][i] = rng.Int64()
						}
						want = append(want, ins[r]...)
					}
					outs := make([][]int64, n)
					_, errs := g.run(func(r int, fp fpFunc) *comm.Op {
						outs[r] = make([]int64, total)
						op := &comm.Op{FP: fp(comm.OpAllGatherV, comm.Int64, total, -1, comm.ReduceOp{}), Type: comm.OpAllGatherV,
							In: []comm.Buffer{comm.HostBuffer(ins[r])}, Out: []comm.Buffer{comm.HostBuffer(outs[r])}, RecvCounts: counts}
						return op
					})
					for r := range n {
						if errs[r] != nil {
							t.Log(errs[r])
							return false
						}
						if !slices.Equal(outs[r], want) {
							return false
						}
					}
					return true
				}
				if err := quick.Check(f, &quick.Config{MaxCount: 25}); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}
