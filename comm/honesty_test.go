package comm_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu"
	"github.com/ranktree/ranktree/internal/testrank"
)

// Honest failure (issue 14, docs/semantics.md): a collective launched
// differently on some rank fails on every rank with ErrMismatch, quickly;
// an abort is final for every member; a cancelled ctx abandons the op and
// aborts the communicator. Each check runs on a fresh subgroup of all
// ranks (a failure breaks that communicator only) and ends with a barrier
// on the parent, in process (TestHonestyCPU) and as separate processes
// over shm and tcp (TestHonestyMultiProcess).

// failTimes records, per check, how long each failure took to reach this
// process's ranks (logged by the tests; reported in docs/semantics.md).
var failTimes = struct {
	sync.Mutex
	d map[string][]time.Duration
}{d: map[string][]time.Duration{}}

func recordFail(name string, d time.Duration) {
	failTimes.Lock()
	failTimes.d[name] = append(failTimes.d[name], d)
	failTimes.Unlock()
}

func logFailTimes(t *testing.T) {
	failTimes.Lock()
	defer failTimes.Unlock()
	for name, ds := range failTimes.d {
		t.Logf("time to failure, %s: max %v over %d ranks", name, slices.Max(ds).Round(10*time.Microsecond), len(ds))
	}
	clear(failTimes.d)
}

// failFast bounds how long a failure may take to reach every rank. The
// goal is 1 s; the bound is generous for a loaded 2-core machine, and the
// time is logged.
const failFast = 5 * time.Second

// freshSub creates a subgroup of every member of pg, named after the check.
func freshSub(ctx context.Context, pg *comm.ProcessGroup, name string) (*comm.ProcessGroup, error) {
	return pg.NewGroup(ctx, pg.Ranks(), comm.WithGroupName(pg.Name()+"."+name))
}

// waitFail waits for w (bounded) and returns its error, an error if it
// succeeded, and how long the wait took.
func waitFail(ctx context.Context, w *comm.Work) (error, time.Duration) {
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	err := w.Wait(wctx)
	return err, time.Since(start)
}

// wantMismatch checks that err is a *comm.MismatchError (reached within
// failFast) whose differing fields include field.
func wantMismatch(rank int, err error, d time.Duration, field string) error {
	var me *comm.MismatchError
	if !errors.As(err, &me) || !errors.Is(err, comm.ErrMismatch) {
		return fmt.Errorf("rank %d: got %v, want a *comm.MismatchError", rank, err)
	}
	if field != "" && !slices.Contains(me.Fields(), field) && me.Detail == "" {
		return fmt.Errorf("rank %d: mismatch %v does not name field %q", rank, err, field)
	}
	if d > failFast {
		return fmt.Errorf("rank %d: mismatch took %v (goal 1 s)", rank, d)
	}
	return nil
}

// mismatchCase launches one op on sub per rank (launch) and checks that
// every rank fails with a mismatch naming field, and that no buffer of a
// rooted collective changed (their data moves only once every rank agreed;
// a failed AllReduce leaves its buffer unspecified, as in c10d).
func mismatchCase(ctx context.Context, pg *comm.ProcessGroup, name, field string,
	launch func(sub *comm.ProcessGroup, buf comm.Buffer) *comm.Work) error {
	if pg.Size() < 2 {
		return nil
	}
	sub, err := freshSub(ctx, pg, name)
	if err != nil {
		return err
	}
	defer sub.Destroy(ctx)
	mine := float32(100 + sub.Rank())
	data := fill(16, mine)
	w := launch(sub, comm.HostBuffer(data))
	rooted := w.OpType().IsRooted()
	err, d := waitFail(ctx, w)
	recordFail(name, d)
	// Keep every rank's broken communicator open until all have their
	// error.
	if berr := pg.Barrier(ctx).Wait(ctx); berr != nil {
		return berr
	}
	if err := wantMismatch(sub.Rank(), err, d, field); err != nil {
		return err
	}
	if e := allEqual(data, mine); e != nil && rooted {
		return fmt.Errorf("rank %d: the failed op changed the buffer: %v", sub.Rank(), e)
	}
	return nil
}

