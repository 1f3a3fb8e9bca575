package comm_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// opShape is the part of an Op that lowering decides, for comparison.
type opShape struct {
	Type       comm.OpType
	FPOp       comm.OpType
	DType      comm.DType
	RedOp      comm.RedOpType
	Reduce     comm.ReduceOp
	Count      int64
	FPRoot     int32
	Root, Peer int
	Tag        int
	In, Out    []int // buffer lengths
	SendCounts []int
	RecvCounts []int
	Children   int
}

func shape(op *comm.Op) opShape {
	lens := func(bs []comm.Buffer) []int {
		if bs == nil {
			return nil
		}
		out := make([]int, len(bs))
		for i, b := range bs {
			out[i] = b.Len()
		}
		return out
	}
	return opShape{
		Type: op.Type, FPOp: op.FP.Op, DType: op.FP.DType, RedOp: op.FP.RedOp, Reduce: op.Reduce,
		Count: op.FP.Count, FPRoot: op.FP.Root, Root: op.Root, Peer: op.Peer, Tag: op.Tag,
		In: lens(op.In), Out: lens(op.Out), SendCounts: op.SendCounts, RecvCounts: op.RecvCounts,
		Children: len(op.Children),
	}
}

// TestLowering checks the Op descriptor each call hands the engine (rank 1
// of 3), including the list and flat buffer forms.
func TestLowering(t *testing.T) {
	ctx := context.Background()
	pg, rec, _ := newRecorded(t, 1, 3)
	b := func(n int) comm.Buffer { return f32(n) }
	cases := []struct {
		name string
		call func() *comm.Work
		want opShape
	}{
		{"allreduce", func() *comm.Work { return pg.AllReduce(ctx, b(5), comm.Max) },
			opShape{Type: comm.OpAllReduce, FPOp: comm.OpAllReduce, DType: comm.Float32, RedOp: comm.RedMax, Reduce: comm.Max, Count: 5, FPRoot: -1, Root: -1, Peer: -1, In: []int{5}}},
		{"allreduce bool sum is max", func() *comm.Work { return pg.AllReduce(ctx, comm.HostBuffer(make([]bool, 2)), comm.Sum) },
			opShape{Type: comm.OpAllReduce, FPOp: comm.OpAllReduce, DType: comm.Bool, RedOp: comm.RedSum, Reduce: comm.Max, Count: 2, FPRoot: -1, Root: -1, Peer: -1, In: []int{2}}},
		{"broadcast", func() *comm.Work { return pg.Broadcast(ctx, b(7), 2) },
			opShape{Type: comm.OpBroadcast, FPOp: comm.OpBroadcast, DType: comm.Float32, Count: 7, FPRoot: 2, Root: 2, Peer: -1, In: []int{7}}},
		{"reduce", func() *comm.Work { return pg.Reduce(ctx, b(3), 0, comm.Product) },
			opShape{Type: comm.OpReduce, FPOp: comm.OpReduce, DType: comm.Float32, RedOp: comm.RedProduct, Reduce: comm.Product, Count: 3, FPRoot: 0, Root: 0, Peer: -1, In: []int{3}}},
		{"allgather list", func() *comm.Work { return pg.AllGather(ctx, f32s(3, 4), b(4)) },
			opShape{Type: comm.OpAllGather, FPOp: comm.OpAllGather, DType: comm.Float32, Count: 4, FPRoot: -1, Root: -1, Peer: -1, In: []int{4}, Out: []int{4, 4, 4}}},
		{"allgather flat", func() *comm.Work { return pg.AllGatherInto(ctx, b(12), b(4)) },
			opShape{Type: comm.OpAllGather, FPOp: comm.OpAllGather, DType: comm.Float32, Count: 4, FPRoot: -1, Root: -1, Peer: -1, In: []int{4}, Out: []int{12}}},
		{"allgatherv", func() *comm.Work { return pg.AllGatherV(ctx, b(6), b(2), []int{1, 2, 3}) },
			opShape{Type: comm.OpAllGatherV, FPOp: comm.OpAllGatherV, DType: comm.Float32, Count: 6, FPRoot: -1, Root: -1, Peer: -1, In: []int{2}, Out: []int{6}, RecvCounts: []int{1, 2, 3}}},
		{"reducescatter list", func() *comm.Work { return pg.ReduceScatter(ctx, b(2), f32s(3, 2), comm.Sum) },
			opShape{Type: comm.OpReduceScatter, FPOp: comm.OpReduceScatter, DType: comm.Float32, RedOp: comm.RedSum, Reduce: comm.Sum, Count: 2, FPRoot: -1, Root: -1, Peer: -1, In: []int{2, 2, 2}, Out: []int{2}}},
		{"reducescatter flat", func() *comm.Work { return pg.ReduceScatterTensor(ctx, b(2), b(6), comm.Avg) },
			opShape{Type: comm.OpReduceScatter, FPOp: comm.OpReduceScatter, DType: comm.Float32, RedOp: comm.RedAvg, Reduce: comm.Avg, Count: 2, FPRoot: -1, Root: -1, Peer: -1, In: []int{6}, Out: []int{2}}},
		{"reducescatterv", func() *comm.Work { return pg.ReduceScatterV(ctx, b(0), b(4), []int{4, 0, 0}, comm.Min) },
			opShape{Type: comm.OpReduceScatterV, FPOp: comm.OpReduceScatterV, DType: comm.Float32, RedOp: comm.RedMin, Reduce: comm.Min, Count: 4, FPRoot: -1, Root: -1, Peer: -1, In: []int{4}, Out: []int{0}, RecvCounts: []int{4, 0, 0}}},
		{"alltoall equal", func() *comm.Work { return pg.AllToAllSingle(ctx, b(6), b(9), nil, nil) },
			opShape{Type: comm.OpAllToAll, FPOp: comm.OpAllToAll, DType: comm.Float32, FPRoot: -1, Root: -1, Peer: -1, In: []int{9}, Out: []int{6}, SendCounts: []int{3, 3, 3}, RecvCounts: []int{2, 2, 2}}},
		{"alltoall splits", func() *comm.Work { return pg.AllToAllSingle(ctx, b(5), b(4), []int{1, 0, 4}, []int{2, 2, 0}) },
			opShape{Type: comm.OpAllToAll, FPOp: comm.OpAllToAll, DType: comm.Float32, FPRoot: -1, Root: -1, Peer: -1, In: []int{4}, Out: []int{5}, SendCounts: []int{2, 2, 0}, RecvCounts: []int{1, 0, 4}}},
		{"alltoall list", func() *comm.Work {
			return pg.AllToAll(ctx, []comm.Buffer{b(1), b(2), b(3)}, []comm.Buffer{b(4), b(5), b(6)})
		}, opShape{Type: comm.OpAllToAll, FPOp: comm.OpAllToAll, DType: comm.Float32, FPRoot: -1, Root: -1, Peer: -1, In: []int{4, 5, 6}, Out: []int{1, 2, 3}, SendCounts: []int{4, 5, 6}, RecvCounts: []int{1, 2, 3}}},
		{"gather non-root", func() *comm.Work { return pg.Gather(ctx, nil, b(2), 0) },
			opShape{Type: comm.OpGather, FPOp: comm.OpGather, DType: comm.Float32, Count: 2, FPRoot: 0, Root: 0, Peer: -1, In: []int{2}}},
		{"gather root", func() *comm.Work { return pg.Gather(ctx, f32s(3, 2), b(2), 1) },
			opShape{Type: comm.OpGather, FPOp: comm.OpGather, DType: comm.Float32, Count: 2, FPRoot: 1, Root: 1, Peer: -1, In: []int{2}, Out: []int{2, 2, 2}}},
		{"scatter non-root", func() *comm.Work { return pg.Scatter(ctx, b(2), nil, 2) },
			opShape{Type: comm.OpScatter, FPOp: comm.OpScatter, DType: comm.Float32, Count: 2, FPRoot: 2, Root: 2, Peer: -1, Out: []int{2}}},
		{"scatter root", func() *comm.Work { return pg.Scatter(ctx, b(2), f32s(3, 2), 1) },
			opShape{Type: comm.OpScatter, FPOp: comm.OpScatter, DType: comm.Float32, Count: 2, FPRoot: 1, Root: 1, Peer: -1, In: []int{2, 2, 2}, Out: []int{2}}},
		{"barrier", func() *comm.Work { return pg.Barrier(ctx) },
			opShape{Type: comm.OpBarrier, FPOp: comm.OpBarrier, FPRoot: -1, Root: -1, Peer: -1}},
		{"send", func() *comm.Work { return pg.ISend(ctx, b(3), 2, 9) },
			opShape{Type: comm.OpSend, FPOp: comm.OpSend, DType: comm.Float32, Count: 3, FPRoot: 2, Root: -1, Peer: 2, Tag: 9, In: []int{3}}},
		{"recv any", func() *comm.Work { return pg.IRecv(ctx, b(3), comm.AnySource, 4) },
			opShape{Type: comm.OpRecv, FPOp: comm.OpRecv, DType: comm.Float32, Count: 3, FPRoot: -1, Root: -1, Peer: comm.AnySource, Tag: 4, Out: []int{3}}},
		{"allreduce coalesced", func() *comm.Work { return pg.AllReduceCoalesced(ctx, []comm.Buffer{b(2), b(3)}, comm.Sum) },
			opShape{Type: comm.OpCoalesced, FPOp: comm.OpCoalesced, DType: comm.Float32, RedOp: comm.RedSum, Count: 5, FPRoot: -1, Root: -1, Peer: -1, Children: 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec.Reset()
			w := tc.call()
			if err := w.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			ops := rec.Ops()
			if len(ops) != 1 {
				t.Fatalf("engine got %d ops, want 1", len(ops))
			}
			if got := shape(ops[0]); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("lowered to\n %+v\nwant\n %+v", got, tc.want)
			}
			if ops[0].FP.Group != comm.GroupHash("default_pg") || ops[0].FP.Seq != w.Seq() || w.Seq() == 0 {
				t.Errorf("fingerprint %+v, work seq %d", ops[0].FP, w.Seq())
			}
			if ops[0].Timeout != pg.Timeout() {
				t.Errorf("op timeout %v, want the group's %v", ops[0].Timeout, pg.Timeout())
			}
			if w.OpType() != tc.want.Type {
				t.Errorf("Work.OpType %v, want %v", w.OpType(), tc.want.Type)
			}
		})
	}
}

