package cpu

import (
	"context"
	"os"
	"syscall"
	"testing"
	"unsafe"

	"github.com/ranktree/ranktree/comm"
)

// TestSmallAllReduceAllocs asserts the CPU engine's steady-state small-op
// path allocates nothing per op (issue 15: an escaping header in recvColl
// allocated on every poll while a rank waited, and RecvReduce allocated a
// closure per message). Two ranks run as goroutines of this process over
// each transport; the Ops and Works are made before the measurement, so
// what is counted is the engine: Launch, the queue, the progress
// goroutine, the algorithm, the links and the completion. Every op's
// result is checked as well.
func TestSmallAllReduceAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	for _, tr := range []string{TransportSHM, TransportTCP, TransportInmem} {
		t.Run(tr, func(t *testing.T) {
			const n, runs, count = 2, 200, 16
			g := newGroup(t, n, Options{Transport: tr})
			bufs := make([]comm.Buffer, n)
			for r := range n {
				bufs[r] = comm.NewHostBuffer(comm.Float32, count)
			}
			// Every run of AllocsPerRun (plus its warm-up run) and the
			// warm-up ops below take one prepared op per rank.
			const warm = 50
			total := warm + runs + 1
			ops := make([][]*comm.Op, n)
			works := make([][]*comm.Work, n)
			for r := range n {
				ops[r] = make([]*comm.Op, total)
				works[r] = make([]*comm.Work, total)
				for i := range total {
					fp := comm.Fingerprint{Group: comm.GroupHash(g.name), Seq: uint64(i + 1), Op: comm.OpAllReduce,
						DType: comm.Float32, Count: count, Root: -1, RedOp: comm.RedSum}
					ops[r][i] = &comm.Op{FP: fp, Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{bufs[r]}}
					works[r][i] = comm.NewWork(comm.OpAllReduce)
				}
			}
			ctx := context.Background()
			// Rank 1 runs on its own goroutine, paced by a channel of
			// struct{} (no allocation per send).
			next, done := make(chan int), make(chan error)
			go func() {
				for i := range next {
					setF(bufs[1], 0, 2)
					g.engines[1].Launch(ops[1][i], works[1][i])
					done <- works[1][i].Wait(ctx)
				}
			}()
			defer close(next)
			i := 0
			step := func() {
				setF(bufs[0], 0, 1)
				next <- i
				g.engines[0].Launch(ops[0][i], works[0][i])
				if err := works[0][i].Wait(ctx); err != nil {
					t.Fatalf("op %d rank 0: %v", i, err)
				}
				if err := <-done; err != nil {
					t.Fatalf("op %d rank 1: %v", i, err)
				}
				if got := getF(bufs[0], 0); got != 3 {
					t.Fatalf("op %d: rank 0 has %v, want 1+2", i, got)
				}
				i++
			}
			for range warm {
				step()
			}
			if a := testing.AllocsPerRun(runs, step); a != 0 {
				t.Errorf("%s: %v allocations per 64 B allreduce (both ranks' engines), want 0", tr, a)
			}
		})
	}
}

// TestShmRingsPrefaulted checks that a mapped segment's pages are all
// resident as soon as it is mapped (MAP_POPULATE), on the creating and the
// opening side: first-touch page faults on the rings were the 1-8 KiB
// latency cliff of issue 15.
func TestShmRingsPrefaulted(t *testing.T) {
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm")
	}
	const ring = 1 << 20
	a, err := createShm("/dev/shm", ring)
	if err != nil {
		t.Fatal(err)
	}
	defer a.unmap()
	defer a.unlink()
	b, err := openShm(a.path, ring, false)
	if err != nil {
		t.Fatal(err)
	}
	defer b.unmap()
	for name, s := range map[string]*shmLink{"creator": a, "opener": b} {
		pages := (len(s.mem) + os.Getpagesize() - 1) / os.Getpagesize()
		vec := make([]byte, pages)
		if _, _, errno := syscall.Syscall(syscall.SYS_MINCORE, uintptr(unsafe.Pointer(&s.mem[0])), uintptr(len(s.mem)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
			t.Fatalf("mincore: %v", errno)
		}
		missing := 0
		for _, v := range vec {
			if v&1 == 0 {
				missing++
			}
		}
		if missing != 0 {
			t.Errorf("%s: %d of %d pages of a fresh segment are not resident", name, missing, pages)
		}
	}
}
