package cpu

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
)

type fpFunc = func(comm.OpType, comm.DType, int, int, comm.ReduceOp) comm.Fingerprint

// forEachGroup runs f on groups of every transport and size 1..4.
func forEachGroup(t *testing.T, opts Options, f func(t *testing.T, g *group)) {
	for _, tr := range testTransports {
		for n := 1; n <= 4; n++ {
			t.Run(fmt.Sprintf("%s/n=%d", tr, n), func(t *testing.T) {
				o := opts
				o.Transport = tr
				f(t, newGroup(t, n, o))
			})
		}
	}
}

func randBytes(rng *rand.Rand, dt comm.DType, count int) []byte {
	b := make([]byte, count*dt.Size())
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	if dt == comm.Bool {
		for i := range b {
			b[i] &= 1
		}
	}
	return b
}

// TestBroadcast: bit-exact for every dtype (random bits, so negative values
// and NaN payloads too), from every root.
func TestBroadcast(t *testing.T) {
	forEachGroup(t, Options{}, func(t *testing.T, g *group) {
		n := len(g.engines)
		rng := rand.New(rand.NewPCG(1, 2))
		for _, count := range []int{0, 1, 1001, 70001} {
			for _, dt := range comm.AllDTypes {
				for root := range n {
					checkBroadcast(t, g, rng, dt, count, root, "broadcast")
				}
			}
		}
	})
}

// checkBroadcast broadcasts count random elements of dt from root on g
// and checks that every rank holds the root's bytes.
func checkBroadcast(t *testing.T, g *group, rng *rand.Rand, dt comm.DType, count, root int, what string) {
	t.Helper()
	n := len(g.engines)
	want := randBytes(rng, dt, count)
	bufs := make([]comm.Buffer, n)
	for r := range n {
		bufs[r] = comm.NewHostBuffer(dt, count)
		if r == root {
			copy(bufs[r].Bytes(), want)
		}
	}
	g.mustRun(what, func(r int, fp fpFunc) *comm.Op {
		return &comm.Op{FP: fp(comm.OpBroadcast, dt, count, root, comm.ReduceOp{}), Type: comm.OpBroadcast, Root: root, In: []comm.Buffer{bufs[r]}}
	})
	for r := range n {
		if !bytes.Equal(bufs[r].Bytes(), want) {
			t.Fatalf("%s %v×%d root %d: rank %d differs", what, dt, count, root, r)
		}
	}
}

// TestBroadcastChainShm: the pipelined chain (3 and 4 ranks over shm;
// with RingThreshold 64, at every size at 3 ranks, from 1 MiB at 4, the
// smaller ones taking scatter + allgather) with 4 KiB rings, so that the message wraps each
// ring many times while every middle rank forwards it piece by piece;
// bit-exact on every rank for every root, and the engine picks the chain.
func TestBroadcastChainShm(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{3, 4} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			g := newGroup(t, n, Options{Transport: TransportSHM, RingThreshold: 64, ShmRingBytes: 4096})
			for _, e := range g.engines {
				e.slotBroadcastMin = math.MaxInt // the slots would take the large ones
			}
			noBroadcastCMA(g)  // the single copy would take the middle ones
			const big = 300001 // 1.2 MB: the chain at 4 ranks too (chainMin4)
			if e := g.engines[0]; !e.useChain(big*4) || e.useSlots(big*4) {
				t.Fatal("the engine would not use the chain")
			}
			for _, count := range []int{17, 5001, 100003, big} {
				for root := range n {
					checkBroadcast(t, g, rng, comm.Float32, count, root, "chain broadcast")
				}
			}
		})
	}
}

// noBroadcastCMA keeps g's broadcasts off the single copy, which
// three ranks take from 64 KiB to 1 MiB (TestBroadcastCMA), so that a
// test reaches the algorithm it checks.
func noBroadcastCMA(g *group) {
	for _, e := range g.engines {
		e.bcastCMA = [2]int{1, 0}
	}
}