// checkBroadcastRootMismatch: rank 0 broadcasts from root 0, the others
// from root 1 (issue 14, case 1).
func checkBroadcastRootMismatch(ctx context.Context, pg *comm.ProcessGroup) error {
	return mismatchCase(ctx, pg, "bcastroot", "root", func(sub *comm.ProcessGroup, buf comm.Buffer) *comm.Work {
		return sub.Broadcast(ctx, buf, min(sub.Rank(), 1))
	})
}

// checkBroadcastVsAllReduce: the root broadcasts while the others
// all-reduce (case 2): the root fails too.
func checkBroadcastVsAllReduce(ctx context.Context, pg *comm.ProcessGroup) error {
	return mismatchCase(ctx, pg, "bcastar", "op", func(sub *comm.ProcessGroup, buf comm.Buffer) *comm.Work {
		if sub.Rank() == 0 {
			return sub.Broadcast(ctx, buf, 0)
		}
		return sub.AllReduce(ctx, buf, comm.Sum)
	})
}

// checkReduceRootMismatch: rank 0 reduces to root 0, the others to root 1
// (case 3): every rank fails with ErrMismatch at once, no buffer changes.
func checkReduceRootMismatch(ctx context.Context, pg *comm.ProcessGroup) error {
	return mismatchCase(ctx, pg, "reduceroot", "root", func(sub *comm.ProcessGroup, buf comm.Buffer) *comm.Work {
		return sub.Reduce(ctx, buf, min(sub.Rank(), 1), comm.Sum)
	})
}

// checkNewGroupListMismatch: rank 0 leaves the last rank out of its
// NewGroup list while the others pass every rank (case 5): every rank fails
// within 1 s with a *NewGroupMismatchError naming both lists, and nobody
// gets a group. Then a NewGroup without the last rank gives that rank Rank
// -1 and Size -1 (case 6).
func checkNewGroupListMismatch(ctx context.Context, pg *comm.ProcessGroup) error {
	n := pg.Size()
	if n < 2 {
		return nil
	}
	all, short := pg.Ranks(), pg.Ranks()[:n-1]
	ranks := all
	if pg.Rank() == 0 {
		ranks = short
	}
	start := time.Now()
	sub, err := pg.NewGroup(ctx, ranks, comm.WithGroupName(pg.Name()+".lists"))
	d := time.Since(start)
	recordFail("newgrouplists", d)
	var me *comm.NewGroupMismatchError
	switch {
	case sub != nil || !errors.As(err, &me) || !errors.Is(err, comm.ErrMismatch):
		return fmt.Errorf("rank %d: NewGroup(%v) = %v, %v; want a *NewGroupMismatchError", pg.Rank(), ranks, sub, err)
	case !strings.Contains(err.Error(), fmt.Sprint(short)) || !strings.Contains(err.Error(), fmt.Sprint(all)):
		return fmt.Errorf("rank %d: %v does not name both lists", pg.Rank(), err)
	case d > time.Second:
		return fmt.Errorf("rank %d: NewGroup mismatch took %v", pg.Rank(), d)
	}
	sub, err = pg.NewGroup(ctx, short, comm.WithGroupName(pg.Name()+".short"))
	if err != nil {
		return err
	}
	defer sub.Destroy(ctx)
	if pg.Rank() == n-1 && (sub.Rank() != -1 || sub.Size() != -1) {
		return fmt.Errorf("non-member: Rank %d Size %d, want -1 -1", sub.Rank(), sub.Size())
	}
	return pg.Barrier(ctx).Wait(ctx)
}

