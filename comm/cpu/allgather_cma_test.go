package cpu

import (
	"fmt"
	"sync/atomic"
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

// TestAllGatherCMAFallback: when one rank's single copy fails (the
// kernel refuses the token's read or the write, or the pid names another
// process than the peer's, as in another pid namespace), both ranks still
// gather right, through the rings, and both stop using the single copy;
// the next allgather runs through the rings from the start. A rank that
// could not verify its peer's token writes nothing into that process.
func TestAllGatherCMAFallback(t *testing.T) {
	other := uint64(42) // a token that is not the peer's
	refused := func(int, []unix.Iovec, []unix.RemoteIovec, uint) (int, error) { return 0, syscall.EPERM }
	for name, c := range map[string]struct {
		read, write cmaCall
		writes      bool // the failing rank gets as far as the write
	}{
		"read refused": {read: refused},
		"other process": {read: func(pid int, local []unix.Iovec, remote []unix.RemoteIovec, flags uint) (int, error) {
			remote[0].Base = uintptr(unsafe.Pointer(&other))
			return unix.ProcessVMReadv(pid, local, remote, flags)
		}},
		"write refused": {write: refused, writes: true},
	} {
		for failing := range 2 {
			t.Run(fmt.Sprintf("%s/rank%d", name, failing), func(t *testing.T) {
				g := newGroup(t, 2, Options{Transport: TransportSHM, SingleCopyMin: 4096})
				cma := &g.engines[failing].cma
				if c.read != nil {
					cma.read = c.read
				}
				var writes atomic.Int32
				write := cma.write
				if c.write != nil {
					write = c.write
				}
				cma.write = func(pid int, local []unix.Iovec, remote []unix.RemoteIovec, flags uint) (int, error) {
					writes.Add(1)
					return write(pid, local, remote, flags)
				}
				checkAllGather(t, g, 4099, outOne)
				if got := writes.Load() > 0; got != c.writes {
					t.Fatalf("rank %d wrote into its peer: %v, want %v", failing, got, c.writes)
				}
				for r, e := range g.engines {
					if !e.cmaOff || e.useCMA(1<<20) {
						t.Fatalf("rank %d still takes the single copy after rank %d's failed", r, failing)
					}
				}
				checkAllGather(t, g, 4099, outList)
			})
		}
	}
}

// TestCMAVerifyOnce: a rank reads its peer's token back once, before its
// first write, not at every op.
func TestCMAVerifyOnce(t *testing.T) {
	g := newGroup(t, 2, Options{Transport: TransportSHM, SingleCopyMin: 4096})
	var reads atomic.Int32
	cma := &g.engines[0].cma
	read := cma.read
	cma.read = func(pid int, local []unix.Iovec, remote []unix.RemoteIovec, flags uint) (int, error) {
		reads.Add(1)
		return read(pid, local, remote, flags)
	}
	for range 3 {
		checkAllGather(t, g, 4099, outOne)
	}
	if n := reads.Load(); n != 1 || g.engines[0].cmaOff {
		t.Fatalf("rank 0 read its peer's token %d times in 3 allgathers (single copy off: %v), want once", n, g.engines[0].cmaOff)
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