// TestCoalesceAndBatch checks that coalescing and BatchP2P make one
// OpCoalesced with one Work, children in issue order sharing its seq.
func TestCoalesceAndBatch(t *testing.T) {
	ctx := context.Background()
	pg, rec, _ := newRecorded(t, 0, 2)
	pg.AllReduce(ctx, f32(1), comm.Sum).Wait(ctx) // collective seq 1
	w := pg.Coalesce(ctx, func(c *comm.Coalescer) error {
		if err := c.AllReduce(f32(2), comm.Sum); err != nil {
			return err
		}
		if err := c.AllGatherInto(f32(6), f32(3)); err != nil {
			return err
		}
		return c.Send(i64(4), 1, 5)
	}, comm.WithOpTimeout(3*time.Second))
	if err := w.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	bws, err := pg.BatchP2P(ctx, []comm.P2POp{{Op: comm.OpRecv, Buf: f32(2), Peer: 1, Tag: 1}, {Op: comm.OpSend, Buf: f32(2), Peer: 1, Tag: 2}})
	if err != nil {
		t.Fatal(err)
	}
	if err := comm.WaitAll(ctx, bws); err != nil {
		t.Fatal(err)
	}
	bw := bws[0]
	if len(bws) != 2 || bws[1].Seq() != bw.Seq() || bw.OpType() != comm.OpRecv || bws[1].OpType() != comm.OpSend || bw.Source() != 1 || bws[1].Source() != -1 {
		t.Errorf("batch Works: %d, seqs %d %d, types %v %v, sources %d %d; want one per op sharing the seq, the receive's source 1",
			len(bws), bw.Seq(), bws[1].Seq(), bw.OpType(), bws[1].OpType(), bw.Source(), bws[1].Source())
	}
	ops := rec.Ops()
	if len(ops) != 3 {
		t.Fatalf("engine got %d ops, want 3", len(ops))
	}
	co := ops[1]
	if co.Type != comm.OpCoalesced || len(co.Children) != 3 || w.OpType() != comm.OpCoalesced {
		t.Fatalf("coalesced op %v with %d children", co.Type, len(co.Children))
	}
	wantTypes := []comm.OpType{comm.OpAllReduce, comm.OpAllGather, comm.OpSend}
	for i, ch := range co.Children {
		if ch.Type != wantTypes[i] || ch.FP.Seq != 2 || ch.FP.Group != co.FP.Group {
			t.Errorf("child %d: %v fp %+v", i, ch.Type, ch.FP)
		}
	}
	if w.Seq() != 2 || co.FP.Seq != 2 || co.Timeout != 3*time.Second || co.FP.DType != 0 || co.FP.Count != 2+3+4 {
		t.Errorf("coalesced with a collective takes collective seq 2: work %d fp %+v timeout %v", w.Seq(), co.FP, co.Timeout)
	}
	ba := ops[2]
	if ba.Type != comm.OpCoalesced || len(ba.Children) != 2 || ba.Children[0].Type != comm.OpRecv || ba.Children[1].Tag != 2 {
		t.Fatalf("batch lowered to %v children %d", ba.Type, len(ba.Children))
	}
	if bw.Seq() != 1 || ba.FP.Seq != 1 {
		t.Errorf("all-P2P batch takes P2P seq 1, got %d", bw.Seq())
	}
	// The group timeout applies to later ops; 0 restores the default.
	pg.SetTimeout(5 * time.Second)
	if w := pg.Barrier(ctx); w.Wait(ctx) != nil || rec.Ops()[3].Timeout != 5*time.Second {
		t.Errorf("op timeout after SetTimeout(5s): %v", rec.Ops()[3].Timeout)
	}
	pg.SetTimeout(0)
	if pg.Timeout() != comm.DefaultTimeout {
		t.Errorf("SetTimeout(0) left %v", pg.Timeout())
	}
	rec.Reset()
	// An empty block launches nothing.
	if w := pg.Coalesce(ctx, func(*comm.Coalescer) error { return nil }); !w.IsCompleted() || w.Err() != nil || len(rec.Ops()) != 0 {
		t.Errorf("empty coalesce: completed %v err %v", w.IsCompleted(), w.Err())
	}
	// A Coalescer used after its block fails.
	var kept *comm.Coalescer
	pg.Coalesce(ctx, func(c *comm.Coalescer) error { kept = c; return nil })
	if err := kept.AllReduce(f32(1), comm.Sum); err == nil {
		t.Error("Coalescer used after Coalesce returned: no error")
	}
}

