package cpu

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// earlyGroup launches ops on a test group's engines one rank at a time,
// as the communicator actor does (identity set, seq in the promise).
type earlyGroup struct {
	*group
	t *testing.T
}

// launch launches op (its seq set to seq) on rank r and returns its Work
// and how many ops Launch published early on r (Engine.earlyOps) with it.
func (g earlyGroup) launch(r int, seq uint64, op *comm.Op) (*comm.Work, uint64) {
	op.FP.Group, op.FP.Seq = comm.GroupHash(g.name), seq
	op.SetIdentity(op.FP.Group, op.FP.Epoch, op.FP.Seq)
	p := comm.NewPromise(op.Type)
	p.SetSeq(seq)
	e := g.engines[r]
	before := e.earlyOps.Load()
	e.Launch(op, p)
	return p.Work(), e.earlyOps.Load() - before
}

func allReduceOp(buf comm.Buffer, red comm.ReduceOp) *comm.Op {
	return &comm.Op{FP: comm.Fingerprint{Op: comm.OpAllReduce, DType: buf.DType(), Count: int64(buf.Len()), Root: -1, RedOp: red.Type()},
		Type: comm.OpAllReduce, Reduce: red, Root: -1, Peer: -1, In: []comm.Buffer{buf}}
}

func broadcastOp(buf comm.Buffer, root int) *comm.Op {
	return &comm.Op{FP: comm.Fingerprint{Op: comm.OpBroadcast, DType: buf.DType(), Count: int64(buf.Len()), Root: int32(root)},
		Type: comm.OpBroadcast, Root: root, Peer: -1, In: []comm.Buffer{buf}}
}

// TestPublishEarly checks that Launch publishes a one-step op's slot when
// the stream is idle (issue 15: a late rank's peers go on before it has
// run its launch path), that it does so exactly for the ops whose run
// starts with that publication, and that the ops' results are unchanged:
// allreduces and broadcasts among 2 and 3 ranks over shm and inmem. With
// one P nothing runs an op between its Launch and the check, so an op
// published at Launch is told from one published by its run.
func TestPublishEarly(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for _, tr := range []string{TransportSHM, TransportInmem} {
		for _, n := range []int{2, 3} {
			t.Run(fmt.Sprintf("%s/%d", tr, n), func(t *testing.T) {
				g := earlyGroup{newGroup(t, n, Options{Transport: tr, FlatThreshold: 1 << 10}), t}
				seq := uint64(0)
				// step launches mk(r) on every rank in turn, checks that
				// Launch published early on each exactly when early, then
				// waits for every rank.
				step := func(what string, early bool, mk func(r int) *comm.Op) {
					t.Helper()
					seq++
					ws := make([]*comm.Work, n)
					for r := range n {
						var k uint64
						ws[r], k = g.launch(r, seq, mk(r))
						if (k == 1) != early {
							t.Fatalf("%s: rank %d published %d ops early at Launch, want early=%v", what, r, k, early)
						}
					}
					waitAll(t, what, ws)
				}
				bufs := make([]comm.Buffer, n)
				fill := func(count int) {
					for r := range n {
						bufs[r] = comm.NewHostBuffer(comm.Float32, count)
						for i := range count {
							setF(bufs[r], i, float64(10*r+i))
						}
					}
				}
				sum := func(i int) float64 { return float64(10*n*(n-1)/2 + n*i) }

				fill(5)
				step("one-step allreduce", true, func(r int) *comm.Op { return allReduceOp(bufs[r], comm.Sum) })
				for r := range n {
					for i := range 5 {
						mustEqAt(t, fmt.Sprintf("allreduce, rank %d", r), bufs[r], i, sum(i))
					}
				}
				fill(5)
				step("PreMulSum allreduce (scaled before it is published)", false, func(r int) *comm.Op {
					return allReduceOp(bufs[r], comm.PreMulSum(2))
				})
				for r := range n {
					mustEqAt(t, fmt.Sprintf("PreMulSum, rank %d", r), bufs[r], 1, 2*sum(1))
				}
				fill(1024) // 4 KiB, above FlatThreshold
				step("allreduce above FlatThreshold", false, func(r int) *comm.Op { return allReduceOp(bufs[r], comm.Sum) })
				mustEqAt(t, "large allreduce, rank 0", bufs[0], 1000, sum(1000))
				for root := range n {
					fill(7)
					step(fmt.Sprintf("one-step broadcast from %d", root), true, func(r int) *comm.Op { return broadcastOp(bufs[r], root) })
					for r := range n {
						mustEqAt(t, fmt.Sprintf("broadcast from %d, rank %d", root, r), bufs[r], 6, float64(10*root+6))
					}
				}

				// Behind a queued op, an op is not published early: rank 0
				// launches two, then the others do.
				fill(3)
				ws := make([][2]*comm.Work, n)
				for r := range n {
					var k0, k1 uint64
					ws[r][0], k0 = g.launch(r, seq+1, allReduceOp(bufs[r], comm.Sum))
					ws[r][1], k1 = g.launch(r, seq+2, allReduceOp(bufs[r], comm.Sum))
					if k0 != 1 || k1 != 0 {
						t.Fatalf("rank %d: the head published early %d, the op behind it %d; want 1 and 0", r, k0, k1)
					}
				}
				for r := range n {
					waitAll(t, "two queued allreduces", ws[r][:])
				}
				mustEqAt(t, "two allreduces, rank 1", bufs[1], 2, float64(n)*sum(2))
			})
		}
	}
}