// checkAllToAllSplitMismatch: rank 0 sends two elements to rank 1, which
// expects one (case 7): ErrMismatch on every rank, not an engine error.
func checkAllToAllSplitMismatch(ctx context.Context, pg *comm.ProcessGroup) error {
	n := pg.Size()
	if n < 2 {
		return nil
	}
	sub, err := freshSub(ctx, pg, "a2asplit")
	if err != nil {
		return err
	}
	defer sub.Destroy(ctx)
	in, out := make([]int, n), make([]int, n)
	for i := range n {
		in[i], out[i] = 1, 1
	}
	if sub.Rank() == 0 {
		in[1] = 2
	}
	err, d := waitFail(ctx, sub.AllToAllSingle(ctx, comm.HostBuffer(make([]float32, n)), comm.HostBuffer(make([]float32, n+in[1]-1)), out, in))
	recordFail("a2asplit", d)
	if berr := pg.Barrier(ctx).Wait(ctx); berr != nil {
		return berr
	}
	return wantMismatch(sub.Rank(), err, d, "")
}

// abortedCase: rank 0 launches an AllReduce alone and gives it up (give
// returns its Work's expected sentinel); after a barrier on the parent the
// others launch the matching AllReduce, which must fail with
// ErrRemoteAbort naming rank 0 and leave their buffers as they were (case
// 4 and "ctx").
func abortedCase(ctx context.Context, pg *comm.ProcessGroup, name string,
	launch0 func(sub *comm.ProcessGroup, buf comm.Buffer) (*comm.Work, func(), error)) error {
	if pg.Size() < 2 {
		return nil
	}
	sub, err := freshSub(ctx, pg, name)
	if err != nil {
		return err
	}
	defer sub.Destroy(ctx)
	mine := float32(1 + sub.Rank())
	data := fill(1024, mine)
	if sub.Rank() == 0 {
		w, giveUp, want := launch0(sub, comm.HostBuffer(data))
		time.Sleep(300 * time.Millisecond)
		if w.IsCompleted() {
			return fmt.Errorf("rank 0: the lone AllReduce completed: %v", w.Err())
		}
		giveUp()
		if err, _ := waitFail(ctx, w); !errors.Is(err, want) {
			return fmt.Errorf("rank 0: got %v, want %v", err, want)
		}
	}
	if err := pg.Barrier(ctx).Wait(ctx); err != nil {
		return err
	}
	if sub.Rank() != 0 {
		err, d := waitFail(ctx, sub.AllReduce(ctx, comm.HostBuffer(data), comm.Sum))
		recordFail(name, d)
		var ra *comm.RemoteAbortError
		if !errors.As(err, &ra) || ra.Rank != sub.Ranks()[0] || ra.Seq != 1 {
			return fmt.Errorf("rank %d: got %v, want a *comm.RemoteAbortError naming global rank %d at seq 1", sub.Rank(), err, sub.Ranks()[0])
		}
		if d > failFast {
			return fmt.Errorf("rank %d: took %v to fail", sub.Rank(), d)
		}
		if e := allEqual(data, mine); e != nil {
			return fmt.Errorf("rank %d: the failed AllReduce used the aborted rank's data: %v", sub.Rank(), e)
		}
	}
	return pg.Barrier(ctx).Wait(ctx)
}

// checkAbortIsFinal: case 4, with ProcessGroup.Abort.
func checkAbortIsFinal(ctx context.Context, pg *comm.ProcessGroup) error {
	return abortedCase(ctx, pg, "abortfinal", func(sub *comm.ProcessGroup, buf comm.Buffer) (*comm.Work, func(), error) {
		w := sub.AllReduce(ctx, buf, comm.Sum)
		return w, func() { sub.Abort(errors.New("rank 0 gives up")) }, comm.ErrAborted
	})
}

