package cpu

import (
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ranktree/ranktree/comm"
)

// TestBroadcastCMA: among 3 ranks over shm and inmem (the engines of one
// process read each other's memory), a broadcast inside the window goes
// through the single copy (broadcastCMA), bit-exact on every rank for
// every root, at the window's edges and an odd size between; the engine
// takes it inside the window only, not among 2 or 4 ranks, and not with
// SingleCopyMin negative. The cross-process case is TestMultiProcess.
func TestBroadcastCMA(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	const n = 3
	for _, tr := range []string{TransportSHM, TransportInmem} {
		t.Run(tr, func(t *testing.T) {
			g := newGroup(t, n, Options{Transport: tr})
			e := g.engines[0]
			w := broadcastCMAWindow(n)
			if e.bcastCMA != w || !e.useBroadcastCMA(w[0]) || !e.useBroadcastCMA(w[1]) ||
				e.useBroadcastCMA(w[0]-4) || e.useBroadcastCMA(w[1]+4) || !e.useSlots(w[0]) {
				t.Fatalf("window %v: the engine would not take the single copy inside it only", e.bcastCMA)
			}
			for _, bytes := range []int{w[0], 3*w[0] + 4*1001, w[1]} {
				for root := range n {
					checkBroadcast(t, g, rng, comm.Float32, bytes/4, root, "single-copy broadcast")
				}
			}
			for r, e := range g.engines {
				if e.cmaOff {
					t.Fatalf("rank %d switched the single copy off after successful reads", r)
				}
			}
		})
	}
	for _, n := range []int{2, 4} {
		if e := newGroup(t, n, Options{Transport: TransportSHM}).engines[0]; e.useBroadcastCMA(256 << 10) {
			t.Fatalf("single-copy broadcast among %d ranks", n)
		}
	}
	if e := newGroup(t, 3, Options{Transport: TransportSHM, SingleCopyMin: -1}).engines[0]; e.useBroadcastCMA(256 << 10) {
		t.Fatal("single-copy broadcast with SingleCopyMin -1")
	}
}

// TestBroadcastCMAFallback: when one rank's read fails (the kernel
// refuses, or the pid names another process than the root's), every
// rank still ends with the root's bytes, moved another way, and every
// rank stops using the single copy; the next broadcast runs without it.
// The root's failure (it reads nothing) cannot happen: a non-root fails.
func TestBroadcastCMAFallback(t *testing.T) {
	other := uint64(42) // a token that is not the root's
	rng := rand.New(rand.NewPCG(9, 10))
	for name, read := range map[string]func(int, []unix.Iovec, []unix.RemoteIovec, uint) (int, error){
		"refused": func(int, []unix.Iovec, []unix.RemoteIovec, uint) (int, error) { return 0, syscall.EPERM },
		"other process": func(pid int, local []unix.Iovec, remote []unix.RemoteIovec, flags uint) (int, error) {
			remote[0].Base = uintptr(unsafe.Pointer(&other))
			return unix.ProcessVMReadv(pid, local, remote, flags)
		},
	} {
		for _, failing := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/rank%d", name, failing), func(t *testing.T) {
				g := newGroup(t, 3, Options{Transport: TransportSHM})
				g.engines[failing].cma.read = read
				count := 100_003
				checkBroadcast(t, g, rng, comm.Float32, count, 0, "broadcast after a failed single copy")
				for r, e := range g.engines {
					if !e.cmaOff || e.useBroadcastCMA(count*4) {
						t.Fatalf("rank %d still takes the single copy after rank %d's read failed", r, failing)
					}
				}
				checkBroadcast(t, g, rng, comm.Float32, count, 1, "broadcast with the single copy off")
			})
		}
	}
}

// TestBroadcastCMAMismatch: ranks that launch different ops at one seq
// where some take the single-copy broadcast all fail with ErrMismatch
// within a second: another count, another root, a rank that has the
// single copy off (as with another SingleCopyMin), and an allreduce of
// the same size.
func TestBroadcastCMAMismatch(t *testing.T) {
	const n = 3
	count := broadcastCMAWindow(n)[0]/4 + 1000
	bc := oneOp{comm.OpBroadcast, count, 0}
	cases := []struct {
		name string
		odd  oneOp // what rank 1 launches; the others launch bc
		off  bool  // rank 1 has the single copy off
	}{
		{"count", oneOp{comm.OpBroadcast, count + 4096, 0}, false},
		{"root", oneOp{comm.OpBroadcast, count, 2}, false},
		{"single copy off", bc, true},
		{"allreduce", oneOp{comm.OpAllReduce, count, -1}, false},
	}
	for _, tr := range []string{TransportSHM, TransportInmem} {
		for _, c := range cases {
			t.Run(tr+"/"+c.name, func(t *testing.T) {
				g := newGroup(t, n, Options{Transport: tr})
				g.engines[1].cmaOff = c.off
				expectOddMismatch(t, g, bc, c.odd)
			})
		}
	}
}
