package cpu

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu/transport"
)

// meshRun drives algorithms over a transport.InmemMesh: no engine, store
// or rendezvous; one goroutine per rank only while an op runs (an
// algorithm that receives needs its peers running).
type meshRun struct {
	t   testing.TB
	im  *transport.InmemMesh
	seq uint64
}

// newMeshRun connects n ranks in memory with small rings (so that larger
// messages wrap and wait for room) and, for 2..8 ranks, one-step slots of
// slotBytes.
func newMeshRun(t testing.TB, n, ringBytes, slotBytes int) *meshRun {
	t.Helper()
	im, err := transport.NewInmemMesh(n, transport.InmemMeshOptions{RingBytes: ringBytes, SlotBytes: slotBytes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(im.Close)
	return &meshRun{t: t, im: im}
}

// op runs f(r, rank r's mesh) on every rank as the next op (fingerprint of
// typ over count int64 elements, reduction red), flushes as the engine
// does, and returns each rank's error. A run that does not finish within
// a minute closes the mesh and fails the test.
func (mr *meshRun) op(typ comm.OpType, count, root int, red comm.ReduceOp, f func(r int, m *transport.Mesh) error) []error {
	mr.t.Helper()
	mr.seq++
	fp := comm.Fingerprint{Group: comm.GroupHash("inmem"), Seq: mr.seq, Op: typ, DType: comm.Int64, Count: int64(count), Root: int32(root), RedOp: red.Type()}
	mr.im.Begin(transport.OpCtx{FP: fp, DType: comm.Int64, Red: red.ForDType(comm.Int64)})
	return mr.each(f)
}

// each runs f on every rank concurrently and flushes each rank's sends.
func (mr *meshRun) each(f func(r int, m *transport.Mesh) error) []error {
	mr.t.Helper()
	n := mr.im.Size()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			m := mr.im.Rank(r)
			if errs[r] = f(r, m); errs[r] == nil {
				errs[r] = m.Flush()
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		mr.im.Close()
		<-done
		mr.t.Fatalf("op %d did not finish on every rank: %v", mr.seq, errs)
	}
	return errs
}

// must fails the test if any rank failed.
func (mr *meshRun) must(what string, errs []error) {
	mr.t.Helper()
	for r, err := range errs {
		if err != nil {
			mr.t.Fatalf("%s: rank %d: %v", what, r, err)
		}
	}
}

// mval is rank r's element i: unique per rank and element, so that a
// block delivered to the wrong place or reduced twice shows.
func mval(r, i int) int64 { return int64(r+1)*1_000_003 + int64(i)*7 + 1 }

// msum is the closed form of the sum of mval(r, i) over n ranks.
func msum(n, i int) int64 { return 1_000_003*int64(n*(n+1)/2) + int64(n)*(int64(i)*7+1) }

// mvals is rank r's elements lo..hi-1.
func mvals(r, lo, hi int) []int64 {
	v := make([]int64, hi-lo)
	for i := range v {
		v[i] = mval(r, lo+i)
	}
	return v
}

// i64bytes views v as bytes.
func i64bytes(v []int64) []byte {
	if len(v) == 0 {
		return []byte{}
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), len(v)*8)
}

// splitBlocks cuts v into n blocks of nearly equal element counts.
func splitBlocks(v []int64, n int) [][]byte {
	b := make([][]byte, n)
	for i := range n {
		lo, hi := split(len(v), n, i)
		b[i] = i64bytes(v[lo:hi])
	}
	return b
}

// meshCounts are the element counts of the in-memory matrix: empty, one
// element, and odd sizes below, around and above the 4 KiB rings.
var meshCounts = []int{0, 1, 3, 7, 33, 513, 1001}

// TestAlgorithmsInmemMatrix runs every algorithm (the message-based ones
// over transport.Mesh, the one-step ones over its Slots) on world sizes
// 1..5 and the counts of meshCounts over the in-memory mesh, one mesh per
// world size for the whole sequence of ops, and checks every rank's result
// against its closed form (Gloo's test/allreduce_test.cc pattern).
func TestAlgorithmsInmemMatrix(t *testing.T) {
	for n := 1; n <= 5; n++ {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			mr := newMeshRun(t, n, 4<<10, n*1001*8)
			for _, count := range meshCounts {
				for _, tc := range meshCases {
					if tc.flat && n == 1 {
						continue // no group segment for one rank
					}
					tc.run(t, mr, n, count, fmt.Sprintf("%s count=%d", tc.name, count))
				}
			}
		})
	}
}