// TestBroadcastSlots: a broadcast of slotBroadcastMinFor(n) or more
// among 3 and 4 ranks goes through the slots in rounds (4 KiB slots, so
// the threshold's size takes 128 or 64 rounds, and an odd size ends on a
// short round), over shm and inmem; bit-exact on every rank for every
// root, and the engine picks the slots from the threshold, not below it.
func TestBroadcastSlots(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, tr := range []string{TransportSHM, TransportInmem} {
		for _, n := range []int{3, 4} {
			t.Run(fmt.Sprintf("%s/n=%d", tr, n), func(t *testing.T) {
				g := newGroup(t, n, Options{Transport: tr, FlatThreshold: 1024, SlotBytes: 4096, ShmRingBytes: 64 << 10})
				noBroadcastCMA(g)
				e := g.engines[0]
				lo := slotBroadcastMinFor(n)
				if e.opts.SlotBytes != 4096 || !e.useSlots(lo) || e.useSlots(lo-4) {
					t.Fatalf("SlotBytes %d; slots for %d bytes: %v, for %d: %v", e.opts.SlotBytes,
						lo, e.useSlots(lo), lo-4, e.useSlots(lo-4))
				}
				for _, count := range []int{lo / 4, lo/4 + 1003} {
					for root := range n {
						checkBroadcast(t, g, rng, comm.Float32, count, root, "slot broadcast")
					}
				}
			})
		}
	}
}

// TestBroadcastSlotsMismatch: ranks that launch different ops at one seq
// where some take the slot broadcast in rounds all fail with
// ErrMismatch within a second: another count (another number of
// rounds), another root, and a ring allreduce of the same size.
func TestBroadcastSlotsMismatch(t *testing.T) {
	const n = 3
	count := slotBroadcastMinFor(n)/4 + 100
	bc := oneOp{comm.OpBroadcast, count, 0}
	cases := []struct {
		name string
		odd  oneOp // what rank 1 launches; the others launch bc
	}{
		{"count", oneOp{comm.OpBroadcast, count + 2048, 0}},
		{"root", oneOp{comm.OpBroadcast, count, 1}},
		{"allreduce", oneOp{comm.OpAllReduce, count, -1}},
	}
	for _, tr := range []string{TransportSHM, TransportInmem} {
		for _, c := range cases {
			t.Run(tr+"/"+c.name, func(t *testing.T) {
				g := newGroup(t, n, Options{Transport: tr, FlatThreshold: 1024, SlotBytes: 4096, ShmRingBytes: 64 << 10})
				noBroadcastCMA(g)
				expectOddMismatch(t, g, bc, c.odd)
			})
		}
	}
}

// oneOp is a float32 broadcast or sum allreduce (root -1) of count
// elements, for expectOddMismatch.
type oneOp struct {
	typ   comm.OpType
	count int
	root  int
}

// expectOddMismatch launches odd on rank 1 of g and op on every other
// rank, all at seq 3, and expects every rank to fail with ErrMismatch
// within a second (expectMismatch).
func expectOddMismatch(t *testing.T, g *group, op, odd oneOp) {
	t.Helper()
	works := make([]*comm.Work, len(g.engines))
	start := time.Now()
	for r, e := range g.engines {
		s := op
		if r == 1 {
			s = odd
		}
		buf := comm.NewHostBuffer(comm.Float32, s.count)
		fp := comm.Fingerprint{Group: comm.GroupHash(g.name), Seq: 3, Op: s.typ, DType: comm.Float32, Count: int64(s.count), Root: int32(s.root)}
		o := &comm.Op{FP: fp, Type: s.typ, Root: s.root, In: []comm.Buffer{buf}}
		if s.typ == comm.OpAllReduce {
			o.Reduce, o.FP.RedOp = comm.Sum, comm.Sum.Type()
		}
		works[r] = launch(e, o)
	}
	expectMismatch(t, works, start)
}

// TestAllGatherFlatRoundsShm: an allgather larger than the one-step
// threshold goes through the slots in rounds (3 and 4 ranks over shm;
// rounds of FlatThreshold, 256 bytes, so a 4004-byte block takes 16
// rounds, and an odd one ends on a short round; from 4 MiB gathered,
// rounds of SlotBytes, 4 KiB); every rank's output is checked, flat and
// list forms.
func TestAllGatherFlatRoundsShm(t *testing.T) {
	for _, n := range []int{3, 4} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			g := newGroup(t, n, Options{Transport: TransportSHM, FlatThreshold: 256, SlotBytes: 4096})
			big := (4<<20)/(4*n) + 3
			for _, c := range []int{1001, 999, big} {
				want := 256
				if c == big {
					want = 4096
				}
				if e := g.engines[0]; e.useFlat(n*c*4) || !e.useFlatRounds(n*c*4) || e.allgatherPiece(n*c*4) != want {
					t.Fatalf("%d int32 per rank: the engine would not take the slots in rounds of %d bytes", c, want)
				}
				for _, layout := range []string{outOne, outList} {
					checkAllGather(t, g, c, layout)
				}
			}
		})
	}
}