// TestSequenceNumbers checks that collective seqs count 1, 2, 3 ... per
// group, that P2P has its own counter, and that two ranks issuing the same
// collectives get equal seqs whatever P2P they do in between.
func TestSequenceNumbers(t *testing.T) {
	ctx := context.Background()
	pg0, _, _ := newRecorded(t, 0, 2)
	pg1, _, _ := newRecorded(t, 1, 2)
	waitSeq := func(w *comm.Work) uint64 {
		if err := w.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		return w.Seq()
	}
	for i := 1; i <= 5; i++ {
		s0 := waitSeq(pg0.AllReduce(ctx, f32(1), comm.Sum))
		p0 := waitSeq(pg0.ISend(ctx, f32(1), 1, 0))
		s1 := waitSeq(pg1.AllReduce(ctx, f32(1), comm.Sum))
		if s0 != uint64(i) || s1 != uint64(i) || p0 != uint64(i) {
			t.Fatalf("round %d: collective seqs %d and %d, P2P seq %d; want %d", i, s0, s1, p0, i)
		}
	}
	a := waitSeq(pg0.Barrier(ctx))
	b := waitSeq(pg1.Barrier(ctx))
	if a != 6 || b != 6 {
		t.Fatalf("6th collective: seq %d on rank 0, %d on rank 1", a, b)
	}
	if s := waitSeq(pg0.ISend(ctx, f32(1), 1, 0)); s != 6 {
		t.Fatalf("6th send has P2P seq %d, want 6", s)
	}
	if s := waitSeq(pg1.IRecv(ctx, f32(1), 0, 0)); s != 1 {
		t.Fatalf("rank 1's first recv has P2P seq %d, want 1", s)
	}
	if s := waitSeq(pg0.Broadcast(ctx, f32(1), 0)); s != 7 {
		t.Fatalf("collective after P2P: seq %d, want 7", s)
	}
}

