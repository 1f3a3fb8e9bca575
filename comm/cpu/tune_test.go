package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ranktree/ranktree/comm"
)

// probeBoth runs the two-rank probe (tuneSingleCopy) on both engines of g
// at once, as New does on both ranks, and returns their errors. g's
// engines have run no op, so their meshes are idle.
func probeBoth(g *group) [2]error {
	var errs [2]error
	var wg sync.WaitGroup
	for r, e := range g.engines {
		e.opts.probe = true
		wg.Go(func() { errs[r] = e.tuneSingleCopy() })
	}
	wg.Wait()
	return errs
}

// checkTwoRankTransfers runs broadcasts (from each root) and allgathers
// of sizes around probeMin, probeBcastBytes and probeMidMin and up to
// 1 MiB on a two-rank group and checks every result.
func checkTwoRankTransfers(t *testing.T, g *group, rng *rand.Rand) {
	t.Helper()
	for _, nbytes := range []int{probeMin - 4, probeMin, probeBcastBytes, 300_004, probeMidMin, 1 << 20} {
		for root := range 2 {
			checkBroadcast(t, g, rng, comm.Float32, nbytes/4, root, fmt.Sprintf("broadcast of %d bytes", nbytes))
		}
		checkAllGather(t, g, nbytes/8, outOne)
	}
}

// TestProbeSingleCopy: the two-rank probe ends with the same verdict on
// both ranks (the windows of the single copy equal), and the group's
// broadcasts and allgathers are right after it; a probe whose single copy
// is slow (a read that sleeps) picks the rings on both; a verdict for the
// single copy makes both take it from probeMin (broadcasts) and
// probeMidMin (allgathers), with the right results; a refused read in the probe turns the single
// copy off on both ranks, and the ops after it are right.
func TestProbeSingleCopy(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 1))
	same := func(t *testing.T, g *group) {
		t.Helper()
		a, b := g.engines[0], g.engines[1]
		if a.bcastCMA != b.bcastCMA || a.opts.SingleCopyMin != b.opts.SingleCopyMin || a.cmaOff != b.cmaOff {
			t.Fatalf("ranks disagree after the probe: broadcast window %v / %v, SingleCopyMin %d / %d, off %v / %v",
				a.bcastCMA, b.bcastCMA, a.opts.SingleCopyMin, b.opts.SingleCopyMin, a.cmaOff, b.cmaOff)
		}
	}
	t.Run("agree", func(t *testing.T) {
		g := newGroup(t, 2, Options{Transport: TransportSHM})
		if errs := probeBoth(g); errs[0] != nil || errs[1] != nil {
			t.Fatalf("probe: %v", errs)
		}
		same(t, g)
		checkTwoRankTransfers(t, g, rng)
	})
	t.Run("slow single copy", func(t *testing.T) {
		g := newGroup(t, 2, Options{Transport: TransportSHM})
		g.engines[1].cma.read = func(pid int, l []unix.Iovec, r []unix.RemoteIovec, f uint) (int, error) {
			time.Sleep(2 * time.Millisecond)
			return unix.ProcessVMReadv(pid, l, r, f)
		}
		if errs := probeBoth(g); errs[0] != nil || errs[1] != nil {
			t.Fatalf("probe: %v", errs)
		}
		same(t, g)
		for r, e := range g.engines {
			if e.useBroadcastCMA(1<<20) || e.useCMA(1<<20) || e.useBroadcastCMA(probeBcastBytes) {
				t.Fatalf("rank %d takes the single copy after a probe that found it slower", r)
			}
		}
	})
	t.Run("single copy taken", func(t *testing.T) {
		g := newGroup(t, 2, Options{Transport: TransportSHM})
		for _, e := range g.engines {
			e.applyProbe(probeVerdicts{low: true, mid: true})
			if !e.useBroadcastCMA(probeMin) || e.useBroadcastCMA(probeMin-1) || !e.useCMA(probeMidMin) || e.useCMA(probeMidMin-1) {
				t.Fatalf("after verdicts for the single copy: broadcast at %d %v, at %d %v; allgather at %d %v, at %d %v",
					probeMin, e.useBroadcastCMA(probeMin), probeMin-1, e.useBroadcastCMA(probeMin-1),
					probeMidMin, e.useCMA(probeMidMin), probeMidMin-1, e.useCMA(probeMidMin-1))
			}
			if !e.useBroadcastCMA(math.MaxInt32) {
				t.Fatal("the single copy's broadcast window stops below 2 GiB")
			}
		}
		checkTwoRankTransfers(t, g, rng)
		for r, e := range g.engines {
			if e.cmaOff {
				t.Fatalf("rank %d turned the single copy off", r)
			}
		}
	})
	t.Run("verdicts by size", func(t *testing.T) {
		// The sizes that take the single copy after each set of verdicts:
		// bcast for broadcasts, gather for allgathers (from
		// SingleCopyMin's default, 2 MiB, the allgather always does).
		const mid, huge = probeMidMin, comm.HugePageBytes
		for _, c := range []struct {
			v             probeVerdicts
			bcast, gather map[int]bool
		}{
			{probeVerdicts{low: true},
				map[int]bool{probeMin - 1: false, probeMin: true, mid - 1: true, mid: false, huge - 1: false, huge: true},
				map[int]bool{probeMin: false, probeBcastBytes: false, mid - 1: false, mid: false, huge - 1: false, huge: true}},
			{probeVerdicts{mid: true},
				map[int]bool{probeMin: false, mid - 1: false, mid: true, huge - 1: true, huge: true},
				map[int]bool{probeMin: false, mid - 1: false, mid: true, huge - 1: true, huge: true}},
			{probeVerdicts{low: true, mid: true},
				map[int]bool{probeMin - 1: false, probeMin: true, mid: true, huge: true},
				map[int]bool{probeMin: false, probeBcastBytes: false, mid - 1: false, mid: true, huge: true}},
			{probeVerdicts{},
				map[int]bool{probeMin: false, mid: false, huge - 1: false},
				map[int]bool{probeMin: false, probeBcastBytes: false, mid: false, huge - 1: false, huge: true}},
		} {
			g := newGroup(t, 2, Options{Transport: TransportSHM})
			for _, e := range g.engines {
				e.applyProbe(c.v)
				for n, want := range c.bcast {
					if e.useBroadcastCMA(n) != want {
						t.Fatalf("verdicts %+v: a broadcast of %d bytes takes the single copy %v, want %v", c.v, n, e.useBroadcastCMA(n), want)
					}
				}
				for n, want := range c.gather {
					if e.useCMA(n) != want {
						t.Fatalf("verdicts %+v: an allgather of %d bytes takes the single copy %v, want %v", c.v, n, e.useCMA(n), want)
					}
				}
			}
			checkTwoRankTransfers(t, g, rng)
		}
	})
	t.Run("refused", func(t *testing.T) {
		g := newGroup(t, 2, Options{Transport: TransportSHM})
		g.engines[1].cma.read = func(int, []unix.Iovec, []unix.RemoteIovec, uint) (int, error) { return 0, syscall.EPERM }
		if errs := probeBoth(g); errs[0] != nil || errs[1] != nil {
			t.Fatalf("probe with a refused read: %v", errs)
		}
		same(t, g)
		if !g.engines[0].cmaOff {
			t.Fatal("the single copy is still on after the probe's read was refused")
		}
		checkTwoRankTransfers(t, g, rng)
	})
}