// checkCancelAborts: cancelling the ctx of a launched op fails it with an
// error wrapping context.Canceled and aborts the communicator.
func checkCancelAborts(ctx context.Context, pg *comm.ProcessGroup) error {
	return abortedCase(ctx, pg, "cancel", func(sub *comm.ProcessGroup, buf comm.Buffer) (*comm.Work, func(), error) {
		cctx, cancel := context.WithCancel(ctx)
		w := sub.AllReduce(cctx, buf, comm.Sum)
		return w, cancel, context.Canceled
	})
}

// checkCoalescedMismatch: rank 0 coalesces two all-reduces, the others
// one. Each child matches on its own; the ranks must still all fail.
func checkCoalescedMismatch(ctx context.Context, pg *comm.ProcessGroup) error {
	return mismatchCase(ctx, pg, "coalesced", "", func(sub *comm.ProcessGroup, buf comm.Buffer) *comm.Work {
		bufs := []comm.Buffer{buf}
		if sub.Rank() == 0 {
			bufs = append(bufs, comm.HostBuffer(make([]float32, 16)))
		}
		return sub.AllReduceCoalesced(ctx, bufs, comm.Sum)
	})
}

// checkShapeMismatch: every rank all-reduces 16 float32s, rank 0 as a
// [4, 4] buffer, the others as [2, 8] (issue 19, item 10): the shape is in
// the fingerprint, so every rank fails with a mismatch naming "shape".
func checkShapeMismatch(ctx context.Context, pg *comm.ProcessGroup) error {
	return mismatchCase(ctx, pg, "shape", "shape", func(sub *comm.ProcessGroup, buf comm.Buffer) *comm.Work {
		if sub.Rank() == 0 {
			return sub.AllReduce(ctx, buf.WithShape(4, 4), comm.Sum)
		}
		return sub.AllReduce(ctx, buf.WithShape(2, 8), comm.Sum)
	})
}

// checkBroadcastShapeMismatch: a broadcast whose root's buffer is [16]
// (1-D) while the others' are [4, 4]: a rooted op, so no buffer changes.
func checkBroadcastShapeMismatch(ctx context.Context, pg *comm.ProcessGroup) error {
	return mismatchCase(ctx, pg, "bcastshape", "shape", func(sub *comm.ProcessGroup, buf comm.Buffer) *comm.Work {
		if sub.Rank() == 0 {
			return sub.Broadcast(ctx, buf, 0)
		}
		return sub.Broadcast(ctx, buf.WithShape(4, 4), 0)
	})
}

// unevenCounts is every rank's view of the per-rank sizes of an uneven
// list op (rank i: i+1 elements), except rank 0's, which moves one
// element of the last rank's part to rank 1's when shift (same total: the
// per-message sizes disagree) or adds one to the last part (the totals
// differ).
func unevenCounts(rank, n int, shift bool) []int {
	counts := make([]int, n)
	for i := range counts {
		counts[i] = i + 1
	}
	if rank == 0 {
		counts[n-1]++
		if shift && n > 2 {
			counts[n-1] -= 2
			counts[1]++
		}
	}
	return counts
}

func bufsOf(counts []int) []comm.Buffer {
	out := make([]comm.Buffer, len(counts))
	for i, c := range counts {
		out[i] = comm.HostBuffer(make([]float32, c))
	}
	return out
}

// checkUnevenAllGatherMismatch: an uneven all_gather where rank 0 expects
// the last rank to send one more element than it does (issue 19, item 9):
// every rank fails with a mismatch (the totals in the fingerprints
// differ).
func checkUnevenAllGatherMismatch(ctx context.Context, pg *comm.ProcessGroup) error {
	return mismatchCase(ctx, pg, "unevenag", "count", func(sub *comm.ProcessGroup, buf comm.Buffer) *comm.Work {
		counts := unevenCounts(sub.Rank(), sub.Size(), false)
		return sub.AllGather(ctx, bufsOf(counts), buf.Slice(0, sub.Rank()+1))
	})
}