// TestPublishEarlyAbort: an op published early on a rank that then aborts
// fails there, and a peer that launches it after the abort returned fails
// with a *comm.RemoteAbortError naming that rank, although the aborted
// rank's slot is there to read (docs/semantics.md, "An abort is final").
// The same over a mismatch: an allreduce published early against a
// broadcast of as many bytes fails on both ranks.
func TestPublishEarlyAbort(t *testing.T) {
	for _, tr := range []string{TransportSHM, TransportInmem} {
		t.Run(tr, func(t *testing.T) {
			g := earlyGroup{newGroup(t, 2, Options{Transport: tr}), t}
			b := []comm.Buffer{comm.NewHostBuffer(comm.Float32, 2), comm.NewHostBuffer(comm.Float32, 2)}
			w0, k := g.launch(0, 1, allReduceOp(b[0], comm.Sum))
			if k != 1 {
				t.Fatalf("rank 0 published %d ops early, want 1", k)
			}
			g.engines[0].Abort(errors.New("test abort"))
			w1, _ := g.launch(1, 1, allReduceOp(b[1], comm.Sum))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := w0.Wait(ctx); !errors.Is(err, comm.ErrAborted) {
				t.Fatalf("rank 0 (aborted): %v, want ErrAborted", err)
			}
			var ra *comm.RemoteAbortError
			if err := w1.Wait(ctx); !errors.As(err, &ra) || ra.Rank != 0 {
				t.Fatalf("rank 1 after rank 0 aborted: %v, want a *RemoteAbortError naming rank 0", err)
			}
		})
		t.Run(tr+"/mismatch", func(t *testing.T) {
			g := earlyGroup{newGroup(t, 2, Options{Transport: tr}), t}
			b := []comm.Buffer{comm.NewHostBuffer(comm.Float32, 2), comm.NewHostBuffer(comm.Float32, 2)}
			w0, k0 := g.launch(0, 1, allReduceOp(b[0], comm.Sum))
			w1, k1 := g.launch(1, 1, broadcastOp(b[1], 1))
			if k0 != 1 || k1 != 1 {
				t.Fatalf("published early: rank 0 %d, rank 1 %d; want 1 and 1", k0, k1)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for r, w := range []*comm.Work{w0, w1} {
				if err := w.Wait(ctx); !errors.Is(err, comm.ErrMismatch) {
					t.Fatalf("rank %d: %v, want ErrMismatch", r, err)
				}
			}
		})
	}
}

// waitAll waits for every Work of ws (60 s at most) and fails the test
// on any error.
func waitAll(t *testing.T, what string, ws []*comm.Work) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for r, w := range ws {
		if err := w.Wait(ctx); err != nil {
			t.Fatalf("%s: rank %d: %v", what, r, err)
		}
	}
}
