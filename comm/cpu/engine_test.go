package cpu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu/transport"
	"github.com/ranktree/ranktree/store"
)

// launch launches op on e as the communicator actor would: op's children
// get its identity first (comm.Op.SetIdentity).
func launch(e *Engine, op *comm.Op) *comm.Work {
	op.SetIdentity(op.FP.Group, op.FP.Epoch, op.FP.Seq)
	p := comm.NewPromise(op.Type)
	e.Launch(op, p)
	return p.Work()
}

func waitT(t *testing.T, w *comm.Work, d time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	err := w.Wait(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("work did not complete within %v", d)
	}
	return err
}

// TestBarrier: the last rank enters 400 ms late; no rank leaves before it
// arrived.
func TestBarrier(t *testing.T) {
	forEachGroup(t, Options{}, func(t *testing.T, g *group) {
		n := len(g.engines)
		g.seq++
		fp := comm.Fingerprint{Group: comm.GroupHash(g.name), Seq: g.seq, Op: comm.OpBarrier, Root: -1}
		works := make([]*comm.Work, n)
		for r := 0; r < n-1; r++ {
			works[r] = launch(g.engines[r], &comm.Op{FP: fp, Type: comm.OpBarrier})
		}
		time.Sleep(400 * time.Millisecond)
		entered := time.Now()
		works[n-1] = launch(g.engines[n-1], &comm.Op{FP: fp, Type: comm.OpBarrier})
		for r, w := range works {
			if err := waitT(t, w, 30*time.Second); err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
			if done := w.Timings().Completed; done.Before(entered) {
				t.Fatalf("rank %d left the barrier %v before the last rank entered", r, entered.Sub(done))
			}
		}
	})
}

func p2pOp(g *group, t comm.OpType, peer, tag int, buf comm.Buffer) *comm.Op {
	op := &comm.Op{FP: comm.Fingerprint{Group: comm.GroupHash(g.name), Op: t, DType: buf.DType(), Count: int64(buf.Len()), Root: int32(peer)},
		Type: t, Peer: peer, Tag: tag}
	if t == comm.OpSend {
		op.In = []comm.Buffer{buf}
	} else {
		op.Out = []comm.Buffer{buf}
	}
	return op
}

func filled(dt comm.DType, count int, v float64) comm.Buffer {
	b := comm.NewHostBuffer(dt, count)
	for i := range count {
		setF(b, i, v)
	}
	return b
}