// checkUnevenReduceScatterMismatch: an uneven reduce_scatter where rank
// 0's input list moves an element between two other ranks' parts (same
// total, with 3 or more ranks): the sizes of the messages disagree, and
// every rank fails with a mismatch saying so.
func checkUnevenReduceScatterMismatch(ctx context.Context, pg *comm.ProcessGroup) error {
	field := "count"
	if pg.Size() > 2 {
		field = "" // same fingerprint: the mismatch's Detail names the sizes
	}
	return mismatchCase(ctx, pg, "unevenrs", field, func(sub *comm.ProcessGroup, buf comm.Buffer) *comm.Work {
		counts := unevenCounts(sub.Rank(), sub.Size(), true)
		return sub.ReduceScatter(ctx, buf.Slice(0, sub.Rank()+1), bufsOf(counts), comm.Sum)
	})
}

var honestyChecks = []struct {
	name string
	fn   func(ctx context.Context, pg *comm.ProcessGroup) error
}{
	{"BroadcastRootMismatch", checkBroadcastRootMismatch},
	{"BroadcastVsAllReduce", checkBroadcastVsAllReduce},
	{"ReduceRootMismatch", checkReduceRootMismatch},
	{"AllToAllSplitMismatch", checkAllToAllSplitMismatch},
	{"CoalescedMismatch", checkCoalescedMismatch},
	{"ShapeMismatch", checkShapeMismatch},
	{"BroadcastShapeMismatch", checkBroadcastShapeMismatch},
	{"UnevenAllGatherMismatch", checkUnevenAllGatherMismatch},
	{"UnevenReduceScatterMismatch", checkUnevenReduceScatterMismatch},
	{"NewGroupListMismatch", checkNewGroupListMismatch},
	{"AbortIsFinal", checkAbortIsFinal},
	{"CancelAborts", checkCancelAborts},
	{"AfterFailures", checkAllReduce}, // the parent group still works
}

// TestHonestyCPU runs the honesty checks with 2, 3 and 4 ranks as
// goroutines of this process (in-memory transport).
func TestHonestyCPU(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprint("n=", n), func(t *testing.T) {
			pgs := cpuWorld(t, n)
			for _, c := range honestyChecks {
				t.Run(c.name, func(t *testing.T) { onRanks(t, pgs, c.fn) })
			}
			logFailTimes(t)
		})
	}
}

// TestHonestyMultiProcess runs them as 2, 3 and 4 processes over shm and
// over tcp.
func TestHonestyMultiProcess(t *testing.T) {
	for _, tr := range []string{cpu.TransportSHM, cpu.TransportTCP} {
		for _, n := range []int{2, 3, 4} {
			t.Run(fmt.Sprintf("%s-n=%d", tr, n), func(t *testing.T) {
				if p, ok := testrank.Current(t); ok {
					runHonestyRank(t, p, tr)
					return
				}
				if testing.Short() {
					t.Skip("multi-process test skipped with -short")
				}
				testrank.Spawn(t, n, 2*time.Minute)
			})
		}
	}
}

func runHonestyRank(t *testing.T, p testrank.Proc, transport string) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()
	pg, err := p.World(ctx, "cpu", cpu.Factory(cpu.Options{Transport: transport}), zerolog.New(io.Discard))
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Destroy(ctx)
	for _, c := range honestyChecks {
		start := time.Now()
		if err := c.fn(ctx, pg); err != nil {
			t.Fatalf("rank %d: %s: %v", p.Rank, c.name, err)
		}
		t.Logf("rank %d: %s ok (%v)", p.Rank, c.name, time.Since(start).Round(time.Millisecond))
	}
	logFailTimes(t)
}