// TestReduce: every root gets the closed form; non-root buffers unchanged.
func TestReduce(t *testing.T) {
	forEachGroup(t, Options{}, func(t *testing.T, g *group) {
		n := len(g.engines)
		for _, count := range []int{0, 1, 999} {
			for _, dt := range []comm.DType{comm.Float32, comm.BFloat16, comm.Int64, comm.Bool, comm.Complex64} {
				for _, red := range opsFor(dt) {
					for root := range n {
						bufs := make([]comm.Buffer, n)
						for r := range n {
							bufs[r] = comm.NewHostBuffer(dt, count)
							for i := range count {
								setF(bufs[r], i, val(dt, r, i))
							}
						}
						g.mustRun("reduce", func(r int, fp fpFunc) *comm.Op {
							return &comm.Op{FP: fp(comm.OpReduce, dt, count, root, red), Type: comm.OpReduce, Root: root, Reduce: red.ForDType(dt), In: []comm.Buffer{bufs[r]}}
						})
						for r := range n {
							for i := range count {
								want := castTo(dt, val(dt, r, i))
								if r == root {
									want = refReduce(dt, red, n, i)
								}
								mustEqAt(t, fmt.Sprintf("reduce %v %v root %d rank %d elem %d", dt, red, root, r, i), bufs[r], i, want)
							}
						}
					}
				}
			}
		}
	})
}

// TestAllGather: out[i] is filled with i, flat and list forms, and
// AllGatherV with rank i contributing i+c elements; Bruck's algorithm (the
// default for these sizes) and the ring (RingThreshold 1, no slots).
func TestAllGather(t *testing.T) {
	for _, algo := range []string{"bruck", "ring"} {
		t.Run(algo, func(t *testing.T) {
			opts := Options{}
			if algo == "ring" {
				// The ring from every size, and no group segment: over
				// shm, 3 and 4 ranks would take its slots in rounds.
				opts.RingThreshold, opts.FlatThreshold = 1, -1
			}
			testAllGather(t, opts)
		})
	}
}

func testAllGather(t *testing.T, opts Options) {
	forEachGroup(t, opts, func(t *testing.T, g *group) {
		n := len(g.engines)
		for _, c := range []int{0, 1, 5001} {
			for _, list := range []bool{false, true} {
				for _, v := range []bool{false, true} {
					counts := make([]int, n)
					total := 0
					for i := range n {
						counts[i] = c
						if v {
							counts[i] = c + i
						}
						total += counts[i]
					}
					outs := make([][]comm.Buffer, n)
					ins := make([]comm.Buffer, n)
					for r := range n {
						ins[r] = comm.NewHostBuffer(comm.Int32, counts[r])
						for i := range counts[r] {
							setF(ins[r], i, float64(r))
						}
						if list {
							for i := range n {
								outs[r] = append(outs[r], comm.NewHostBuffer(comm.Int32, counts[i]))
							}
						} else {
							outs[r] = []comm.Buffer{comm.NewHostBuffer(comm.Int32, total)}
						}
					}
					g.mustRun("allgather", func(r int, fp fpFunc) *comm.Op {
						op := &comm.Op{FP: fp(comm.OpAllGather, comm.Int32, counts[r], -1, comm.ReduceOp{}), Type: comm.OpAllGather, In: []comm.Buffer{ins[r]}, Out: outs[r]}
						if v {
							op.Type, op.FP.Op, op.RecvCounts = comm.OpAllGatherV, comm.OpAllGatherV, counts
							op.FP.Count = int64(total)
						}
						return op
					})
					for r := range n {
						for i := range n {
							blk := comm.Chunk(outs[r], i, counts, c)
							for k := range blk.Len() {
								if got := getF(blk, k); got != float64(i) {
									t.Fatalf("allgather c=%d list=%v v=%v: rank %d block %d elem %d = %v", c, list, v, r, i, k, got)
								}
							}
						}
					}
				}
			}
		}
	})
}