// TestSendRecv: tags matched out of order (small and large payloads),
// any-source receives that report the sender, and a send queued while the
// receiver runs a collective.
func TestSendRecv(t *testing.T) {
	for _, tr := range testTransports {
		t.Run(tr, func(t *testing.T) {
			g := newGroup(t, 3, Options{Transport: tr, ShmRingBytes: 64 << 10})
			e0, e1, e2 := g.engines[0], g.engines[1], g.engines[2]
			for _, count := range []int{0, 3, 300_001} {
				// Rank 0 sends tag 1 then tag 2; rank 1 receives tag 2 first.
				a, b := filled(comm.Float32, count, 1), filled(comm.Float32, count, 2)
				ra, rb := comm.NewHostBuffer(comm.Float32, count), comm.NewHostBuffer(comm.Float32, count)
				w1 := launch(e0, p2pOp(g, comm.OpSend, 1, 1, a))
				w3 := launch(e1, p2pOp(g, comm.OpRecv, 0, 2, rb))
				w2 := launch(e0, p2pOp(g, comm.OpSend, 1, 2, b))
				w4 := launch(e1, p2pOp(g, comm.OpRecv, 0, 1, ra))
				for i, w := range []*comm.Work{w1, w2, w3, w4} {
					if err := waitT(t, w, 30*time.Second); err != nil {
						t.Fatalf("count %d work %d: %v", count, i, err)
					}
				}
				if !bytes.Equal(ra.Bytes(), a.Bytes()) || !bytes.Equal(rb.Bytes(), b.Bytes()) {
					t.Fatalf("count %d: tags mixed up", count)
				}
				if w3.Source() != 0 {
					t.Fatalf("Source = %d, want 0", w3.Source())
				}
			}
			// Any source: ranks 1 and 2 send their rank to rank 0.
			s1 := launch(e1, p2pOp(g, comm.OpSend, 0, 9, filled(comm.Int64, 4, 1)))
			s2 := launch(e2, p2pOp(g, comm.OpSend, 0, 9, filled(comm.Int64, 4, 2)))
			seen := map[int]bool{}
			for range 2 {
				buf := comm.NewHostBuffer(comm.Int64, 4)
				w := launch(e0, p2pOp(g, comm.OpRecv, comm.AnySource, 9, buf))
				if err := waitT(t, w, 30*time.Second); err != nil {
					t.Fatal(err)
				}
				if src := w.Source(); src < 1 || src > 2 || getF(buf, 3) != float64(src) || seen[src] {
					t.Fatalf("any-source recv: source %d, data %v", src, getF(buf, 3))
				}
				seen[w.Source()] = true
			}
			for _, w := range []*comm.Work{s1, s2} {
				if err := waitT(t, w, 30*time.Second); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestBatchP2P: a coalesced batch where every rank receives before it
// sends in list order still completes (sends are posted first).
func TestBatchP2P(t *testing.T) {
	for _, tr := range testTransports {
		t.Run(tr, func(t *testing.T) {
			const n = 3
			g := newGroup(t, n, Options{Transport: tr, ShmRingBytes: 64 << 10})
			const count = 100_000
			outs := make([]comm.Buffer, n)
			works := make([]*comm.Work, n)
			for r := range n {
				outs[r] = comm.NewHostBuffer(comm.Float64, count)
				recv := p2pOp(g, comm.OpRecv, (r+n-1)%n, 0, outs[r])
				send := p2pOp(g, comm.OpSend, (r+1)%n, 0, filled(comm.Float64, count, float64(r)))
				op := &comm.Op{FP: comm.Fingerprint{Group: comm.GroupHash(g.name), Seq: 1, Op: comm.OpCoalesced, Root: -1}, Type: comm.OpCoalesced,
					Children: []*comm.Op{recv, send}}
				works[r] = launch(g.engines[r], op)
			}
			for r, w := range works {
				if err := waitT(t, w, 30*time.Second); err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
				if got := getF(outs[r], count-1); got != float64((r+n-1)%n) {
					t.Fatalf("rank %d got %v", r, got)
				}
			}
		})
	}
}

// TestBatchP2PSelf: a batch with sends to and receives from the rank
// itself (listed receive first) beside a ring exchange, on every transport
// and 2 to 4 ranks: each self receive gets its paired send's data (same
// tag, list order), no message crosses for them, and a malformed self op
// (no partner) is refused before anything is sent.
func TestBatchP2PSelf(t *testing.T) {
	for _, tr := range testTransports {
		for _, n := range []int{2, 3, 4} {
			t.Run(fmt.Sprintf("%s/n=%d", tr, n), func(t *testing.T) {
				g := newGroup(t, n, Options{Transport: tr, ShmRingBytes: 64 << 10})
				const count = 20_000
				type outs struct{ ring, self1, self2a, self2b comm.Buffer }
				got := make([]outs, n)
				works := make([]*comm.Work, n)
				for r := range n {
					o := outs{comm.NewHostBuffer(comm.Float64, count), comm.NewHostBuffer(comm.Int32, 7),
						comm.NewHostBuffer(comm.Float64, count), comm.NewHostBuffer(comm.Float64, count)}
					got[r] = o
					ch := []*comm.Op{
						p2pOp(g, comm.OpRecv, r, 1, o.self1), // before its send
						p2pOp(g, comm.OpRecv, (r+n-1)%n, 0, o.ring),
						p2pOp(g, comm.OpSend, r, 2, filled(comm.Float64, count, float64(100+r))),
						p2pOp(g, comm.OpSend, r, 1, filled(comm.Int32, 7, float64(10+r))),
						p2pOp(g, comm.OpSend, (r+1)%n, 0, filled(comm.Float64, count, float64(r))),
						p2pOp(g, comm.OpSend, r, 2, filled(comm.Float64, count, float64(200+r))),
						p2pOp(g, comm.OpRecv, r, 2, o.self2a),
						p2pOp(g, comm.OpRecv, r, 2, o.self2b),
					}
					op := &comm.Op{FP: comm.Fingerprint{Group: comm.GroupHash(g.name), Seq: 1, Op: comm.OpCoalesced, Root: -1}, Type: comm.OpCoalesced, Children: ch}
					works[r] = launch(g.engines[r], op)
				}
				for r, w := range works {
					if err := waitT(t, w, 30*time.Second); err != nil {
						t.Fatalf("rank %d: %v", r, err)
					}
					o := got[r]
					checks := []struct {
						name string
						b    comm.Buffer
						want float64
					}{{"ring", o.ring, float64((r + n - 1) % n)}, {"self tag 1", o.self1, float64(10 + r)},
						{"first self tag 2", o.self2a, float64(100 + r)}, {"second self tag 2", o.self2b, float64(200 + r)}}
					for _, c := range checks {
						if a, z := getF(c.b, 0), getF(c.b, c.b.Len()-1); a != c.want || z != c.want {
							t.Errorf("rank %d %s: got %v..%v, want %v", r, c.name, a, z, c.want)
						}
					}
				}
				// A send to self with no receive from self cannot run: the
				// engine reports the malformed op as its own error
				// (ProcessGroup.BatchP2P refuses it before launch).
				bad := &comm.Op{FP: comm.Fingerprint{Group: comm.GroupHash(g.name), Seq: 2, Op: comm.OpCoalesced, Root: -1}, Type: comm.OpCoalesced,
					Children: []*comm.Op{p2pOp(g, comm.OpSend, 0, 4, filled(comm.Float32, 3, 1))}}
				if err := waitT(t, launch(g.engines[0], bad), 10*time.Second); !errors.Is(err, comm.ErrEngine) || !strings.Contains(err.Error(), "no matching self receive") {
					t.Fatalf("unpaired self send: %v, want ErrEngine naming the missing receive", err)
				}
			})
		}
	}
}

// TestCoalescedCollectives runs two allreduces as one Work.
func TestCoalescedCollectives(t *testing.T) {
	g := newGroup(t, 3, Options{Transport: TransportSHM})
	bufs := make([][2]comm.Buffer, 3)
	g.mustRun("coalesced", func(r int, fp fpFunc) *comm.Op {
		bufs[r] = [2]comm.Buffer{filled(comm.Float32, 10, float64(r)), filled(comm.Int32, 1000, 1)}
		var ch []*comm.Op
		for _, b := range bufs[r] {
			ch = append(ch, &comm.Op{FP: comm.Fingerprint{Op: comm.OpAllReduce, DType: b.DType(), Count: int64(b.Len()), Root: -1, RedOp: comm.RedSum},
				Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{b}})
		}
		return &comm.Op{FP: fp(comm.OpCoalesced, 0, 1010, -1, comm.ReduceOp{}), Type: comm.OpCoalesced, Children: ch}
	})
	for r := range 3 {
		if getF(bufs[r][0], 9) != 3 || getF(bufs[r][1], 999) != 3 {
			t.Fatalf("rank %d: %v %v", r, getF(bufs[r][0], 9), getF(bufs[r][1], 999))
		}
	}
}

// TestMismatch: rank 0 runs AllReduce while the others run Broadcast at
// the same seq; every rank fails with ErrMismatch within 1 s (no hang),
// and the error describes both sides.
func TestMismatch(t *testing.T) {
	for _, tr := range testTransports {
		for _, c := range []struct{ n, count int }{{2, 1024}, {3, 1024}, {2, 1 << 20}, {4, 1 << 20}} {
			n, count := c.n, c.count
			t.Run(fmt.Sprintf("%s/n=%d/count=%d", tr, n, count), func(t *testing.T) {
				g := newGroup(t, n, Options{Transport: tr, ShmRingBytes: 64 << 10})
				works := make([]*comm.Work, n)
				start := time.Now()
				for r, e := range g.engines {
					buf := comm.NewHostBuffer(comm.Float32, count)
					fp := comm.Fingerprint{Group: comm.GroupHash(g.name), Seq: 7, DType: comm.Float32, Count: int64(count), Root: -1}
					op := &comm.Op{Type: comm.OpBroadcast, Root: 0, In: []comm.Buffer{buf}}
					if r == 0 {
						op.Type, op.Reduce, fp.RedOp = comm.OpAllReduce, comm.Sum, comm.RedSum
					} else {
						fp.Root = 0
					}
					fp.Op = op.Type
					op.FP = fp
					works[r] = launch(e, op)
				}
				for r, w := range works {
					err := waitT(t, w, 5*time.Second)
					if !errors.Is(err, comm.ErrMismatch) {
						t.Fatalf("rank %d: got %v, want ErrMismatch", r, err)
					}
					var me *comm.MismatchError
					if !errors.As(err, &me) || !strings.Contains(err.Error(), fmt.Sprintf("AllReduce(float32×%d", count)) || !strings.Contains(err.Error(), fmt.Sprintf("Broadcast(float32×%d, root 0)", count)) {
						t.Fatalf("rank %d: error does not describe both sides: %v", r, err)
					}
				}
				if el := time.Since(start); el > time.Second {
					t.Fatalf("mismatch took %v to detect, want < 1s", el)
				}
				// The communicator is broken now: later ops fail at once.
				if err := g.engines[0].AsyncError(); !errors.Is(err, comm.ErrMismatch) {
					t.Fatalf("AsyncError = %v", err)
				}
			})
		}
	}
}

// TestAbortLargeAllReduce: Abort during a 256 MiB allreduce fails the
// aborted rank's Work with ErrAborted promptly (goal 100 ms; the bound is
// generous for a loaded machine), its peer's with a TransportError (the
// aborted rank closed its connections), and later launches fail at once.
func TestAbortLargeAllReduce(t *testing.T) {
	if testing.Short() {
		t.Skip("256 MiB buffers")
	}
	for _, tr := range testTransports {
		t.Run(tr, func(t *testing.T) {
			g := newGroup(t, 2, Options{Transport: tr})
			const count = 64 << 20 // 256 MiB of float32
			works := make([]*comm.Work, 2)
			for r, e := range g.engines {
				buf := comm.NewHostBuffer(comm.Float32, count)
				fp := comm.Fingerprint{Group: comm.GroupHash(g.name), Seq: 1, Op: comm.OpAllReduce, DType: comm.Float32, Count: count, Root: -1, RedOp: comm.RedSum}
				works[r] = launch(e, &comm.Op{FP: fp, Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{buf}})
			}
			// A few ms in, the ranks are moving data (the whole op takes
			// 25-60 ms here).
			time.Sleep(5 * time.Millisecond)
			if works[0].IsCompleted() {
				t.Fatalf("allreduce finished before the abort: %v", works[0].Err())
			}
			start := time.Now()
			reason := errors.New("test abort")
			g.engines[0].Abort(reason)
			err := waitT(t, works[0], 5*time.Second)
			el := time.Since(start)
			if !errors.Is(err, comm.ErrAborted) || !errors.Is(err, reason) {
				t.Fatalf("aborted rank: got %v, want ErrAborted", err)
			}
			err = waitT(t, works[1], 5*time.Second)
			elPeer := time.Since(start)
			// The peer learns of the abort from rank 0's notice: it names
			// rank 0, its seq and its reason, never an anonymous EOF.
			var ra *comm.RemoteAbortError
			if !errors.As(err, &ra) || ra.Rank != 0 || ra.Seq != 1 || !strings.Contains(ra.Reason, "test abort") {
				t.Fatalf("peer: got %v, want a RemoteAbortError naming rank 0 at seq 1 with its reason", err)
			}
			t.Logf("%s: aborted rank returned after %v, its peer after %v", tr, el, elPeer)
			if el > time.Second || elPeer > time.Second {
				t.Fatalf("abort took %v / %v (goal 100 ms)", el, elPeer)
			}
			w := launch(g.engines[0], &comm.Op{FP: comm.Fingerprint{Seq: 2, Op: comm.OpBarrier}, Type: comm.OpBarrier})
			if err := waitT(t, w, time.Second); !errors.Is(err, comm.ErrAborted) {
				t.Fatalf("launch after abort: %v", err)
			}
		})
	}
}

// TestAbortClaimsRunningOp: an op that ends, with every byte it needs,
// while this rank's Abort tells the peers fails here with the abort, as the
// notice makes it fail on the peers that had not finished it. The abort is
// held between its claim of the op's seq and its notice (abortClaimed);
// meanwhile the peer launches the op, and both ranks have their data. Before
// the claim, rank 0's op completed with nil there (an abort of a large
// tcp allreduce did so in 2 of 4 runs once its buffers had huge pages),
// while the peer's op of the same seq failed with the notice. The peer,
// which completed the op before the notice reached it, keeps its success
// (docs/semantics.md, "An abort is final", the window) and fails the next
// op with a *comm.RemoteAbortError naming rank 0 and seq 1.
func TestAbortClaimsRunningOp(t *testing.T) {
	for _, tr := range testTransports {
		t.Run(tr, func(t *testing.T) {
			g := newGroup(t, 2, Options{Transport: tr})
			const count = 4
			fp := func(seq uint64) comm.Fingerprint {
				return comm.Fingerprint{Group: comm.GroupHash(g.name), Seq: seq, Op: comm.OpAllReduce, DType: comm.Float32, Count: count, Root: -1, RedOp: comm.RedSum}
			}
			allreduce := func(r int, seq uint64) *comm.Work {
				buf := comm.HostBuffer(make([]float32, count))
				return launch(g.engines[r], &comm.Op{FP: fp(seq), Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{buf}})
			}
			claimed, release := make(chan struct{}), make(chan struct{})
			g.engines[0].abortClaimed = func() {
				close(claimed)
				<-release
			}
			w0 := allreduce(0, 1) // runs, and waits for rank 1
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
				if _, started, _ := w0.UnixNanos(); started != 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("rank 0's op did not start")
				}
			}
			reason := errors.New("test abort")
			go g.engines[0].Abort(reason)
			<-claimed
			w1 := allreduce(1, 1)
			if err := waitT(t, w1, 5*time.Second); err != nil {
				t.Fatalf("rank 1 completed the op before the notice: got %v, want nil", err)
			}
			// Rank 0 has rank 1's data too; give it time to finish the op.
			time.Sleep(50 * time.Millisecond)
			if w0.IsCompleted() {
				close(release)
				t.Fatalf("rank 0's op completed (%v) while its abort, which named it, was telling the peers", w0.Err())
			}
			close(release)
			if err := waitT(t, w0, 5*time.Second); !errors.Is(err, comm.ErrAborted) || !errors.Is(err, reason) {
				t.Fatalf("rank 0: got %v, want ErrAborted with the reason", err)
			}
			err := waitT(t, allreduce(1, 2), 5*time.Second)
			var ra *comm.RemoteAbortError
			if !errors.As(err, &ra) || ra.Rank != 0 || ra.Seq != 1 {
				t.Fatalf("rank 1's next op: got %v, want a RemoteAbortError naming rank 0 at seq 1", err)
			}
		})
	}
}

// TestAbortFirstReasonStands: a second Abort that comes while the first
// is still telling the peers (the watchdog relaying a peer's echo of this
// rank's own abort, as a cancelled ctx's abort once met in CI) neither
// replaces the first one's reason nor returns before it: the in-flight op
// fails with the first reason.
func TestAbortFirstReasonStands(t *testing.T) {
	g := newGroup(t, 2, Options{Transport: TransportSHM})
	const count = 4
	fp := comm.Fingerprint{Group: comm.GroupHash(g.name), Seq: 1, Op: comm.OpAllReduce, DType: comm.Float32, Count: count, Root: -1, RedOp: comm.RedSum}
	w0 := launch(g.engines[0], &comm.Op{FP: fp, Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{comm.HostBuffer(make([]float32, count))}})
	first, echo := errors.New("first reason"), errors.New("echo of the first")
	claimed, release := make(chan struct{}), make(chan struct{})
	var held atomic.Bool
	g.engines[0].abortClaimed = func() {
		if held.CompareAndSwap(false, true) { // the first Abort only
			close(claimed)
			<-release
		}
	}
	firstDone := make(chan struct{})
	go func() {
		g.engines[0].Abort(first)
		close(firstDone)
	}()
	<-claimed
	echoDone := make(chan struct{})
	go func() {
		g.engines[0].Abort(echo)
		close(echoDone)
	}()
	select {
	case <-echoDone:
		close(release)
		t.Fatalf("the second Abort returned while the first was still telling the peers (op: %v)", w0.Err())
	case <-time.After(50 * time.Millisecond):
	}
	if w0.IsCompleted() {
		close(release)
		t.Fatalf("the op completed (%v) before the first Abort told the peers", w0.Err())
	}
	close(release)
	<-firstDone
	<-echoDone
	err := waitT(t, w0, 5*time.Second)
	if !errors.Is(err, comm.ErrAborted) || !errors.Is(err, first) || errors.Is(err, echo) {
		t.Fatalf("op: got %v, want ErrAborted with the first reason", err)
	}
}

// TestPeerDeath: a peer whose connections vanish mid-op (a killed process:
// no notice) gives a *comm.TransportError naming it; a peer that destroys
// the group mid-op gives a *comm.RemoteAbortError naming it, not an EOF.
func TestPeerDeath(t *testing.T) {
	for _, tr := range testTransports {
		for _, how := range []string{"died", "destroyed"} {
			t.Run(tr+"/"+how, func(t *testing.T) {
				g := newGroup(t, 2, Options{Transport: tr})
				buf := comm.NewHostBuffer(comm.Float32, 16)
				fp := comm.Fingerprint{Group: comm.GroupHash(g.name), Seq: 1, Op: comm.OpAllReduce, DType: comm.Float32, Count: 16, Root: -1, RedOp: comm.RedSum}
				w := launch(g.engines[0], &comm.Op{FP: fp, Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{buf}})
				time.Sleep(20 * time.Millisecond)
				if how == "died" {
					g.engines[1].stop(errors.New("killed")) // connections close, nothing is said
				} else {
					_ = g.engines[1].Close()
				}
				err := waitT(t, w, 5*time.Second)
				var te *comm.TransportError
				var ra *comm.RemoteAbortError
				switch {
				case how == "died" && (!errors.As(err, &te) || te.Peer != 1 || te.FP.Seq != 1):
					t.Fatalf("got %v, want a TransportError naming peer 1 at seq 1", err)
				case how == "destroyed" && (!errors.As(err, &ra) || ra.Rank != 1 || ra.Seq != 1 || !strings.Contains(ra.Reason, "destroyed")):
					// Seq 1: the first op rank 1 did not run (it closed
					// before it), not the last one it ran (none).
					t.Fatalf("got %v, want a RemoteAbortError naming rank 1 that destroyed the group at seq 1", err)
				}
			})
		}
	}
}

// TestCloseAfterFailureKeepsOrigin: a rank whose communicator already
// broke (it heard of a failure that started at rank 2, seq 1) and then
// destroys the group passes that failure on: a peer that hears of it from
// this rank first blames rank 2 at seq 1, not the rank that closed.
func TestCloseAfterFailureKeepsOrigin(t *testing.T) {
	for _, tr := range testTransports {
		t.Run(tr, func(t *testing.T) {
			g := newGroup(t, 3, Options{Transport: tr})
			buf := comm.NewHostBuffer(comm.Float32, 16)
			fp := comm.Fingerprint{Group: comm.GroupHash(g.name), Seq: 1, Op: comm.OpAllReduce, DType: comm.Float32, Count: 16, Root: -1, RedOp: comm.RedSum}
			w := launch(g.engines[1], &comm.Op{FP: fp, Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{buf}})
			time.Sleep(20 * time.Millisecond)
			g.engines[0].onNotice(2, encodeNotice(failNotice{Kind: noticeAbort, Origin: 2, Seq: 1, Reason: "rank 2 timed out"}), nil)
			_ = g.engines[0].Close()
			err := waitT(t, w, 5*time.Second)
			var ra *comm.RemoteAbortError
			if !errors.As(err, &ra) || ra.Rank != 2 || ra.Seq != 1 || !strings.Contains(ra.Reason, "rank 2 timed out") {
				t.Fatalf("got %v, want a RemoteAbortError naming rank 2 at seq 1", err)
			}
		})
	}
}

// TestFaultError: an injected "error" fault fails exactly the op at its
// seq on its rank with an *comm.EngineError.
func TestFaultError(t *testing.T) {
	st := store.NewMemStore()
	const n = 2
	engines := make([]*Engine, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			engines[r], err = New(context.Background(), comm.BackendConfig{Group: "g", Rank: r, Size: n, Store: st, Device: -1,
				GlobalRanks: []int{5, 6}, Faults: []comm.Fault{{Kind: comm.FaultError, Rank: 6, Seq: 2}}, Log: zerolog.Nop()}, Options{})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	defer func() {
		for _, e := range engines {
			_ = e.Close()
		}
	}()
	w := launch(engines[1], &comm.Op{FP: comm.Fingerprint{Seq: 2, Op: comm.OpBarrier}, Type: comm.OpBarrier})
	err := waitT(t, w, 5*time.Second)
	var ee *comm.EngineError
	if !errors.As(err, &ee) || ee.FP.Seq != 2 {
		t.Fatalf("got %v, want an injected EngineError at seq 2", err)
	}
}

// TestStrayConnectionRejected: a connection presenting the wrong secret is
// rejected and logged, and the engine keeps working.
func TestStrayConnectionRejected(t *testing.T) {
	var logBuf syncBuffer
	log := zerolog.New(&logBuf)
	g := newGroupStore(t, 2, Options{Transport: TransportTCP}, store.NewMemStore(), log)
	addr := g.engines[0].ln.Addr().String()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	nonce := make([]byte, nonceSize)
	if _, err := c.Read(nonce); err != nil {
		t.Fatal(err)
	}
	hello := make([]byte, helloSize)
	copy(hello, []byte{0x31, 0x48, 0x54, 0x52}) // magic, little endian
	hello[16] = 1                               // claims rank 1
	copy(hello[20:], mac([]byte("wrong secret"), nonce, hello[:20]))
	if _, err := c.Write(hello); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var st [3]byte
	if n, err := c.Read(st[:]); err == nil && st[0] == statusOK {
		t.Fatalf("stray connection accepted (%d bytes)", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logBuf.String(), "wrong job secret") {
		if time.Now().After(deadline) {
			t.Fatalf("rejection not logged; log: %s", logBuf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	checkAllReduce(t, g, comm.Float32, comm.Sum, 10)
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestShmSegmentsUnlinked: shm segments are unlinked as soon as both ranks
// mapped them, so a crash leaves nothing in ShmDir.
func TestShmSegmentsUnlinked(t *testing.T) {
	dir := t.TempDir()
	g := newGroup(t, 3, Options{Transport: TransportSHM, ShmDir: dir})
	ents, _ := os.ReadDir(dir)
	if len(ents) != 0 {
		t.Fatalf("%d files left in %s", len(ents), dir)
	}
	if len(g.engines[0].shms) != 2 {
		t.Fatalf("rank 0 has %d shm links, want 2", len(g.engines[0].shms))
	}
	checkAllReduce(t, g, comm.Float64, comm.Max, 1000)
}

// TestAutoTransport picks shm for peers with the same HostID and tcp for
// others.
func TestAutoTransport(t *testing.T) {
	st := store.NewMemStore()
	engines := make([]*Engine, 3)
	var wg sync.WaitGroup
	for r := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			host := "A"
			if r == 2 {
				host = "B"
			}
			var err error
			engines[r], err = New(context.Background(), comm.BackendConfig{Group: "g", Rank: r, Size: 3, Store: st, Device: -1, Log: zerolog.Nop()}, Options{HostID: host})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	g := &group{t: t, name: "g", engines: engines}
	t.Cleanup(func() {
		for _, e := range engines {
			_ = e.Close()
		}
	})
	if _, ok := engines[0].links[1].(*transport.ShmLink); !ok {
		t.Fatalf("ranks 0 and 1 (same host) do not use shm")
	}
	if _, ok := engines[0].links[2].(*transport.TCPLink); !ok {
		t.Fatalf("ranks 0 and 2 (different hosts) do not use tcp")
	}
	checkAllReduce(t, g, comm.Float32, comm.Sum, 100_000)
}

// TestCloseReleases: Close stops every goroutine the engines started, and
// ops launched after Close fail with ErrClosed.
func TestCloseReleases(t *testing.T) {
	before := runtime.NumGoroutine()
	for _, tr := range testTransports {
		g := newGroup(t, 3, Options{Transport: tr})
		checkAllReduce(t, g, comm.Int32, comm.Sum, 1000)
		for _, e := range g.engines {
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			_ = e.Close() // idempotent
		}
		w := launch(g.engines[1], &comm.Op{FP: comm.Fingerprint{Seq: 9, Op: comm.OpBarrier}, Type: comm.OpBarrier})
		if err := waitT(t, w, time.Second); !errors.Is(err, comm.ErrClosed) {
			t.Fatalf("%s: launch after Close: %v", tr, err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before+2 {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines before, %d after Close:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFaultHang: an injected "hang" blocks the op at its seq until Abort.
func TestFaultHang(t *testing.T) {
	e, err := New(context.Background(), comm.BackendConfig{Group: "g", Rank: 0, Size: 1, Device: -1,
		Faults: []comm.Fault{{Kind: comm.FaultHang, Rank: 0, Seq: 3, Group: "g"}}, Log: zerolog.Nop()}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	barrier := func(seq uint64) *comm.Work {
		return launch(e, &comm.Op{FP: comm.Fingerprint{Seq: seq, Op: comm.OpBarrier}, Type: comm.OpBarrier})
	}
	if err := waitT(t, barrier(2), 5*time.Second); err != nil {
		t.Fatalf("seq 2: %v", err)
	}
	w := barrier(3)
	time.Sleep(100 * time.Millisecond)
	if w.IsCompleted() {
		t.Fatalf("seq 3 completed despite the hang fault: %v", w.Err())
	}
	e.Abort(errors.New("watchdog"))
	if err := waitT(t, w, 5*time.Second); !errors.Is(err, comm.ErrAborted) {
		t.Fatalf("got %v, want ErrAborted", err)
	}
}

// TestShmHeaderAcrossWrap: a message whose header straddles the end of a
// ring, followed by more payload than the ring holds. The sender must not
// wait for ring space behind a partial header, which the receiver cannot
// consume (a deadlock the slot rule of transport/shm.go once had).
func TestShmHeaderAcrossWrap(t *testing.T) {
	const ring = 16 << 10
	for _, tr := range []string{TransportSHM, TransportInmem} {
		for _, o := range []int{16, 32, 48} { // messages are padded to 16 bytes
			t.Run(fmt.Sprintf("%s/header-%d-bytes-before-wrap", tr, o), func(t *testing.T) {
				g := newGroup(t, 2, Options{Transport: tr, ShmRingBytes: ring})
				// The first message fills the ring up to o bytes before its
				// end; the second one's header is split there.
				first := filled(comm.Uint8, ring-transport.HeaderSize-o, 3)
				second := filled(comm.Uint8, ring+4000, 5)
				for i, b := range []comm.Buffer{first, second} {
					got := comm.NewHostBuffer(comm.Uint8, b.Len())
					s := launch(g.engines[0], p2pOp(g, comm.OpSend, 1, i, b))
					r := launch(g.engines[1], p2pOp(g, comm.OpRecv, 0, i, got))
					for _, w := range []*comm.Work{s, r} {
						if err := waitT(t, w, 10*time.Second); err != nil {
							t.Fatalf("message %d: %v", i, err)
						}
					}
					if !bytes.Equal(got.Bytes(), b.Bytes()) {
						t.Fatalf("message %d corrupted", i)
					}
				}
			})
		}
	}
}

// TestListenWildcard: engines that listen on every interface and advertise
// a non-loopback address of this host (as a multi-host job does) publish
// that address and connect through it.
func TestListenWildcard(t *testing.T) {
	var ip string
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
				ip = ipn.IP.String()
				break
			}
		}
	}
	if ip == "" {
		t.Skip("no non-loopback IPv4 address on this machine")
	}
	st := store.NewMemStore(store.WithMemTimeout(30 * time.Second))
	g := newGroupStore(t, 2, Options{Transport: TransportTCP, ListenHost: "0.0.0.0", AdvertiseHost: ip}, st, zerolog.Nop())
	v, err := st.Get(context.Background(), "cpu/g/0/rank/1")
	if err != nil || !strings.Contains(string(v), `"`+ip+":") {
		t.Fatalf("rank 1 published %s (%v), want an address on %s", v, err, ip)
	}
	data := [][]float32{{1, 2}, {10, 20}}
	g.mustRun("allreduce", func(r int, fp fpFunc) *comm.Op {
		return &comm.Op{FP: fp(comm.OpAllReduce, comm.Float32, 2, -1, comm.Sum), Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{comm.HostBuffer(data[r])}}
	})
	for r := range 2 {
		if data[r][0] != 11 || data[r][1] != 22 {
			t.Fatalf("rank %d: %v", r, data[r])
		}
	}
}

// TestAbortBetweenOpsSparesFinishedOp: a rank that finished seq 1 and
// then aborts, with a reason that names no seq, tells its peers that the
// failure starts at seq 2, the op it had not begun: a peer's seq 1 (which
// the aborting rank completed successfully) is not failed for it, even if
// it ends after the notice, and the peer's seq 2 fails with a
// RemoteAbortError naming rank 1 at seq 2.
func TestAbortBetweenOpsSparesFinishedOp(t *testing.T) {
	for _, tr := range testTransports {
		t.Run(tr, func(t *testing.T) {
			g := newGroup(t, 2, Options{Transport: tr})
			bufs := []comm.Buffer{comm.NewHostBuffer(comm.Float32, 4), comm.NewHostBuffer(comm.Float32, 4)}
			g.mustRun("allreduce seq 1", func(r int, fp fpFunc) *comm.Op {
				return &comm.Op{FP: fp(comm.OpAllReduce, comm.Float32, 4, -1, comm.Sum), Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{bufs[r]}}
			})
			g.engines[1].Abort(errors.New("user abort"))
			e0 := g.engines[0]
			var ra *comm.RemoteAbortError
			if err := e0.AsyncError(); !errors.As(err, &ra) || ra.Rank != 1 || ra.Seq != 2 {
				t.Fatalf("rank 0 recorded %v, want a RemoteAbortError naming rank 1 at seq 2", err)
			}
			if err := e0.fatal.forSeq(1); err != nil {
				t.Fatalf("rank 0 would fail seq 1, which rank 1 completed: %v", err)
			}
			fp := comm.Fingerprint{Group: comm.GroupHash(g.name), Seq: 2, Op: comm.OpAllReduce, DType: comm.Float32, Count: 4, Root: -1, RedOp: comm.RedSum}
			err := waitT(t, launch(e0, &comm.Op{FP: fp, Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{bufs[0]}}), 5*time.Second)
			if !errors.As(err, &ra) || ra.Rank != 1 || ra.Seq != 2 {
				t.Fatalf("rank 0's seq 2: %v, want a RemoteAbortError naming rank 1 at seq 2", err)
			}
		})
	}
}