// TestKillNamesVictim: one rank of 3 or 4 processes dies by SIGKILL in the
// middle of a run of all-reduces, at a random seq. Every survivor's op at
// that seq (or the next, if the victim's last launch completed, or completed
// where its remaining messages were not needed, before the kill) fails, and its error names the dead rank (a *TransportError
// whose Peer it is, or a *RemoteAbortError relayed by another survivor
// with it as origin), never a survivor that was only passing the news on.
func TestKillNamesVictim(t *testing.T) {
	for _, tr := range []string{cpu.TransportSHM, cpu.TransportTCP} {
		for _, n := range []int{3, 4} {
			t.Run(fmt.Sprintf("%s-n=%d", tr, n), func(t *testing.T) {
				if p, ok := testrank.Current(t); ok {
					runKillRank(t, p, tr)
					return
				}
				if testing.Short() {
					t.Skip("multi-process test skipped with -short")
				}
				seed := time.Now().UnixNano()
				victim, seq := int(seed%int64(n)), 2+int(seed/7%40)
				t.Logf("rank %d dies at seq %d", victim, seq)
				outs, err := testrank.RunRanks(t.Name(), t.TempDir(), n, 2*time.Minute,
					fmt.Sprintf("KILL_VICTIM=%d", victim), fmt.Sprintf("KILL_SEQ=%d", seq))
				failedAt := map[string][]int{} // "seq N" -> survivors that failed there
				for r, out := range outs {
					switch {
					case r == victim:
						if !strings.Contains(fmt.Sprint(err), fmt.Sprintf("rank %d (signal: killed)", r)) {
							t.Errorf("victim rank %d did not die by SIGKILL: %v", r, err)
						}
					case !strings.Contains(out, "--- PASS"):
						t.Errorf("survivor rank %d failed:\n%s", r, out)
					default:
						for _, l := range strings.Split(out, "\n") {
							if strings.Contains(l, "survivor:") {
								t.Log(strings.TrimSpace(l))
								if i := strings.Index(l, "failed at seq "); i >= 0 {
									f := strings.Fields(l[i+len("failed at "):])
									failedAt[f[0]+" "+f[1]] = append(failedAt[f[0]+" "+f[1]], r)
								}
							}
						}
					}
				}
				// A kill in the middle of the victim's last op can let the
				// survivors that needed none of its remaining messages
				// complete that op, while the others fail it: every
				// survivor fails there or at the next op (docs/semantics.md,
				// "A rank dies mid-op"), and each names the victim.
				t.Logf("survivors' failing seqs: %v", failedAt)
			})
		}
	}
}

func runKillRank(t *testing.T, p testrank.Proc, transport string) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()
	var victim, seq int
	fmt.Sscan(os.Getenv("KILL_VICTIM"), &victim)
	fmt.Sscan(os.Getenv("KILL_SEQ"), &seq)
	pg, err := p.World(ctx, "cpu", cpu.Factory(cpu.Options{Transport: transport}), zerolog.New(io.Discard))
	if err != nil {
		t.Fatal(err)
	}
	buf := comm.HostBuffer(make([]float32, 4096))
	for i := 1; ; i++ {
		w := pg.AllReduce(ctx, buf, comm.Sum)
		if p.Rank == victim && i == seq {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		start := time.Now()
		err := w.Wait(ctx)
		if err == nil {
			if i > seq+1 {
				t.Fatalf("rank %d: seq %d succeeded after rank %d died at seq %d", p.Rank, i, victim, seq)
			}
			continue
		}
		var te *comm.TransportError
		var ra *comm.RemoteAbortError
		switch {
		case errors.As(err, &te) && te.Peer == victim && te.FP.Seq == uint64(i):
		case errors.As(err, &ra) && ra.Rank == victim:
		default:
			t.Fatalf("rank %d: seq %d failed with %v; it does not name rank %d, which died at seq %d", p.Rank, i, err, victim, seq)
		}
		if i != seq && i != seq+1 {
			// The victim launched seq before it died; that op may have
			// completed everywhere first. Anything else is wrong.
			t.Fatalf("rank %d: failed at seq %d, the victim died at seq %d: %v", p.Rank, i, seq, err)
		}
		t.Logf("survivor: rank %d failed at seq %d after %v: %v", p.Rank, i, time.Since(start).Round(time.Microsecond), err)
		return
	}
}
