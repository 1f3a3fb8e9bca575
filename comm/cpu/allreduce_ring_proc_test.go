package cpu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
)

const envRingProc = "RANKTREE_CPU_RINGPROC" // "mode,rank,size,transport,dir" in a rank process

// ringProcCounts are the float32 counts of the multi-process ring test:
// just above RingThreshold (256 KiB) with an odd count (with 3 ranks it
// goes through the slots' rounds instead, allreduce_slots.go), blocks that are
// not a whole number of chunks, a count whose blocks differ by one
// element, and one above ringStreamOutMin (non-temporal stores) and
// ringChunkMin 1 MiB chunks (the smaller ones are cut into chunks only
// with mode "smallring"). With mode "smallring" the rings are 64 KiB, so the
// chunks are 16 KiB and every message wraps the ring many times.
var ringProcCounts = []int{65536 + 3, 1<<20 + 7, 2_500_001, ringStreamOutMin/4 + 5}

// ringProcVal is rank r's element i: unique per rank, varying along the
// buffer (so that a chunk delivered to the wrong place shows), and an
// integer small enough that every float32 sum is exact.
func ringProcVal(r, i int) float32 { return float32((r+1)*1000 + i%997) }

// ringProcSum is the closed form of the sum of ringProcVal over n ranks.
func ringProcSum(n, i int) float32 { return float32(1000*n*(n+1)/2 + n*(i%997)) }

// TestRingProcRank is the body of a rank process of
// TestMultiProcessRingAllReduce; it does nothing in a normal test run.
func TestRingProcRank(t *testing.T) {
	mode, tr, cfg := rankSpec(t, envRingProc, "ringproc", "TestMultiProcessRingAllReduce")
	rank, size := cfg.Rank, cfg.Size
	opts := Options{Transport: tr}
	if mode == "smallring" {
		opts.ShmRingBytes = 64 << 10
	}
	e, err := New(context.Background(), cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if tr == TransportSHM {
		fmt.Printf("RANK-CHUNK %d\n", e.ringOptions(1<<30).chunk)
	}
	seq := uint64(0)
	allreduce := func(data []float32) *comm.Work {
		seq++
		fp := comm.Fingerprint{Group: comm.GroupHash("ringproc"), Seq: seq, Op: comm.OpAllReduce, DType: comm.Float32, Count: int64(len(data)), Root: -1, RedOp: comm.RedSum}
		return launch(e, &comm.Op{FP: fp, Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{comm.HostBuffer(data)}})
	}
	wait := func(w *comm.Work) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return w.Wait(ctx)
	}
	if mode == "death" {
		// Rank 1 dies while the ranks are in a 64 MiB allreduce (or
		// about to start it): rank 0 must fail with a TransportError
		// naming it, neither hang nor succeed.
		data := make([]float32, 16<<20)
		w := allreduce(data)
		if rank == 1 {
			time.Sleep(2 * time.Millisecond)
			os.Exit(7)
		}
		var te *comm.TransportError
		if err := wait(w); !errors.As(err, &te) || te.Peer != 1 {
			t.Fatalf("rank %d: got %v, want a TransportError naming rank 1", rank, err)
		}
		fmt.Println("RANK-RESULT transport-error")
		return
	}
	for _, count := range ringProcCounts {
		data := make([]float32, count)
		for i := range data {
			data[i] = ringProcVal(rank, i)
		}
		if err := wait(allreduce(data)); err != nil {
			t.Fatalf("rank %d, count %d: %v", rank, count, err)
		}
		for i, v := range data {
			if want := ringProcSum(size, i); v != want {
				t.Fatalf("rank %d, count %d: element %d is %v, want %v", rank, count, i, v, want)
			}
		}
	}
	fmt.Println("RANK-RESULT ok")
}

// TestMultiProcessRingAllReduce runs the ring allreduce (allreduce_ring.go)
// between real processes: over shm in 1 MiB chunks whose forwards stream
// from one process's ring to the next (transport/mesh_forward.go), over shm
// with 64 KiB rings (16 KiB chunks, every message wrapping), and over tcp
// in whole blocks, with 2 and 3 ranks; every element is checked against
// its closed form. A rank that dies mid-allreduce gives its peer a
// *comm.TransportError.
func TestMultiProcessRingAllReduce(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	for _, c := range []struct {
		mode, tr  string
		size      int
		wantChunk string
	}{
		{"ok", TransportSHM, 2, "RANK-CHUNK 1048576"},
		{"ok", TransportSHM, 3, "RANK-CHUNK 1048576"},
		{"smallring", TransportSHM, 2, "RANK-CHUNK 16384"},
		{"smallring", TransportSHM, 3, "RANK-CHUNK 16384"},
		{"ok", TransportTCP, 2, ""},
		{"death", TransportSHM, 2, "RANK-CHUNK 1048576"},
	} {
		t.Run(fmt.Sprintf("%s/%s/n=%d", c.mode, c.tr, c.size), func(t *testing.T) {
			dir := t.TempDir()
			cmds := make([]*exec.Cmd, c.size)
			outs := make([]*strings.Builder, c.size)
			for r := range c.size {
				cmd := exec.Command(os.Args[0], "-test.run=^TestRingProcRank$", "-test.count=1")
				cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%d,%d,%s,%s", envRingProc, c.mode, r, c.size, c.tr, dir))
				outs[r] = &strings.Builder{}
				cmd.Stdout, cmd.Stderr = outs[r], outs[r]
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				cmds[r] = cmd
			}
			for r, cmd := range cmds {
				err := cmd.Wait()
				want := 0
				if c.mode == "death" && r == 1 {
					want = 7
				}
				if code := cmd.ProcessState.ExitCode(); code != want {
					t.Fatalf("rank %d exited %d (%v), want %d; output:\n%s", r, code, err, want, outs[r])
				}
			}
			want := "RANK-RESULT ok"
			if c.mode == "death" {
				want = "RANK-RESULT transport-error"
			}
			for r := range c.size {
				if c.mode == "death" && r == 1 {
					continue
				}
				if !strings.Contains(outs[r].String(), want) || !strings.Contains(outs[r].String(), c.wantChunk) {
					t.Fatalf("rank %d output lacks %q or %q:\n%s", r, want, c.wantChunk, outs[r])
				}
			}
		})
	}
}