// meshCase is one algorithm of the matrix: run executes it on every rank
// and checks the result.
type meshCase struct {
	name string
	flat bool // one-step: needs the group segment's slots
	run  func(t *testing.T, mr *meshRun, n, count int, what string)
}

var meshCases = []meshCase{
	{"allreduce_ring", false, func(t *testing.T, mr *meshRun, n, count int, what string) {
		checkMeshAllReduce(t, mr, n, count, what, func(m *transport.Mesh, buf []int64) error {
			return allreduceRing(m, splitBlocks(buf, n), 8, ringOpts{chunk: 0})
		})
	}},
	// Chunked: chunks of 5 elements (blocks are not multiples of it) and
	// of 1000 bytes (125 elements: the 4 KiB rings hold a chunk's message
	// and the forward behind it, or wrap mid-message), the latter
	// receiving its finished blocks with RecvStreaming.
	{"allreduce_ring_chunk40", false, func(t *testing.T, mr *meshRun, n, count int, what string) {
		checkMeshAllReduce(t, mr, n, count, what, func(m *transport.Mesh, buf []int64) error {
			return allreduceRing(m, splitBlocks(buf, n), 8, ringOpts{chunk: 40})
		})
	}},
	{"allreduce_ring_chunk1000", false, func(t *testing.T, mr *meshRun, n, count int, what string) {
		checkMeshAllReduce(t, mr, n, count, what, func(m *transport.Mesh, buf []int64) error {
			return allreduceRing(m, splitBlocks(buf, n), 8, ringOpts{chunk: 1000, streamOut: true})
		})
	}},
	{"allreduce_recdoubling", false, func(t *testing.T, mr *meshRun, n, count int, what string) {
		checkMeshAllReduce(t, mr, n, count, what, func(m *transport.Mesh, buf []int64) error {
			return allreduceRecDoubling(m, i64bytes(buf), make([]byte, 8*len(buf)))
		})
	}},
	{"allreduce_flat", true, func(t *testing.T, mr *meshRun, n, count int, what string) {
		checkMeshAllReduce(t, mr, n, count, what, func(m *transport.Mesh, buf []int64) error {
			return allreduceFlat(m, i64bytes(buf))
		})
	}},
	{"reduce_tree", false, checkReduceTree},
	{"broadcast_tree", false, func(t *testing.T, mr *meshRun, n, count int, what string) {
		checkMeshBroadcast(t, mr, n, count, what, broadcastTree)
	}},
	{"broadcast_scatterallgather", false, func(t *testing.T, mr *meshRun, n, count int, what string) {
		checkMeshBroadcast(t, mr, n, count, what, broadcastScatterAllGather)
	}},
	{"broadcast_chain", false, func(t *testing.T, mr *meshRun, n, count int, what string) {
		checkMeshBroadcast(t, mr, n, count, what, broadcastChain)
	}},
	{"broadcast_flat", true, func(t *testing.T, mr *meshRun, n, count int, what string) {
		checkMeshBroadcast(t, mr, n, count, what, func(m Mesh, buf []byte, root int) error {
			return broadcastFlat(m.(Slots), buf, root)
		})
	}},
	{"allgather_ring", false, func(t *testing.T, mr *meshRun, n, count int, what string) {
		checkMeshAllGather(t, mr, n, count, false, what, func(m *transport.Mesh, blocks [][]byte) error {
			return ringAllGather(m, blocks, 0)
		})
	}},
	{"allgather_bruck", false, func(t *testing.T, mr *meshRun, n, count int, what string) {
		// Uneven blocks (AllGatherV): block i has count+i elements.
		checkMeshAllGather(t, mr, n, count, true, what, func(m *transport.Mesh, blocks [][]byte) error {
			return allgatherBruck(m, blocks, make([]byte, bruckScratch(blocks)))
		})
	}},
	{"allgather_flat", true, func(t *testing.T, mr *meshRun, n, count int, what string) {
		checkMeshAllGather(t, mr, n, count, false, what, func(m *transport.Mesh, blocks [][]byte) error {
			return allgatherFlat(m, blocks, n*1001*8)
		})
	}},
	// In rounds of 40 bytes (5 elements; blocks are not multiples of it):
	// up to 201 one-step rounds per op through the double-buffered slots.
	{"allgather_flat_rounds40", true, func(t *testing.T, mr *meshRun, n, count int, what string) {
		checkMeshAllGather(t, mr, n, count, false, what, func(m *transport.Mesh, blocks [][]byte) error {
			return allgatherFlat(m, blocks, 40)
		})
	}},
	{"reducescatter_ring", false, checkReduceScatterRing},
	{"reducescatter_flat", true, checkReduceScatterFlat},
	{"gather_linear", false, checkMeshGather},
	{"scatter_linear", false, checkMeshScatter},
	{"alltoall_pairwise", false, checkMeshAllToAll},
	{"barrier_dissemination", false, func(t *testing.T, mr *meshRun, n, count int, what string) {
		mr.must(what, mr.op(comm.OpBarrier, 0, -1, comm.ReduceOp{}, func(_ int, m *transport.Mesh) error {
			return barrierDissemination(m)
		}))
	}},
	{"agree_dissemination", false, func(t *testing.T, mr *meshRun, n, count int, what string) {
		mr.must(what, mr.op(comm.OpBroadcast, count, 0, comm.ReduceOp{}, func(_ int, m *transport.Mesh) error {
			return agreeDissemination(m)
		}))
	}},
}

