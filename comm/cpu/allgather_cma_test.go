package cpu

import (
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ranktree/ranktree/comm"
)

// TestAllGatherCMA: two ranks over shm and inmem (the engines of one
// process: each reads the other's block in its own memory) gather through
// cross-memory attach from SingleCopyMin, into one buffer, a list, or in
// place, at odd sizes, with their own block copied in one copy (beyond
// cachedCopyMax) or in pieces; the engine takes it only for two ranks,
// from SingleCopyMin, and not when it is disabled. The cross-process case
// is TestMultiProcess.
func TestAllGatherCMA(t *testing.T) {
	for _, tr := range []string{TransportSHM, TransportInmem} {
		t.Run(tr, func(t *testing.T) {
			g := newGroup(t, 2, Options{Transport: tr, SingleCopyMin: 4096})
			for _, c := range []int{512, 1001, 300_001} {
				if !g.engines[0].useCMA(2 * c * 4) {
					t.Fatalf("%d int32 per rank: the engine would not take the single copy", c)
				}
				for _, layout := range []string{outOne, outList, outInPlace} {
					checkAllGather(t, g, c, layout)
				}
			}
			if g.engines[0].useCMA(4092) || g.engines[0].cmaOff || g.engines[1].cmaOff {
				t.Fatal("single copy below SingleCopyMin, or switched off after successful reads")
			}
		})
	}
	if e := newGroup(t, 3, Options{Transport: TransportSHM, SingleCopyMin: 4096}).engines[0]; e.useCMA(64 << 20) {
		t.Fatal("single copy among 3 ranks")
	}
	if e := newGroup(t, 2, Options{Transport: TransportSHM, SingleCopyMin: -1}).engines[0]; e.useCMA(64 << 20) {
		t.Fatal("single copy with SingleCopyMin -1")
	}
	if e := newGroup(t, 2, Options{Transport: TransportSHM}).engines[0]; e.opts.SingleCopyMin != singleCopyDefault || e.useCMA(singleCopyDefault-8) || !e.useCMA(singleCopyDefault) {
		t.Fatalf("default SingleCopyMin %d, want %d", e.opts.SingleCopyMin, singleCopyDefault)
	}
}

