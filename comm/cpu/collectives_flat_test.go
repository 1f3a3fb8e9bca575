package cpu

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ranktree/ranktree/comm"
)

// TestFlatCollectivesMatrix: broadcast (every root), allgather and
// reduce-scatter (every dtype, every reduce op) over transport × world
// size 1..4, with sizes just below, at and above FlatThreshold, against
// a reference; over shm and inmem the sizes up to the threshold take the
// one-step algorithms (counted), the rest the message-based ones, but for
// an allgather among 3+ ranks, which takes the slots in rounds (counted).
func TestFlatCollectivesMatrix(t *testing.T) {
	const thr = 256
	for _, tr := range testTransports {
		for n := 1; n <= 4; n++ {
			t.Run(fmt.Sprintf("%s/n=%d", tr, n), func(t *testing.T) {
				g := newGroup(t, n, Options{Transport: tr, FlatThreshold: thr})
				rng := rand.New(rand.NewPCG(3, uint64(n)))
				// above: the one-step ops an op of more than thr bytes takes
				// (an allgather among 3+ ranks: one per round, allgather_flat.go).
				expect := func(what string, nbytes int, before uint64, above ...uint64) {
					t.Helper()
					want := before
					if g.engines[0].grp != nil && nbytes <= thr {
						want++
					} else if g.engines[0].grp != nil && len(above) > 0 {
						want += above[0]
					}
					if got := flatOps(g, 0); got != want {
						t.Fatalf("%s (%d bytes per slot): %d one-step ops, want %d", what, nbytes, got, want)
					}
				}
				for _, dt := range comm.AllDTypes {
					at := thr / dt.Size()
					// Broadcast: the slot holds the buffer.
					for _, count := range []int{0, 1, at, at + 1} {
						for root := range n {
							before := flatOps(g, 0)
							checkBroadcast(t, g, rng, dt, count, root, "broadcast")
							expect(fmt.Sprintf("broadcast %v×%d", dt, count), count*dt.Size(), before)
						}
					}
					// AllGather: the gathered total counts.
					per := at / n
					for _, count := range []int{1, per, per + 1} {
						ins := make([][]byte, n)
						outs := make([]comm.Buffer, n)
						for r := range n {
							ins[r] = randBytes(rng, dt, count)
							outs[r] = comm.NewHostBuffer(dt, n*count)
						}
						before := flatOps(g, 0)
						g.mustRun("allgather", func(r int, fp fpFunc) *comm.Op {
							in := comm.NewHostBuffer(dt, count)
							copy(in.Bytes(), ins[r])
							return &comm.Op{FP: fp(comm.OpAllGather, dt, n*count, -1, comm.ReduceOp{}), Type: comm.OpAllGather, In: []comm.Buffer{in}, Out: []comm.Buffer{outs[r]}}
						})
						want := bytes.Join(ins, nil)
						for r := range n {
							if !bytes.Equal(outs[r].Bytes(), want) {
								t.Fatalf("allgather %v×%d: rank %d differs", dt, count, r)
							}
						}
						var rounds uint64 // slot rounds of an allgather above thr
						if n > 2 {
							rounds = uint64((count*dt.Size() + thr - 1) / thr)
						}
						expect(fmt.Sprintf("allgather %v×%d", dt, count), n*count*dt.Size(), before, rounds)
					}
					// ReduceScatter: the input (n blocks) counts; every op.
					for _, count := range []int{1, per, per + 1} {
						for _, red := range opsFor(dt) {
							outs := make([]comm.Buffer, n)
							ins := make([]comm.Buffer, n)
							for r := range n {
								ins[r] = comm.NewHostBuffer(dt, n*count)
								for i := range n * count {
									setF(ins[r], i, val(dt, r, i))
								}
								outs[r] = comm.NewHostBuffer(dt, count)
							}
							before := flatOps(g, 0)
							g.mustRun("reducescatter", func(r int, fp fpFunc) *comm.Op {
								return &comm.Op{FP: fp(comm.OpReduceScatter, dt, count, -1, red), Type: comm.OpReduceScatter, Reduce: red.ForDType(dt), In: []comm.Buffer{ins[r]}, Out: []comm.Buffer{outs[r]}}
							})
							for r := range n {
								for k := range count {
									mustEq(t, fmt.Sprintf("reducescatter %v %v×%d rank %d elem %d", red, dt, count, r, k), dt,
										getF(outs[r], k), refReduce(dt, red, n, r*count+k))
								}
								for i := range n * count {
									if got := getF(ins[r], i); got != castTo(dt, val(dt, r, i)) {
										t.Fatalf("reducescatter modified rank %d's input", r)
									}
								}
							}
							expect(fmt.Sprintf("reducescatter %v %v×%d", red, dt, count), n*count*dt.Size(), before)
						}
					}
				}
			})
		}
	}
}
