package cpu

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"testing/quick"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu/transport"
)

// TestQuickAllReduceVsNaive checks the ring and recursive-doubling
// allreduce against a naive elementwise reference on random int64 data,
// world sizes and counts (etcd's quorum/quick_test.go style), calling the
// algorithms directly over the in-memory mesh (transport.InmemMesh).
func TestQuickAllReduceVsNaive(t *testing.T) {
	algos := map[string]func(m *transport.Mesh, buf []int64) error{
		"ring": func(m *transport.Mesh, buf []int64) error {
			return allreduceRing(m, splitBlocks(buf, m.Size()), 8, ringOpts{chunk: 0})
		},
		// Chunks of 3 KiB: blocks of up to 3000 elements cut into a few
		// pieces that a 16 KiB ring carries with room to spare, or not;
		// the finished blocks received with RecvStreaming.
		"ringchunked": func(m *transport.Mesh, buf []int64) error {
			return allreduceRing(m, splitBlocks(buf, m.Size()), 8, ringOpts{chunk: 3 << 10, streamOut: true})
		},
		"recdoubling": func(m *transport.Mesh, buf []int64) error {
			return allreduceRecDoubling(m, i64bytes(buf), make([]byte, 8*len(buf)))
		},
	}
	for n := 1; n <= 5; n++ {
		for _, algo := range []string{"ring", "ringchunked", "recdoubling"} {
			t.Run(fmt.Sprintf("n=%d/%s", n, algo), func(t *testing.T) {
				mr := newMeshRun(t, n, 16<<10, 0)
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
					errs := mr.op(comm.OpAllReduce, count, -1, red, func(r int, m *transport.Mesh) error {
						return algos[algo](m, data[r])
					})
					for r := range n {
						if errs[r] != nil {
							t.Log(errs[r])
							return false
						}
						if !slices.Equal(data[r], want) {
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

// TestQuickAllGatherVsNaive checks Bruck's and the ring allgather on random
// uneven block sizes (AllGatherV, zero-length blocks included) and world
// sizes against the expected blocks, over the in-memory mesh.
func TestQuickAllGatherVsNaive(t *testing.T) {
	algos := map[string]func(m *transport.Mesh, blocks [][]byte) error{
		"ring": func(m *transport.Mesh, blocks [][]byte) error { return ringAllGather(m, blocks, 0) },
		"bruck": func(m *transport.Mesh, blocks [][]byte) error {
			return allgatherBruck(m, blocks, make([]byte, bruckScratch(blocks)))
		},
	}
	for n := 1; n <= 5; n++ {
		for _, algo := range []string{"ring", "bruck"} {
			t.Run(fmt.Sprintf("n=%d/%s", n, algo), func(t *testing.T) {
				mr := newMeshRun(t, n, 16<<10, 0)
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
					errs := mr.op(comm.OpAllGatherV, total, -1, comm.ReduceOp{}, func(r int, m *transport.Mesh) error {
						outs[r] = make([]int64, total)
						blocks := make([][]byte, n)
						off := 0
						for i := range n {
							blocks[i] = i64bytes(outs[r][off : off+counts[i]])
							off += counts[i]
						}
						copy(blocks[r], i64bytes(ins[r]))
						return algos[algo](m, blocks)
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