// checkMeshAllReduce: every rank ends with the closed-form sum.
func checkMeshAllReduce(t *testing.T, mr *meshRun, n, count int, what string, algo func(m *transport.Mesh, buf []int64) error) {
	bufs := make([][]int64, n)
	mr.must(what, mr.op(comm.OpAllReduce, count, -1, comm.Sum, func(r int, m *transport.Mesh) error {
		bufs[r] = mvals(r, 0, count)
		return algo(m, bufs[r])
	}))
	for r := range n {
		for i, v := range bufs[r] {
			if v != msum(n, i) {
				t.Fatalf("%s n=%d: rank %d element %d = %d, want %d", what, n, r, i, v, msum(n, i))
			}
		}
	}
}

// checkReduceTree: for every root, the root ends with the sum.
func checkReduceTree(t *testing.T, mr *meshRun, n, count int, what string) {
	for root := range n {
		bufs := make([][]int64, n)
		mr.must(what, mr.op(comm.OpReduce, count, root, comm.Sum, func(r int, m *transport.Mesh) error {
			bufs[r] = mvals(r, 0, count)
			return reduceTree(m, i64bytes(bufs[r]), root)
		}))
		for i, v := range bufs[root] {
			if v != msum(n, i) {
				t.Fatalf("%s n=%d root=%d: element %d = %d, want %d", what, n, root, i, v, msum(n, i))
			}
		}
	}
}

// checkMeshBroadcast: for every root, every rank ends with the root's values.
func checkMeshBroadcast(t *testing.T, mr *meshRun, n, count int, what string, algo func(m Mesh, buf []byte, root int) error) {
	for root := range n {
		bufs := make([][]int64, n)
		mr.must(what, mr.op(comm.OpBroadcast, count, root, comm.ReduceOp{}, func(r int, m *transport.Mesh) error {
			bufs[r] = make([]int64, count)
			if r == root {
				bufs[r] = mvals(r, 0, count)
			}
			return algo(m, i64bytes(bufs[r]), root)
		}))
		want := mvals(root, 0, count)
		for r := range n {
			if !slices.Equal(bufs[r], want) {
				t.Fatalf("%s n=%d root=%d: rank %d got %v, want %v", what, n, root, r, head(bufs[r]), head(want))
			}
		}
	}
}