// TestAllToAllFingerprintString checks that an all-to-all's fingerprint,
// which carries no count (per-rank totals legitimately differ), prints as
// split sizes rather than a misleading "×0", both as lowered and in the
// mismatch error a rank gets when its peer launched something else.
func TestAllToAllFingerprintString(t *testing.T) {
	ctx := context.Background()
	pg, rec, _ := newRecorded(t, 1, 3)
	if err := pg.AllToAllSingle(ctx, f32(6), f32(3), []int{2, 2, 2}, []int{1, 1, 1}).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pg.AllToAll(ctx, f32s(3, 2), f32s(3, 1)).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	ops := rec.Ops()
	if len(ops) != 2 {
		t.Fatalf("engine got %d ops, want 2", len(ops))
	}
	for i, op := range ops {
		s := op.FP.String()
		if !strings.Contains(s, "AllToAll(float32, split sizes per rank)") || strings.Contains(s, "×0") {
			t.Errorf("op %d fingerprint %q, want AllToAll(float32, split sizes per rank)", i, s)
		}
	}

	pgs := cpuWorld(t, 2)
	onRanks(t, pgs, func(ctx context.Context, pg *comm.ProcessGroup) error {
		var w *comm.Work
		if pg.Rank() == 0 {
			w = pg.AllToAllSingle(ctx, f32(4), f32(4), nil, nil)
		} else {
			w = pg.AllReduce(ctx, f32(4), comm.Sum)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		err := w.Wait(wctx)
		if !errors.Is(err, comm.ErrMismatch) {
			return fmt.Errorf("rank %d: %v, want ErrMismatch", pg.Rank(), err)
		}
		if s := err.Error(); !strings.Contains(s, "AllToAll(float32, split sizes per rank)") || strings.Contains(s, "×0") || !strings.Contains(s, "(op, reduce op differ)") {
			return fmt.Errorf("rank %d: mismatch error %q does not describe the all-to-all by its split sizes", pg.Rank(), s)
		}
		return nil
	})
}

// TestCoalescedMixedDTypeString checks that a coalesced op of several
// dtypes prints "mixed dtypes", not "dtype(0)".
func TestCoalescedMixedDTypeString(t *testing.T) {
	ctx := context.Background()
	pg, rec, _ := newRecorded(t, 0, 2)
	err := pg.Coalesce(ctx, func(c *comm.Coalescer) error {
		if err := c.Broadcast(f32(2), 0); err != nil {
			return err
		}
		return c.Broadcast(i64(3), 0)
	}).Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ops := rec.Ops()
	if len(ops) != 1 {
		t.Fatalf("engine got %d ops, want 1", len(ops))
	}
	if s := ops[0].FP.String(); !strings.Contains(s, "Coalesced(mixed dtypes×5)") {
		t.Errorf("fingerprint %q, want Coalesced(mixed dtypes×5)", s)
	}
}