// TestReduceScatter: int64 arange(2n) on every rank gives arange(2r,
// 2r+2)·n; flat and list input; V form with uneven counts.
func TestReduceScatter(t *testing.T) {
	forEachGroup(t, Options{}, func(t *testing.T, g *group) {
		n := len(g.engines)
		for _, list := range []bool{false, true} {
			for _, v := range []bool{false, true} {
				counts := make([]int, n)
				total := 0
				for i := range n {
					counts[i] = 2
					if v {
						counts[i] = i + 1
					}
					total += counts[i]
				}
				ins := make([][]comm.Buffer, n)
				outs := make([]comm.Buffer, n)
				for r := range n {
					flat := comm.NewHostBuffer(comm.Int64, total)
					for i := range total {
						setF(flat, i, float64(i))
					}
					if list {
						for i := range n {
							b := comm.NewHostBuffer(comm.Int64, counts[i])
							comm.CopyBuffer(b, comm.Chunk([]comm.Buffer{flat}, i, counts, 0))
							ins[r] = append(ins[r], b)
						}
					} else {
						ins[r] = []comm.Buffer{flat}
					}
					outs[r] = comm.NewHostBuffer(comm.Int64, counts[r])
				}
				g.mustRun("reducescatter", func(r int, fp fpFunc) *comm.Op {
					op := &comm.Op{FP: fp(comm.OpReduceScatter, comm.Int64, counts[r], -1, comm.Sum), Type: comm.OpReduceScatter, Reduce: comm.Sum, In: ins[r], Out: []comm.Buffer{outs[r]}}
					if v {
						op.Type, op.FP.Op, op.RecvCounts = comm.OpReduceScatterV, comm.OpReduceScatterV, counts
						op.FP.Count = int64(total)
					}
					return op
				})
				for r := range n {
					off := 0
					for i := range r {
						off += counts[i]
					}
					for k := range counts[r] {
						if got, want := getF(outs[r], k), float64((off+k)*n); got != want {
							t.Fatalf("reducescatter list=%v v=%v: rank %d elem %d = %v, want %v", list, v, r, k, got, want)
						}
					}
					// The input is left unchanged.
					for i := range n {
						blk := comm.Chunk(ins[r], i, counts, 2)
						for k := range blk.Len() {
							if getF(blk, k) == 0 && k+i > 0 {
								t.Fatalf("reducescatter modified its input")
							}
						}
					}
				}
			}
		}
	})
}

// TestAllToAll: equal split (row i filled with i), unequal splits, and the
// list form.
func TestAllToAll(t *testing.T) {
	forEachGroup(t, Options{}, func(t *testing.T, g *group) {
		n := len(g.engines)
		for _, mode := range []string{"equal", "unequal", "list"} {
			ins := make([][]comm.Buffer, n)
			outs := make([][]comm.Buffer, n)
			sc := make([][]int, n)
			rc := make([][]int, n)
			// rank s sends cnt(s, d) elements to rank d, each = s*1000+d.
			cnt := func(s, d int) int {
				if mode == "equal" {
					return 3
				}
				return (s+2*d)%3 + 1
			}
			for r := range n {
				for i := range n {
					sc[r] = append(sc[r], cnt(r, i))
					rc[r] = append(rc[r], cnt(i, r))
				}
				if mode == "list" {
					for i := range n {
						b := comm.NewHostBuffer(comm.Float64, sc[r][i])
						for k := range b.Len() {
							setF(b, k, float64(r*1000+i))
						}
						ins[r] = append(ins[r], b)
						outs[r] = append(outs[r], comm.NewHostBuffer(comm.Float64, rc[r][i]))
					}
					continue
				}
				st, rt := 0, 0
				for i := range n {
					st += sc[r][i]
					rt += rc[r][i]
				}
				in := comm.NewHostBuffer(comm.Float64, st)
				off := 0
				for i := range n {
					for k := range sc[r][i] {
						setF(in, off+k, float64(r*1000+i))
					}
					off += sc[r][i]
				}
				ins[r] = []comm.Buffer{in}
				outs[r] = []comm.Buffer{comm.NewHostBuffer(comm.Float64, rt)}
			}
			g.mustRun("alltoall "+mode, func(r int, fp fpFunc) *comm.Op {
				return &comm.Op{FP: fp(comm.OpAllToAll, comm.Float64, 0, -1, comm.ReduceOp{}), Type: comm.OpAllToAll,
					In: ins[r], Out: outs[r], SendCounts: sc[r], RecvCounts: rc[r]}
			})
			for r := range n {
				for i := range n {
					blk := comm.Chunk(outs[r], i, rc[r], 0)
					if blk.Len() != cnt(i, r) {
						t.Fatalf("alltoall %s: block size", mode)
					}
					for k := range blk.Len() {
						if got, want := getF(blk, k), float64(i*1000+r); got != want {
							t.Fatalf("alltoall %s: rank %d block %d elem %d = %v, want %v", mode, r, i, k, got, want)
						}
					}
				}
			}
		}
	})
}