// checkMeshAllGather: every rank ends with every rank's block (of count
// elements, or count+i for block i when uneven).
func checkMeshAllGather(t *testing.T, mr *meshRun, n, count int, uneven bool, what string, algo func(m *transport.Mesh, blocks [][]byte) error) {
	size := func(i int) int {
		if uneven {
			return count + i
		}
		return count
	}
	outs := make([][][]int64, n)
	mr.must(what, mr.op(comm.OpAllGather, count, -1, comm.ReduceOp{}, func(r int, m *transport.Mesh) error {
		outs[r] = make([][]int64, n)
		blocks := make([][]byte, n)
		for i := range n {
			outs[r][i] = make([]int64, size(i))
			blocks[i] = i64bytes(outs[r][i])
		}
		copy(outs[r][r], mvals(r, 0, size(r)))
		return algo(m, blocks)
	}))
	for r := range n {
		for i := range n {
			if want := mvals(i, 0, size(i)); !slices.Equal(outs[r][i], want) {
				t.Fatalf("%s n=%d: rank %d block %d = %v, want %v", what, n, r, i, head(outs[r][i]), head(want))
			}
		}
	}
}

// checkReduceScatterRing: rank r's block of the whole (count·n elements,
// split in n) ends as the sum.
func checkReduceScatterRing(t *testing.T, mr *meshRun, n, count int, what string) {
	bufs := make([][]int64, n)
	mr.must(what, mr.op(comm.OpReduceScatter, count, -1, comm.Sum, func(r int, m *transport.Mesh) error {
		bufs[r] = mvals(r, 0, count*n)
		return ringReduceScatter(m, splitBlocks(bufs[r], n), 0)
	}))
	for r := range n {
		lo, hi := split(count*n, n, r)
		for i := lo; i < hi; i++ {
			if bufs[r][i] != msum(n, i) {
				t.Fatalf("%s n=%d: rank %d element %d = %d, want %d", what, n, r, i, bufs[r][i], msum(n, i))
			}
		}
	}
}

// checkReduceScatterFlat: rank r's out is block r of the sum.
func checkReduceScatterFlat(t *testing.T, mr *meshRun, n, count int, what string) {
	outs := make([][]int64, n)
	mr.must(what, mr.op(comm.OpReduceScatter, count, -1, comm.Sum, func(r int, m *transport.Mesh) error {
		outs[r] = make([]int64, count)
		return reduceScatterFlat(m, i64bytes(mvals(r, 0, count*n)), i64bytes(outs[r]))
	}))
	for r := range n {
		for j, v := range outs[r] {
			if want := msum(n, r*count+j); v != want {
				t.Fatalf("%s n=%d: rank %d element %d = %d, want %d", what, n, r, j, v, want)
			}
		}
	}
}

// checkMeshGather: for every root, the root ends with every rank's values.
func checkMeshGather(t *testing.T, mr *meshRun, n, count int, what string) {
	for root := range n {
		out := make([][]int64, n)
		mr.must(what, mr.op(comm.OpGather, count, root, comm.ReduceOp{}, func(r int, m *transport.Mesh) error {
			var blocks [][]byte
			if r == root {
				blocks = make([][]byte, n)
				for i := range n {
					out[i] = make([]int64, count)
					blocks[i] = i64bytes(out[i])
				}
			}
			return gatherLinear(m, i64bytes(mvals(r, 0, count)), blocks, root)
		}))
		for i := range n {
			if want := mvals(i, 0, count); !slices.Equal(out[i], want) {
				t.Fatalf("%s n=%d root=%d: block %d = %v, want %v", what, n, root, i, head(out[i]), head(want))
			}
		}
	}
}

