package cpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/ranktree/ranktree/comm"
)

// transports under test; every matrix test runs on each.
var testTransports = []string{TransportTCP, TransportSHM, TransportInmem}

// val is rank r's value at element i: small, distinct across ranks for each
// element (3(r+1) mod 7 differs for r < 7), negative for signed types.
func val(dt comm.DType, r, i int) float64 {
	v := float64(((r+1)*3+i)%7 + 1)
	switch dt {
	case comm.Bool:
		return float64((r + i) % 2)
	case comm.Uint8:
		return v
	}
	if (r+i)%3 == 0 {
		return -v
	}
	return v
}

// refReduce folds the ranks' values of element i with op in float64 /
// int64 and casts the exact result to dt (wrapping for integers).
func refReduce(dt comm.DType, red comm.ReduceOp, n, i int) float64 {
	red = red.ForDType(dt)
	acc := val(dt, 0, i) * red.Factor()
	for r := 1; r < n; r++ {
		v := val(dt, r, i) * red.Factor()
		switch red.Type() {
		case comm.RedSum, comm.RedAvg, comm.RedPreMulSum:
			acc += v
		case comm.RedProduct:
			acc *= v
		case comm.RedMin:
			acc = math.Min(acc, v)
		case comm.RedMax:
			acc = math.Max(acc, v)
		case comm.RedBAnd:
			acc = float64(int64(acc) & int64(v))
		case comm.RedBOr:
			acc = float64(int64(acc) | int64(v))
		case comm.RedBXor:
			acc = float64(int64(acc) ^ int64(v))
		}
	}
	if red.Type() == comm.RedAvg {
		acc /= float64(n)
	}
	return castTo(dt, acc)
}

func opsFor(dt comm.DType) []comm.ReduceOp {
	if dt.IsComplex() { // torch: sum, avg and premul_sum only
		return []comm.ReduceOp{comm.Sum, comm.Avg, comm.PreMulSum(0.5)}
	}
	ops := []comm.ReduceOp{comm.Sum, comm.Product, comm.Min, comm.Max}
	if dt.IsFloating() {
		return append(ops, comm.Avg, comm.PreMulSum(0.5))
	}
	return append(ops, comm.BAnd, comm.BOr, comm.BXor)
}

// TestAllReduceMatrix: transport × world size 1..4 × count (0, 1, odd,
// above the ring threshold) × every dtype and op, against the closed form.
// The slots' rounds are off (SlotAllReduceMax -1), so that 3 and 4 ranks
// over shm and inmem run the ring too (TestAllReduceSlotsRounds covers
// the rounds).
func TestAllReduceMatrix(t *testing.T) {
	for _, tr := range testTransports {
		for n := 1; n <= 4; n++ {
			t.Run(fmt.Sprintf("%s/n=%d", tr, n), func(t *testing.T) {
				g := newGroup(t, n, Options{Transport: tr, RingThreshold: 64, SlotAllReduceMax: -1})
				for _, count := range []int{0, 1, 7, 1001} {
					for _, dt := range comm.AllDTypes {
						for _, red := range opsFor(dt) {
							checkAllReduce(t, g, dt, red, count)
						}
					}
				}
			})
		}
	}
}

func checkAllReduce(t *testing.T, g *group, dt comm.DType, red comm.ReduceOp, count int) {
	t.Helper()
	n := len(g.engines)
	bufs := make([]comm.Buffer, n)
	for r := range n {
		bufs[r] = comm.NewHostBuffer(dt, count)
		for i := range count {
			setF(bufs[r], i, val(dt, r, i))
		}
	}
	what := fmt.Sprintf("allreduce %v %v count %d n %d", dt, red, count, n)
	g.mustRun(what, func(r int, fp func(comm.OpType, comm.DType, int, int, comm.ReduceOp) comm.Fingerprint) *comm.Op {
		return &comm.Op{FP: fp(comm.OpAllReduce, dt, count, -1, red), Type: comm.OpAllReduce, Reduce: red.ForDType(dt), In: []comm.Buffer{bufs[r]}}
	})
	for r := range n {
		for i := range count {
			mustEqAt(t, fmt.Sprintf("%s rank %d elem %d", what, r, i), bufs[r], i, refReduce(dt, red, n, i))
		}
		// Every rank holds bit-identical results.
		if string(bufs[r].Bytes()) != string(bufs[0].Bytes()) {
			t.Fatalf("%s: rank %d result differs from rank 0", what, r)
		}
	}
}