// TestGatherScatter from every root, flat and list forms.
func TestGatherScatter(t *testing.T) {
	forEachGroup(t, Options{}, func(t *testing.T, g *group) {
		n := len(g.engines)
		const c = 33
		for root := range n {
			for _, list := range []bool{false, true} {
				mk := func() []comm.Buffer {
					if list {
						var bs []comm.Buffer
						for range n {
							bs = append(bs, comm.NewHostBuffer(comm.Int8, c))
						}
						return bs
					}
					return []comm.Buffer{comm.NewHostBuffer(comm.Int8, n*c)}
				}
				// Gather: rank r contributes -r-1.
				ins := make([]comm.Buffer, n)
				var out []comm.Buffer
				for r := range n {
					ins[r] = comm.NewHostBuffer(comm.Int8, c)
					for k := range c {
						setF(ins[r], k, float64(-r-1))
					}
				}
				out = mk()
				g.mustRun("gather", func(r int, fp fpFunc) *comm.Op {
					op := &comm.Op{FP: fp(comm.OpGather, comm.Int8, c, root, comm.ReduceOp{}), Type: comm.OpGather, Root: root, In: []comm.Buffer{ins[r]}}
					if r == root {
						op.Out = out
					}
					return op
				})
				for i := range n {
					blk := comm.Chunk(out, i, nil, c)
					for k := range c {
						if got := getF(blk, k); got != float64(-i-1) {
							t.Fatalf("gather root %d list %v: block %d = %v", root, list, i, got)
						}
					}
				}
				// Scatter: block i holds i+7.
				in := mk()
				for i := range n {
					blk := comm.Chunk(in, i, nil, c)
					for k := range c {
						setF(blk, k, float64(i+7))
					}
				}
				outs := make([]comm.Buffer, n)
				for r := range n {
					outs[r] = comm.NewHostBuffer(comm.Int8, c)
				}
				g.mustRun("scatter", func(r int, fp fpFunc) *comm.Op {
					op := &comm.Op{FP: fp(comm.OpScatter, comm.Int8, c, root, comm.ReduceOp{}), Type: comm.OpScatter, Root: root, Out: []comm.Buffer{outs[r]}}
					if r == root {
						op.In = in
					}
					return op
				})
				for r := range n {
					for k := range c {
						if got := getF(outs[r], k); got != float64(r+7) {
							t.Fatalf("scatter root %d list %v: rank %d = %v", root, list, r, got)
						}
					}
				}
			}
		}
	})
}

// Output layouts of checkAllGather.
const (
	outOne     = "one buffer"
	outList    = "a buffer per rank"
	outInPlace = "in place" // the input is the rank's block of one output buffer
)

// checkAllGather runs an allgather of c int32 per rank on g (rank r's
// element i is 1000·r+i) with the output laid out as layout says, and
// checks every rank's output.
func checkAllGather(t *testing.T, g *group, c int, layout string) {
	t.Helper()
	list := layout == outList
	n := len(g.engines)
	ins := make([]comm.Buffer, n)
	outs := make([][]comm.Buffer, n)
	for r := range n {
		if list {
			for range n {
				outs[r] = append(outs[r], comm.NewHostBuffer(comm.Int32, c))
			}
		} else {
			outs[r] = []comm.Buffer{comm.NewHostBuffer(comm.Int32, n*c)}
		}
		ins[r] = comm.NewHostBuffer(comm.Int32, c)
		if layout == outInPlace {
			ins[r] = comm.Chunk(outs[r], r, nil, c)
		}
		for i := range c {
			setF(ins[r], i, float64(1000*r+i))
		}
	}
	g.mustRun("allgather", func(r int, fp fpFunc) *comm.Op {
		return &comm.Op{FP: fp(comm.OpAllGather, comm.Int32, c, -1, comm.ReduceOp{}), Type: comm.OpAllGather, In: []comm.Buffer{ins[r]}, Out: outs[r]}
	})
	for r := range n {
		for i := range n {
			blk := comm.Chunk(outs[r], i, nil, c)
			for k := range c {
				if got := getF(blk, k); got != float64(1000*i+k) {
					t.Fatalf("c=%d, %s: rank %d block %d elem %d = %v, want %d", c, layout, r, i, k, got, 1000*i+k)
				}
			}
		}
	}
}