// checkMeshScatter: for every root, rank i ends with the root's block i.
func checkMeshScatter(t *testing.T, mr *meshRun, n, count int, what string) {
	for root := range n {
		outs := make([][]int64, n)
		mr.must(what, mr.op(comm.OpScatter, count, root, comm.ReduceOp{}, func(r int, m *transport.Mesh) error {
			var blocks [][]byte
			if r == root {
				blocks = splitBlocks(mvals(root, 0, count*n), n)
			}
			lo, hi := split(count*n, n, r)
			outs[r] = make([]int64, hi-lo)
			return scatterLinear(m, blocks, i64bytes(outs[r]), root)
		}))
		for r := range n {
			lo, hi := split(count*n, n, r)
			if want := mvals(root, lo, hi); !slices.Equal(outs[r], want) {
				t.Fatalf("%s n=%d root=%d: rank %d got %v, want %v", what, n, root, r, head(outs[r]), head(want))
			}
		}
	}
}

// checkMeshAllToAll: rank r's block j is rank j's block r; block sizes
// differ per pair (count + j + r elements).
func checkMeshAllToAll(t *testing.T, mr *meshRun, n, count int, what string) {
	blk := func(from, to int) []int64 { return mvals(from, 10_000*to, 10_000*to+count+from+to) }
	recvs := make([][][]int64, n)
	mr.must(what, mr.op(comm.OpAllToAll, count, -1, comm.ReduceOp{}, func(r int, m *transport.Mesh) error {
		send, recv := make([][]byte, n), make([][]byte, n)
		recvs[r] = make([][]int64, n)
		for j := range n {
			send[j] = i64bytes(blk(r, j))
			recvs[r][j] = make([]int64, count+j+r)
			recv[j] = i64bytes(recvs[r][j])
		}
		return alltoallPairwise(m, send, recv)
	}))
	for r := range n {
		for j := range n {
			if want := blk(j, r); !slices.Equal(recvs[r][j], want) {
				t.Fatalf("%s n=%d: rank %d block from %d = %v, want %v", what, n, r, j, head(recvs[r][j]), head(want))
			}
		}
	}
}

// head is the start of v, for failure messages.
func head(v []int64) []int64 { return v[:min(len(v), 8)] }

// TestInmemMeshMismatch: ranks that run ops with different fingerprints
// over the in-memory mesh fail with a *comm.MismatchError naming both
// fingerprints, on every rank, instead of hanging.
func TestInmemMeshMismatch(t *testing.T) {
	mr := newMeshRun(t, 2, 4<<10, 0)
	mr.seq++
	for r := range 2 {
		fp := comm.Fingerprint{Group: comm.GroupHash("inmem"), Seq: 1, Op: comm.OpBarrier, Count: int64(r)}
		mr.im.Rank(r).Begin(transport.OpCtx{FP: fp, DType: comm.Int64})
	}
	errs := mr.each(func(_ int, m *transport.Mesh) error { return barrierDissemination(m) })
	for r, err := range errs {
		var me *comm.MismatchError
		if !errors.As(err, &me) || me.Local.Count != int64(r) || me.Remote.Count != int64(1-r) {
			t.Fatalf("rank %d: %v, want a mismatch between counts %d and %d", r, err, r, 1-r)
		}
	}
}

// TestInmemMeshClose: closing the mesh ends a receive that waits for a
// peer that never sends.
func TestInmemMeshClose(t *testing.T) {
	im, err := transport.NewInmemMesh(2, transport.InmemMeshOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := im.Rank(0)
	m.Begin(transport.OpCtx{FP: comm.Fingerprint{Seq: 1, Op: comm.OpBroadcast}, DType: comm.Int64})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := make(chan error, 1)
	go func() { got <- m.Recv(1, 0, make([]byte, 8)) }()
	time.Sleep(10 * time.Millisecond)
	im.Close()
	select {
	case err := <-got:
		if !errors.Is(err, transport.ErrStopped) {
			t.Fatalf("Recv after Close: %v, want ErrStopped", err)
		}
	case <-ctx.Done():
		t.Fatal("Recv still blocked after Close")
	}
	if _, err := transport.NewInmemMesh(0, transport.InmemMeshOptions{}); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Fatalf("NewInmemMesh(0): %v, want ErrInvalidArgument", err)
	}
}