// TestAllReduceLarge runs the default algorithm selection (ring above
// 256 KiB; at 3 ranks over shm and inmem the slots' rounds up to 1 MiB,
// so the smaller count goes through them) on large odd float32 buffers
// through small shm rings, so that messages wrap the ring many times.
func TestAllReduceLarge(t *testing.T) {
	for _, tr := range testTransports {
		for _, n := range []int{2, 3} {
			t.Run(fmt.Sprintf("%s/n=%d", tr, n), func(t *testing.T) {
				g := newGroup(t, n, Options{Transport: tr, ShmRingBytes: 64 << 10})
				for _, count := range []int{100_003, 3_000_001} {
					data := make([][]float32, n)
					for r := range n {
						data[r] = make([]float32, count)
						for i := range data[r] {
							data[r][i] = float32((r+1)*(i%1000) + r)
						}
					}
					g.mustRun("large allreduce", func(r int, fp fpFunc) *comm.Op {
						return &comm.Op{FP: fp(comm.OpAllReduce, comm.Float32, count, -1, comm.Sum), Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{comm.HostBuffer(data[r])}}
					})
					for r := range n {
						for i, got := range data[r] {
							want := float32(n*(n+1)/2*(i%1000) + n*(n-1)/2)
							if got != want {
								t.Fatalf("count %d rank %d elem %d: got %v, want %v", count, r, i, got, want)
							}
						}
					}
				}
			})
		}
	}
}

// TestAllReduceC10dForms checks c10d's closed forms: with the source rank
// holding 2 and the others 10, Sum = 2+10(n−1), Product = 2·10^(n−1),
// Min = 2, Max = 10; and rank+1 summed is n(n+1)/2.
func TestAllReduceC10dForms(t *testing.T) {
	forEachGroup(t, Options{}, func(t *testing.T, g *group) {
		n := len(g.engines)
		pow := 1.0
		for range n - 1 {
			pow *= 10
		}
		for _, dt := range []comm.DType{comm.Float32, comm.Int64} {
			for src := range n {
				for _, c := range []struct {
					red  comm.ReduceOp
					want float64
				}{{comm.Sum, 2 + 10*float64(n-1)}, {comm.Product, 2 * pow}, {comm.Min, 2}, {comm.Max, 10}} {
					if n == 1 && c.red == comm.Max {
						c.want = 2
					}
					bufs := make([]comm.Buffer, n)
					for r := range n {
						v := 10.0
						if r == src {
							v = 2
						}
						bufs[r] = filled(dt, 5, v)
					}
					g.mustRun("c10d form", func(r int, fp fpFunc) *comm.Op {
						return &comm.Op{FP: fp(comm.OpAllReduce, dt, 5, -1, c.red), Type: comm.OpAllReduce, Reduce: c.red, In: []comm.Buffer{bufs[r]}}
					})
					for r := range n {
						if got := getF(bufs[r], 4); got != c.want {
							t.Fatalf("%v %v src %d: rank %d got %v, want %v", dt, c.red, src, r, got, c.want)
						}
					}
				}
			}
			bufs := make([]comm.Buffer, n)
			for r := range n {
				bufs[r] = filled(dt, 3, float64(r+1))
			}
			g.mustRun("rank+1", func(r int, fp fpFunc) *comm.Op {
				return &comm.Op{FP: fp(comm.OpAllReduce, dt, 3, -1, comm.Sum), Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{bufs[r]}}
			})
			for r := range n {
				if got := getF(bufs[r], 2); got != float64(n*(n+1)/2) {
					t.Fatalf("rank+1 summed: rank %d got %v, want %d", r, got, n*(n+1)/2)
				}
			}
		}
	})
}