// TestAllGatherCMAReadsOutput: a rank reads its peer's block from the
// peer's input, or, where the blocks are below a huge page and the output
// is not (1 MiB blocks, 2 MiB gathered: only the output has huge pages),
// from the peer's own block of its output, where the peer copied it
// first; the data arrives either way.
func TestAllGatherCMAReadsOutput(t *testing.T) {
	g := newGroup(t, 2, Options{Transport: TransportSHM, SingleCopyMin: 4096})
	var from []uintptr
	cma := &g.engines[0].cma
	read := cma.read
	cma.read = func(pid int, local []unix.Iovec, remote []unix.RemoteIovec, flags uint) (int, error) {
		for _, r := range remote {
			from = append(from, r.Base)
		}
		return read(pid, local, remote, flags)
	}
	addr := func(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
	for _, c := range []int{4099, comm.HugePageBytes / 8} {
		from = from[:0]
		ins := []comm.Buffer{comm.NewHostBuffer(comm.Int32, c), comm.NewHostBuffer(comm.Int32, c)}
		outs := []comm.Buffer{comm.NewHostBuffer(comm.Int32, 2*c), comm.NewHostBuffer(comm.Int32, 2*c)}
		for r := range 2 {
			for i := range c {
				setF(ins[r], i, float64(1000*r+i))
			}
		}
		g.mustRun("allgather", func(r int, fp fpFunc) *comm.Op {
			return &comm.Op{FP: fp(comm.OpAllGather, comm.Int32, c, -1, comm.ReduceOp{}), Type: comm.OpAllGather, In: []comm.Buffer{ins[r]}, Out: []comm.Buffer{outs[r]}}
		})
		want, not := addr(ins[1].Bytes()), addr(comm.Chunk([]comm.Buffer{outs[1]}, 1, nil, c).Bytes())
		if blockFromOutput(4*c, 2) {
			want, not = not, want
		}
		if !slices.Contains(from, want) || slices.Contains(from, not) {
			t.Fatalf("%d int32 a rank: rank 0 read from %#x; want %#x (rank 1's input at %#x, its output block at %#x)",
				c, from, want, addr(ins[1].Bytes()), addr(comm.Chunk([]comm.Buffer{outs[1]}, 1, nil, c).Bytes()))
		}
		for i := range c {
			if got := getF(outs[0], c+i); got != float64(1000+i) {
				t.Fatalf("%d int32 a rank: rank 0's block 1 elem %d = %v, want %d", c, i, got, 1000+i)
			}
		}
	}
	if blockFromOutput(4*4099, 2) || !blockFromOutput(comm.HugePageBytes/2, 2) || blockFromOutput(comm.HugePageBytes, 2) {
		t.Fatal("blockFromOutput: want the output only for blocks below a huge page whose output is not")
	}
}

// TestAllGatherCMAFallback: when one rank's reads fail (the kernel
// refuses, or the pid names another process than the peer's, as in
// another pid namespace), both ranks still gather right, through the
// rings, and both stop using the single copy; the next allgather runs
// through the rings from the start.
func TestAllGatherCMAFallback(t *testing.T) {
	other := uint64(42) // a token that is not the peer's
	for name, read := range map[string]func(int, []unix.Iovec, []unix.RemoteIovec, uint) (int, error){
		"refused": func(int, []unix.Iovec, []unix.RemoteIovec, uint) (int, error) { return 0, syscall.EPERM },
		"other process": func(pid int, local []unix.Iovec, remote []unix.RemoteIovec, flags uint) (int, error) {
			remote[0].Base = uintptr(unsafe.Pointer(&other))
			return unix.ProcessVMReadv(pid, local, remote, flags)
		},
	} {
		for failing := range 2 {
			t.Run(fmt.Sprintf("%s/rank%d", name, failing), func(t *testing.T) {
				g := newGroup(t, 2, Options{Transport: TransportSHM, SingleCopyMin: 4096})
				g.engines[failing].cma.read = read
				checkAllGather(t, g, 4099, outOne)
				for r, e := range g.engines {
					if !e.cmaOff || e.useCMA(1<<20) {
						t.Fatalf("rank %d still takes the single copy after rank %d's reads failed", r, failing)
					}
				}
				checkAllGather(t, g, 4099, outList)
			})
		}
	}
}

// TestAllGatherCMAMismatch: ranks that gather different counts through
// the single copy, or the same count, one through it and one through the
// ring (as with another SingleCopyMin), fail on both ranks with
// ErrMismatch within a second.
func TestAllGatherCMAMismatch(t *testing.T) {
	for name, counts := range map[string][2]int{"counts": {5000, 6000}, "single copy against ring": {5000, 5000}} {
		t.Run(name, func(t *testing.T) {
			g := newGroup(t, 2, Options{Transport: TransportSHM, SingleCopyMin: 16 << 10})
			// Rank 1 takes the ring, as with another SingleCopyMin.
			g.engines[1].cmaOff = counts[0] == counts[1]
			works := make([]*comm.Work, 2)
			start := time.Now()
			for r, e := range g.engines {
				c := counts[r]
				fp := comm.Fingerprint{Group: comm.GroupHash(g.name), Seq: 1, Op: comm.OpAllGather, DType: comm.Int32, Count: int64(c), Root: -1}
				works[r] = launch(e, &comm.Op{FP: fp, Type: comm.OpAllGather, In: []comm.Buffer{comm.NewHostBuffer(comm.Int32, c)},
					Out: []comm.Buffer{comm.NewHostBuffer(comm.Int32, 2*c)}})
			}
			expectMismatch(t, works, start)
		})
	}
}