// TestProbeWanted: only a group of two ranks with a group segment whose
// SingleCopyMin took its default probes; New does not probe groups of
// ranks in one process (tests, inmem), so their windows stay the
// defaults.
func TestProbeWanted(t *testing.T) {
	for _, c := range []struct {
		n    int
		opts Options
		auto bool
	}{
		{2, Options{Transport: TransportSHM}, true},
		{2, Options{Transport: TransportSHM, SingleCopyMin: 1 << 20}, false},
		{2, Options{Transport: TransportSHM, SingleCopyMin: -1}, false},
	} {
		g := newGroup(t, c.n, c.opts)
		for _, e := range g.engines {
			if e.opts.singleCopyAuto != c.auto {
				t.Fatalf("SingleCopyMin %d: auto %v, want %v", c.opts.SingleCopyMin, e.opts.singleCopyAuto, c.auto)
			}
			if e.probeWanted() {
				t.Fatalf("SingleCopyMin %d: a group in one process probes", c.opts.SingleCopyMin)
			}
			if e.bcastCMA != broadcastCMAWindow(2) {
				t.Fatalf("broadcast window %v without a probe, want %v", e.bcastCMA, broadcastCMAWindow(2))
			}
		}
	}
}

// TestProbeRunAhead repeats the probe in one process with small and
// default rings; every probe must end without an error. It did not
// reproduce the false mismatch of the probe's first version (all its ops
// at seq 0: a reader that found its ring empty, then saw the root's next
// barrier slot), which needs a preemption between the two checks;
// TestHonestyMultiProcess under the race detector caught that one.
func TestProbeRunAhead(t *testing.T) {
	for _, ring := range []int{64 << 10, 1 << 20} {
		g := newGroup(t, 2, Options{Transport: TransportSHM, ShmRingBytes: ring})
		for i := range 20 {
			if errs := probeBoth(g); errs[0] != nil || errs[1] != nil {
				t.Fatalf("ring %d, probe %d: %v", ring, i, errs)
			}
		}
	}
}

// TestProbeVerdict: the probe compares the median op of each kind, so
// that one stalled op does not decide.
func TestProbeVerdict(t *testing.T) {
	us := func(v ...int) []time.Duration {
		d := make([]time.Duration, len(v))
		for i, x := range v {
			d[i] = time.Duration(x) * time.Microsecond
		}
		return d
	}
	for _, c := range []struct {
		name          string
		rings, single []time.Duration
		want          bool
	}{
		{"single faster", us(20, 21, 22, 23), us(10, 11, 12, 13), true},
		{"rings faster", us(10, 11, 12, 13), us(20, 21, 22, 23), false},
		{"one stalled ring op", us(1000, 11, 12, 13), us(15, 16, 17, 18), false},
		{"one stalled single-copy op", us(15, 16, 17, 18), us(1000, 11, 12, 13), true},
		{"level", us(10, 10, 10), us(10, 10, 10), false},
		{"no samples", nil, us(1), false},
	} {
		if got := probeVerdict(c.rings, c.single); got != c.want {
			t.Errorf("%s: probeVerdict = %v, want %v", c.name, got, c.want)
		}
	}
}
