package cpu

import (
	"fmt"
	"testing"

	"github.com/ranktree/ranktree/comm"
)

// cval is rank r's complex value at element i: distinct parts, exact in
// complex64.
func cval(r, i int) complex128 {
	return complex(float64(r*100+i%97), -float64(r+1)*0.5-float64(i%13))
}

// cbuf is a host buffer of count complex elements of dt with rank r's
// values (cval).
func cbuf(dt comm.DType, r, count int) comm.Buffer {
	b := comm.NewHostBuffer(dt, count)
	for i := range count {
		csetAt(b, i, cval(r, i))
	}
	return b
}

func csetAt(b comm.Buffer, i int, v complex128) {
	if b.DType() == comm.Complex64 {
		s, _ := comm.AsSlice[complex64](b)
		s[i] = complex64(v)
		return
	}
	s, _ := comm.AsSlice[complex128](b)
	s[i] = v
}

func cgetAt(b comm.Buffer, i int) complex128 {
	if b.DType() == comm.Complex64 {
		s, _ := comm.AsSlice[complex64](b)
		return complex128(s[i])
	}
	s, _ := comm.AsSlice[complex128](b)
	return s[i]
}

// cmustEq compares complex results part by part with dt's tolerance.
func cmustEq(t *testing.T, what string, dt comm.DType, got, want complex128) {
	t.Helper()
	if !approxEq(dt, real(got), real(want)) || !approxEq(dt, imag(got), imag(want)) {
		t.Fatalf("%s: got %v, want %v (%v)", what, got, want, dt)
	}
}

// TestComplexCollectives: complex64 and complex128 through the data
// movement collectives (bit-exact: AllGather, Gather, Scatter, AllToAll)
// and the reductions torch allows on them (ReduceScatter and AllReduce
// with sum, avg and premul_sum; the values' real and imaginary parts
// differ, so a kernel that reduced only one part, or mixed them, fails),
// on every transport and world size 1..4, counts 0, 1 and odd.
func TestComplexCollectives(t *testing.T) {
	forEachGroup(t, Options{RingThreshold: 64}, func(t *testing.T, g *group) {
		n := len(g.engines)
		for _, dt := range []comm.DType{comm.Complex64, comm.Complex128} {
			for _, c := range []int{0, 1, 37} {
				// AllGather into one flat buffer.
				outs := make([]comm.Buffer, n)
				g.mustRun("allgather", func(r int, fp fpFunc) *comm.Op {
					outs[r] = comm.NewHostBuffer(dt, n*c)
					return &comm.Op{FP: fp(comm.OpAllGather, dt, c, -1, comm.ReduceOp{}), Type: comm.OpAllGather, In: []comm.Buffer{cbuf(dt, r, c)}, Out: []comm.Buffer{outs[r]}}
				})
				for r := range n {
					for src := range n {
						for i := range c {
							if got, want := cgetAt(outs[r], src*c+i), complex128(complex64(cval(src, i))); dt == comm.Complex64 && got != want || dt == comm.Complex128 && got != cval(src, i) {
								t.Fatalf("allgather %v c=%d rank %d part %d elem %d: %v", dt, c, r, src, i, got)
							}
						}
					}
				}
				// Scatter and Gather from the last rank.
				root := n - 1
				souts := make([]comm.Buffer, n)
				g.mustRun("scatter", func(r int, fp fpFunc) *comm.Op {
					souts[r] = comm.NewHostBuffer(dt, c)
					op := &comm.Op{FP: fp(comm.OpScatter, dt, c, root, comm.ReduceOp{}), Type: comm.OpScatter, Root: root, Out: []comm.Buffer{souts[r]}}
					if r == root {
						for i := range n {
							op.In = append(op.In, cbuf(dt, i, c))
						}
					}
					return op
				})
				for r := range n {
					want := cbuf(dt, r, c)
					if string(souts[r].Bytes()) != string(want.Bytes()) {
						t.Fatalf("scatter %v c=%d: rank %d got a different part", dt, c, r)
					}
				}
				gout := comm.NewHostBuffer(dt, n*c)
				g.mustRun("gather", func(r int, fp fpFunc) *comm.Op {
					op := &comm.Op{FP: fp(comm.OpGather, dt, c, root, comm.ReduceOp{}), Type: comm.OpGather, Root: root, In: []comm.Buffer{cbuf(dt, r, c)}}
					if r == root {
						op.Out = []comm.Buffer{gout}
					}
					return op
				})
				for src := range n {
					if string(gout.Slice(src*c, c).Bytes()) != string(cbuf(dt, src, c).Bytes()) {
						t.Fatalf("gather %v c=%d: part %d differs", dt, c, src)
					}
				}
				// AllToAll with equal splits: rank r's part j goes to rank j.
				aouts := make([]comm.Buffer, n)
				g.mustRun("alltoall", func(r int, fp fpFunc) *comm.Op {
					aouts[r] = comm.NewHostBuffer(dt, n*c)
					counts := make([]int, n)
					for i := range counts {
						counts[i] = c
					}
					return &comm.Op{FP: fp(comm.OpAllToAll, dt, 0, -1, comm.ReduceOp{}), Type: comm.OpAllToAll,
						In: []comm.Buffer{cbuf(dt, r, n*c)}, Out: []comm.Buffer{aouts[r]}, SendCounts: counts, RecvCounts: counts}
				})
				for r := range n {
					for src := range n {
						if string(aouts[r].Slice(src*c, c).Bytes()) != string(cbuf(dt, src, n*c).Slice(r*c, c).Bytes()) {
							t.Fatalf("alltoall %v c=%d: rank %d part from %d differs", dt, c, r, src)
						}
					}
				}
				for _, red := range []comm.ReduceOp{comm.Sum, comm.Avg, comm.PreMulSum(0.5)} {
					sum := func(i int) complex128 {
						var s complex128
						for r := range n {
							s += cval(r, i) * complex(red.Factor(), 0)
						}
						if red == comm.Avg {
							s /= complex(float64(n), 0)
						}
						return s
					}
					what := fmt.Sprintf("allreduce %v %v c=%d", dt, red, c)
					bufs := make([]comm.Buffer, n)
					g.mustRun(what, func(r int, fp fpFunc) *comm.Op {
						bufs[r] = cbuf(dt, r, c)
						return &comm.Op{FP: fp(comm.OpAllReduce, dt, c, -1, red), Type: comm.OpAllReduce, Reduce: red, In: []comm.Buffer{bufs[r]}}
					})
					for r := range n {
						for i := range c {
							cmustEq(t, fmt.Sprintf("%s rank %d elem %d", what, r, i), dt, cgetAt(bufs[r], i), sum(i))
						}
					}
					what = fmt.Sprintf("reducescatter %v %v c=%d", dt, red, c)
					rsout := make([]comm.Buffer, n)
					g.mustRun(what, func(r int, fp fpFunc) *comm.Op {
						rsout[r] = comm.NewHostBuffer(dt, c)
						return &comm.Op{FP: fp(comm.OpReduceScatter, dt, c, -1, red), Type: comm.OpReduceScatter, Reduce: red,
							In: []comm.Buffer{cbuf(dt, r, n*c)}, Out: []comm.Buffer{rsout[r]}}
					})
					for r := range n {
						for i := range c {
							cmustEq(t, fmt.Sprintf("%s rank %d elem %d", what, r, i), dt, cgetAt(rsout[r], i), sum(r*c+i))
						}
					}
				}
			}
		}
	})
}
