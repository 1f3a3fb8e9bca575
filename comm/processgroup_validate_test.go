package comm_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/internal/testrank"
)

// newRecorded returns rank `rank` of a world of `size` whose engine is a
// testrank.Recorder behind a real communicator actor.
func newRecorded(t testing.TB, rank, size int) (*comm.ProcessGroup, *testrank.Recorder, *testrank.Factory) {
	t.Helper()
	var rec *testrank.Recorder
	f := testrank.RecorderFactory(testrank.QuietSystem(), func(_ comm.GroupSpec, r *testrank.Recorder) {
		if rec == nil {
			rec = r
		}
	})
	pg, err := f.World(context.Background(), rank, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Destroy(context.Background()) })
	return pg, rec, f
}

func f32(n int) comm.Buffer { return comm.HostBuffer(make([]float32, n)) }
func i64(n int) comm.Buffer { return comm.HostBuffer(make([]int64, n)) }

func f32s(k, n int) []comm.Buffer {
	out := make([]comm.Buffer, k)
	for i := range out {
		out[i] = f32(n)
	}
	return out
}

// TestValidation checks each bad-input case on rank 1 of 4: the Work fails
// at once with an *ArgError wrapping ErrInvalidArgument whose text carries
// c10d's wording and the values involved, nothing reaches the engine and no
// sequence number is used.
func TestValidation(t *testing.T) {
	ctx := context.Background()
	pg, rec, _ := newRecorded(t, 1, 4)
	dev := comm.DeviceBuffer(0x1000, 4, comm.Float32, 0, 0)
	cases := []struct {
		name string
		call func() *comm.Work
		want []string
	}{
		{"coalesced mixed dtypes", func() *comm.Work {
			return pg.AllReduceCoalesced(ctx, []comm.Buffer{f32(2), i64(2)}, comm.Sum)
		}, []string{"tensors with different dtypes", "int64", "float32"}},
		{"coalesced empty", func() *comm.Work { return pg.AllReduceCoalesced(ctx, nil, comm.Sum) }, []string{"non-empty"}},
		{"invalid buffer", func() *comm.Work { return pg.AllReduce(ctx, comm.Buffer{}, comm.Sum) }, []string{"not a valid buffer"}},
		{"bitwise on float", func() *comm.Work { return pg.AllReduce(ctx, f32(4), comm.BAnd) }, []string{"Cannot use ReduceOp.band", "float32"}},
		{"avg on int", func() *comm.Work { return pg.AllReduce(ctx, comm.HostBuffer(make([]int32, 3)), comm.Avg) }, []string{"avg", "int32", "floating"}},
		{"max on complex64", func() *comm.Work { return pg.AllReduce(ctx, comm.HostBuffer(make([]complex64, 3)), comm.Max) }, []string{"Cannot use ReduceOp.max", "complex64", "sum, avg and premul_sum"}},
		{"product on complex128", func() *comm.Work { return pg.AllReduce(ctx, comm.HostBuffer(make([]complex128, 3)), comm.Product) }, []string{"ReduceOp.product", "complex128"}},
		{"min on complex reduce_scatter", func() *comm.Work {
			return pg.ReduceScatterTensor(ctx, comm.HostBuffer(make([]complex64, 1)), comm.HostBuffer(make([]complex64, 4)), comm.Min)
		}, []string{"REDUCE_SCATTER", "ReduceOp.min", "complex64"}},
		{"bxor on complex", func() *comm.Work { return pg.Reduce(ctx, comm.HostBuffer(make([]complex64, 3)), 0, comm.BXor) }, []string{"ReduceOp.bxor", "complex64"}},
		{"shape product", func() *comm.Work { return pg.AllReduce(ctx, f32(12).WithShape(2, 5), comm.Sum) }, []string{"ALLREDUCE", "buffer", "shape [2, 5] holds 10 elements but the buffer has 12"}},
		{"shape negative", func() *comm.Work { return pg.Broadcast(ctx, f32(12).WithShape(-3, -4), 0) }, []string{"BROADCAST", "negative dimension -3"}},
		{"shape in output list", func() *comm.Work {
			out := f32s(4, 4)
			out[1] = out[1].WithShape(3)
			return pg.AllGather(ctx, out, f32(4))
		}, []string{"output[1]", "shape [3] holds 3 elements but the buffer has 4"}},
		{"premul nan", func() *comm.Work { return pg.AllReduce(ctx, f32(4), comm.PreMulSum(math.NaN())) }, []string{"not finite"}},
		{"device buffer on host engine", func() *comm.Work { return pg.AllReduce(ctx, dev, comm.Sum) }, []string{"cuda:0", "only handles host buffers"}},
		{"broadcast root too big", func() *comm.Work { return pg.Broadcast(ctx, f32(4), 4) }, []string{"invalid root rank 4", "[0, 4)"}},
		{"broadcast root negative", func() *comm.Work { return pg.Broadcast(ctx, f32(4), -1) }, []string{"invalid root rank -1"}},
		{"reduce root", func() *comm.Work { return pg.Reduce(ctx, f32(4), 9, comm.Sum) }, []string{"invalid root rank 9"}},
		{"reduce bad op", func() *comm.Work { return pg.Reduce(ctx, f32(4), 0, comm.BXor) }, []string{"bxor"}},
		{"allgather list length", func() *comm.Work { return pg.AllGather(ctx, f32s(3, 4), f32(4)) }, []string{"output list has 3 buffers, expected 4"}},
		{"allgather element size", func() *comm.Work {
			out := f32s(4, 4)
			out[1] = f32(5) // rank 1's own part (the others may differ: uneven lists)
			return pg.AllGather(ctx, out, f32(4))
		}, []string{"output[1] has 5 elements, expected 4"}},
		{"allgather dtype", func() *comm.Work {
			out := f32s(4, 4)
			out[3] = i64(4)
			return pg.AllGather(ctx, out, f32(4))
		}, []string{"tensors with different dtypes", "output[3] is int64"}},
		{"allgather into size", func() *comm.Work { return pg.AllGatherInto(ctx, f32(15), f32(4)) }, []string{"output tensor size must be equal to world_size times input tensor size", "15", "16"}},
		{"allgather into dtype", func() *comm.Work { return pg.AllGatherInto(ctx, i64(16), f32(4)) }, []string{"tensors with different dtypes"}},
		{"allgatherv counts length", func() *comm.Work { return pg.AllGatherV(ctx, f32(6), f32(2), []int{2, 2, 2}) }, []string{"counts has 3 entries, expected 4"}},
		{"allgatherv negative count", func() *comm.Work { return pg.AllGatherV(ctx, f32(6), f32(2), []int{2, 2, -1, 3}) }, []string{"counts[2] is -1"}},
		{"allgatherv input count", func() *comm.Work { return pg.AllGatherV(ctx, f32(10), f32(3), []int{1, 2, 3, 4}) }, []string{"input has 3 elements, expected 2"}},
		{"allgatherv output count", func() *comm.Work { return pg.AllGatherV(ctx, f32(9), f32(2), []int{1, 2, 3, 4}) }, []string{"output has 9 elements, expected 10"}},
		{"reducescatter list length", func() *comm.Work { return pg.ReduceScatter(ctx, f32(4), f32s(5, 4), comm.Sum) }, []string{"input list has 5 buffers, expected 4"}},
		{"reducescatter element size", func() *comm.Work {
			in := f32s(4, 4)
			in[1] = f32(3) // rank 1's own part
			return pg.ReduceScatter(ctx, f32(4), in, comm.Sum)
		}, []string{"input[1] has 3 elements, expected 4"}},
		{"reducescatter tensor size", func() *comm.Work { return pg.ReduceScatterTensor(ctx, f32(4), f32(12), comm.Sum) }, []string{"input tensor must be the same size as output size times world size", "12"}},
		{"reducescatterv output", func() *comm.Work {
			return pg.ReduceScatterV(ctx, f32(1), f32(10), []int{1, 2, 3, 4}, comm.Sum)
		}, []string{"output has 1 elements, expected 2"}},
		{"alltoall not divisible", func() *comm.Work { return pg.AllToAllSingle(ctx, f32(8), f32(6), nil, nil) }, []string{"input has 6 elements", "4 equal splits"}},
		{"alltoall split sum", func() *comm.Work {
			return pg.AllToAllSingle(ctx, f32(8), f32(8), nil, []int{1, 1, 1, 1})
		}, []string{"Split sizes doesn't match total dim 0 size", "sum to 4", "8 elements"}},
		{"alltoall split length", func() *comm.Work {
			return pg.AllToAllSingle(ctx, f32(8), f32(8), []int{4, 4}, nil)
		}, []string{"output splits has 2 entries, expected 4"}},
		{"alltoall list dtype", func() *comm.Work {
			out := f32s(4, 1)
			out[1] = i64(1)
			return pg.AllToAll(ctx, out, f32s(4, 1))
		}, []string{"tensors with different dtypes", "output[1] is int64"}},
		{"alltoall list length", func() *comm.Work { return pg.AllToAll(ctx, f32s(4, 1), f32s(2, 1)) }, []string{"input list has 2 buffers, expected 4"}},
		{"gather list on non-root", func() *comm.Work { return pg.Gather(ctx, f32s(4, 2), f32(2), 0) }, []string{"must NOT be specified on non-destination ranks"}},
		{"gather list length on root", func() *comm.Work { return pg.Gather(ctx, f32s(2, 2), f32(2), 1) }, []string{"gather_list has 2 buffers, expected 4"}},
		{"gather root", func() *comm.Work { return pg.Gather(ctx, nil, f32(2), 4) }, []string{"invalid root rank 4"}},
		{"scatter list on non-root", func() *comm.Work { return pg.Scatter(ctx, f32(2), f32s(4, 2), 3) }, []string{"must NOT be specified on non-source ranks"}},
		{"scatter element size on root", func() *comm.Work {
			in := f32s(4, 2)
			in[3] = f32(1)
			return pg.Scatter(ctx, f32(2), in, 1)
		}, []string{"scatter_list[3] has 1 elements, expected 2"}},
		{"send to self", func() *comm.Work { return pg.ISend(ctx, f32(2), 1, 0) }, []string{"invalid destination rank 1", "should not be the same as rank of the current process"}},
		{"send out of range", func() *comm.Work { return pg.ISend(ctx, f32(2), 4, 0) }, []string{"invalid destination rank 4", "[0, 4)"}},
		{"recv out of range", func() *comm.Work { return pg.IRecv(ctx, f32(2), 7, 0) }, []string{"invalid source rank 7"}},
		{"negative tag", func() *comm.Work { return pg.ISend(ctx, f32(2), 0, -3) }, []string{"invalid tag -3"}},
		{"batch empty", func() *comm.Work { return batchWork(pg.BatchP2P(ctx, nil)) }, []string{"non-empty"}},
		{"batch any source", func() *comm.Work {
			return batchWork(pg.BatchP2P(ctx, []comm.P2POp{{Op: comm.OpSend, Buf: f32(1), Peer: 0}, {Op: comm.OpRecv, Buf: f32(1), Peer: comm.AnySource}}))
		}, []string{"invalid argument to BatchP2P", "ops[1] (RECV)", "AnySource is not allowed in a batch"}},
		{"batch wrong op type", func() *comm.Work {
			return batchWork(pg.BatchP2P(ctx, []comm.P2POp{{Op: comm.OpSend, Buf: f32(1), Peer: 0}, {Op: comm.OpBroadcast, Buf: f32(1), Peer: 0}}))
		}, []string{"invalid argument to BatchP2P", "ops[1] (BROADCAST)", "op type is BROADCAST, expected SEND or RECV"}},
		{"batch bad peer", func() *comm.Work {
			return batchWork(pg.BatchP2P(ctx, []comm.P2POp{{Op: comm.OpSend, Buf: f32(1), Peer: 9}}))
		}, []string{"invalid argument to BatchP2P", "ops[0] (SEND)", "invalid destination rank 9"}},
		{"coalesce any source", func() *comm.Work {
			return pg.Coalesce(ctx, func(c *comm.Coalescer) error {
				return c.Recv(f32(2), comm.AnySource, 0)
			})
		}, []string{"AnySource is not allowed in a batch"}},
		{"coalesce bad child", func() *comm.Work {
			return pg.Coalesce(ctx, func(c *comm.Coalescer) error {
				if err := c.AllReduce(f32(2), comm.Sum); err != nil {
					return err
				}
				c.Broadcast(f32(2), 12) // error remembered even if ignored
				return nil
			})
		}, []string{"invalid root rank 12"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := tc.call()
			if !w.IsCompleted() {
				t.Fatal("Work for bad input is not completed at once")
			}
			err := w.Err()
			if !errors.Is(err, comm.ErrInvalidArgument) {
				t.Fatalf("error %v does not wrap ErrInvalidArgument", err)
			}
			var ae *comm.ArgError
			if !errors.As(err, &ae) || ae.Group != "default_pg" || ae.Rank != 1 {
				t.Fatalf("error %#v is not an *ArgError naming group default_pg rank 1", err)
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
			if w.Seq() != 0 {
				t.Errorf("rejected Work has seq %d", w.Seq())
			}
		})
	}
	if ops := rec.Ops(); len(ops) != 0 {
		t.Fatalf("engine received %d ops for bad input; first %v", len(ops), ops[0].FP)
	}
	// No sequence number was consumed: the next good ops get 1.
	if w := pg.AllReduce(ctx, f32(4), comm.Sum); w.Wait(ctx) != nil || w.Seq() != 1 {
		t.Fatalf("first valid collective: seq %d err %v, want seq 1", w.Seq(), w.Err())
	}
	if w := pg.ISend(ctx, f32(4), 0, 0); w.Wait(ctx) != nil || w.Seq() != 1 {
		t.Fatalf("first valid send: seq %d err %v, want P2P seq 1", w.Seq(), w.Err())
	}
}

// TestObjectValidation checks the blob collectives' argument errors.
func TestObjectValidation(t *testing.T) {
	ctx := context.Background()
	pg, rec, _ := newRecorded(t, 0, 3)
	if _, err := pg.BroadcastBytes(ctx, []byte("x"), 3); !errors.Is(err, comm.ErrInvalidArgument) || !strings.Contains(err.Error(), "invalid root rank 3") {
		t.Errorf("BroadcastBytes root 3: %v", err)
	}
	if _, err := pg.ScatterBytes(ctx, [][]byte{{1}}, 0); !errors.Is(err, comm.ErrInvalidArgument) || !strings.Contains(err.Error(), "parts has 1 buffers, expected 3") {
		t.Errorf("ScatterBytes short parts: %v", err)
	}
	if _, err := pg.GatherBytes(ctx, nil, -2); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Errorf("GatherBytes root -2: %v", err)
	}
	if n := len(rec.Ops()); n != 0 {
		t.Fatalf("%d ops reached the engine", n)
	}
}

// TestAnySourceInGroupOfOne: a wildcard receive in a group of one rank has
// no one to receive from; the ProcessGroup refuses it before launch (the
// engine does not check again).
func TestAnySourceInGroupOfOne(t *testing.T) {
	ctx := context.Background()
	l := &nullLauncher{}
	pg, err := comm.NewProcessGroup(comm.GroupConfig{Name: "solo", Rank: 0, Size: 1, Launcher: l, Engine: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	err = pg.IRecv(ctx, f32(1), comm.AnySource, 0).Err()
	var ae *comm.ArgError
	if !errors.As(err, &ae) || ae.Group != "solo" || !strings.Contains(err.Error(), "any-source receive in a group of one rank") {
		t.Errorf("AnySource in a group of one: %v, want an *ArgError naming it", err)
	}
	if l.n != 0 {
		t.Errorf("%d ops reached the launcher", l.n)
	}
}

// nullLauncher counts submissions; for configurations without an actor.
type nullLauncher struct{ n int }

func (l *nullLauncher) Submit(_ context.Context, op *comm.Op, p *comm.Promise) {
	l.n++
	p.Complete(nil)
}
func (l *nullLauncher) Abort(error)                 {}
func (l *nullLauncher) Close(context.Context) error { return nil }

// TestValidationDeviceEngine checks that a group of the NCCL engine
// refuses host buffers, buffers on another device than its communicator's,
// wildcard receives and object collectives, before launch (the engine
// does not check again).
func TestValidationDeviceEngine(t *testing.T) {
	ctx := context.Background()
	l := &nullLauncher{}
	pg, err := comm.NewProcessGroup(comm.GroupConfig{Name: "g", Rank: 0, Size: 2, Launcher: l, Engine: "nccl", Device: 1})
	if err != nil {
		t.Fatal(err)
	}
	err = pg.AllReduce(ctx, f32(4), comm.Sum).Err()
	if !errors.Is(err, comm.ErrInvalidArgument) || !strings.Contains(err.Error(), "host memory") {
		t.Errorf("host buffer on nccl: %v", err)
	}
	if err := pg.AllReduce(ctx, comm.DeviceBuffer(0x10, 4, comm.Float32, 1, 0), comm.Sum).Err(); err != nil {
		t.Errorf("device buffer on nccl: %v", err)
	}
	err = pg.AllReduce(ctx, comm.DeviceBuffer(0x10, 4, comm.Float32, 0, 0), comm.Sum).Err()
	if !errors.Is(err, comm.ErrInvalidArgument) || !strings.Contains(err.Error(), "cuda:0, not on the communicator's device cuda:1") {
		t.Errorf("buffer on another device: %v", err)
	}
	if err := pg.IRecv(ctx, comm.DeviceBuffer(0x10, 4, comm.Float32, 1, 0), comm.AnySource, 0).Err(); !errors.Is(err, comm.ErrUnsupported) {
		t.Errorf("AnySource receive on nccl: %v, want ErrUnsupported", err)
	}
	if n := l.n; n != 1 {
		t.Errorf("%d ops reached the launcher, want only the valid one", n)
	}
	if _, err := pg.AllGatherBytes(ctx, []byte("x")); !errors.Is(err, comm.ErrUnsupported) {
		t.Errorf("AllGatherBytes on nccl: %v, want ErrUnsupported", err)
	}
	if err := pg.SendObjectList(ctx, [][]byte{{1}}, 1); !errors.Is(err, comm.ErrUnsupported) {
		t.Errorf("SendObjectList on nccl: %v, want ErrUnsupported", err)
	}
	if _, _, err := pg.RecvObjectList(ctx, 1, 1); !errors.Is(err, comm.ErrUnsupported) {
		t.Errorf("RecvObjectList on nccl: %v, want ErrUnsupported", err)
	}
	// Self pairs in a batch: NCCL pairs them in list order, so a tag
	// pairing that crosses the list order is refused; one that follows it
	// is launched.
	dev := func(p uintptr) comm.Buffer { return comm.DeviceBuffer(p, 4, comm.Float32, 1, 0) }
	crossed := []comm.P2POp{{Op: comm.OpSend, Buf: dev(0x10), Peer: 0, Tag: 1}, {Op: comm.OpSend, Buf: dev(0x20), Peer: 0, Tag: 2},
		{Op: comm.OpRecv, Buf: dev(0x30), Peer: 0, Tag: 2}, {Op: comm.OpRecv, Buf: dev(0x40), Peer: 0, Tag: 1}}
	if _, err := pg.BatchP2P(ctx, crossed); !errors.Is(err, comm.ErrInvalidArgument) || !strings.Contains(err.Error(), "pairs them in list order") {
		t.Errorf("crossed self pairs on nccl: %v, want ErrInvalidArgument", err)
	}
	crossed[2].Tag, crossed[3].Tag = 1, 2
	if _, err := pg.BatchP2P(ctx, crossed); err != nil {
		t.Errorf("ordered self pairs on nccl: %v", err)
	}
	if l.n != 2 {
		t.Errorf("launcher got %d ops, want 2", l.n)
	}
}

// TestGroupConfigValidate checks NewProcessGroup's config errors.
func TestGroupConfigValidate(t *testing.T) {
	l := &nullLauncher{}
	bad := []comm.GroupConfig{
		{Rank: 0, Size: 1, Launcher: l},
		{Name: "g", Rank: 0, Size: 0, Launcher: l},
		{Name: "g", Rank: 2, Size: 2, Launcher: l},
		{Name: "g", Rank: 0, Size: 2, GlobalRanks: []int{0}, Launcher: l},
		{Name: "g", Rank: 0, Size: 2, GlobalRanks: []int{3, 3}, Launcher: l},
		{Name: "g", Rank: 0, Size: 2},
	}
	for i, c := range bad {
		if _, err := comm.NewProcessGroup(c); !errors.Is(err, comm.ErrInvalidArgument) {
			t.Errorf("config %d: err %v, want ErrInvalidArgument", i, err)
		}
	}
	pg, err := comm.NewProcessGroup(comm.GroupConfig{Name: "g", Rank: 1, Size: 3, GlobalRanks: []int{4, 7, 9}, Launcher: l})
	if err != nil {
		t.Fatal(err)
	}
	if pg.Timeout() != comm.DefaultTimeout {
		t.Errorf("default timeout %v", pg.Timeout())
	}
	if g, err := pg.GlobalRank(2); g != 9 || err != nil {
		t.Errorf("GlobalRank(2) = %d, %v", g, err)
	}
	if r, err := pg.GroupRank(7); r != 1 || err != nil {
		t.Errorf("GroupRank(7) = %d, %v", r, err)
	}
	if _, err := pg.GroupRank(5); !errors.Is(err, comm.ErrInvalidArgument) || !strings.Contains(err.Error(), "global rank 5") {
		t.Errorf("GroupRank(5): %v", err)
	}
	if _, err := pg.GlobalRank(3); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Errorf("GlobalRank(3): %v", err)
	}
}

// TestBatchP2PErrorNamesCall checks that a BatchP2P rejection is headed by
// BatchP2P (not by the bad entry's op) and that AnySource in a batch is
// reported as such, not as an out-of-range rank.
func TestBatchP2PErrorNamesCall(t *testing.T) {
	ctx := context.Background()
	pg, _, _ := newRecorded(t, 0, 3)
	_, err := pg.BatchP2P(ctx, []comm.P2POp{{Op: comm.OpBroadcast, Buf: f32(1), Peer: 1}})
	var ae *comm.ArgError
	if !errors.As(err, &ae) || !errors.Is(err, comm.ErrInvalidArgument) {
		t.Fatalf("BatchP2P with a BROADCAST entry: %v, want an *ArgError wrapping ErrInvalidArgument", err)
	}
	if ae.Call != "BatchP2P" || ae.Op != comm.OpCoalesced {
		t.Errorf("ArgError call %q op %v, want BatchP2P COALESCED", ae.Call, ae.Op)
	}
	if strings.Contains(err.Error(), "to BROADCAST") {
		t.Errorf("error %q is headed by the entry's op, not BatchP2P", err)
	}
	for _, call := range []func() error{
		func() error {
			_, err := pg.BatchP2P(ctx, []comm.P2POp{{Op: comm.OpRecv, Buf: f32(1), Peer: comm.AnySource}})
			return err
		},
		func() error {
			return pg.Coalesce(ctx, func(c *comm.Coalescer) error { return c.Recv(f32(1), comm.AnySource, 0) }).Err()
		},
	} {
		err := call()
		if !errors.Is(err, comm.ErrInvalidArgument) || !errors.As(err, &ae) {
			t.Fatalf("AnySource in a batch: %v, want an *ArgError wrapping ErrInvalidArgument", err)
		}
		if s := err.Error(); !strings.Contains(s, "AnySource is not allowed in a batch") || strings.Contains(s, "invalid source rank") {
			t.Errorf("AnySource in a batch: %q, want it named as AnySource, not as an invalid rank", s)
		}
	}
	// A lone IRecv still takes AnySource, and a send to -1 is still an
	// out-of-range destination.
	if err := pg.ISend(ctx, f32(1), comm.AnySource, 0).Err(); err == nil || !strings.Contains(err.Error(), "invalid destination rank -1") {
		t.Errorf("ISend to -1: %v", err)
	}
}

// TestBatchP2PSelfValidation: sends to and receives from self inside a
// BatchP2P must pair by tag with equal dtype and length; otherwise the
// call fails with an *ArgError headed BatchP2P naming the entry, and
// nothing is launched. Outside a batch a send to self stays an error.
func TestBatchP2PSelfValidation(t *testing.T) {
	ctx := context.Background()
	pg, rec, _ := newRecorded(t, 1, 3)
	cases := []struct {
		name string
		ops  []comm.P2POp
		want []string
	}{
		{"send without receive", []comm.P2POp{{Op: comm.OpSend, Buf: f32(2), Peer: 1, Tag: 4}},
			[]string{"ops[0] (SEND) sends to rank 1 itself with tag 4", "no matching receive from self"}},
		{"receive without send", []comm.P2POp{{Op: comm.OpSend, Buf: f32(2), Peer: 0}, {Op: comm.OpRecv, Buf: f32(2), Peer: 1, Tag: 3}},
			[]string{"ops[1] (RECV) receives from rank 1 itself with tag 3", "no matching send to self"}},
		{"tags differ", []comm.P2POp{{Op: comm.OpSend, Buf: f32(2), Peer: 1, Tag: 1}, {Op: comm.OpRecv, Buf: f32(2), Peer: 1, Tag: 2}},
			[]string{"ops[0] (SEND) sends to rank 1 itself with tag 1"}},
		{"two sends one receive", []comm.P2POp{{Op: comm.OpSend, Buf: f32(2), Peer: 1}, {Op: comm.OpRecv, Buf: f32(2), Peer: 1}, {Op: comm.OpSend, Buf: f32(2), Peer: 1}},
			[]string{"ops[2] (SEND)"}},
		{"length differs", []comm.P2POp{{Op: comm.OpRecv, Buf: f32(3), Peer: 1}, {Op: comm.OpSend, Buf: f32(2), Peer: 1}},
			[]string{"ops[1] (SEND to self) has float32×2 but its receive ops[0] (RECV from self) has float32×3"}},
		{"dtype differs", []comm.P2POp{{Op: comm.OpSend, Buf: f32(2), Peer: 1}, {Op: comm.OpRecv, Buf: i64(2), Peer: 1}},
			[]string{"float32×2", "int64×2"}},
	}
	for _, tc := range cases {
		works, err := pg.BatchP2P(ctx, tc.ops)
		var ae *comm.ArgError
		if works != nil || !errors.As(err, &ae) || !errors.Is(err, comm.ErrInvalidArgument) || ae.Call != "BatchP2P" {
			t.Errorf("%s: works %v err %v, want no Works and an *ArgError headed BatchP2P", tc.name, works, err)
			continue
		}
		for _, s := range tc.want {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: error %q does not contain %q", tc.name, err, s)
			}
		}
	}
	if ops := rec.Ops(); len(ops) != 0 {
		t.Fatalf("engine received %d ops for rejected batches", len(ops))
	}
	// A well-formed self pair is launched as one batch: the children keep
	// the caller's rank as their peer.
	works, err := pg.BatchP2P(ctx, []comm.P2POp{{Op: comm.OpRecv, Buf: f32(2), Peer: 1, Tag: 5}, {Op: comm.OpSend, Buf: f32(2), Peer: 1, Tag: 5}})
	if err != nil || len(works) != 2 {
		t.Fatalf("self pair: %v, %d works", err, len(works))
	}
	if err := comm.WaitAll(ctx, works); err != nil {
		t.Fatal(err)
	}
	if ops := rec.Ops(); len(ops) != 1 || len(ops[0].Children) != 2 || ops[0].Children[0].Peer != 1 || ops[0].FP.Seq != 1 {
		t.Fatalf("self pair launched as %d ops", len(ops))
	}
	if err := pg.ISend(ctx, f32(1), 1, 0).Err(); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Errorf("ISend to self outside a batch: %v, want ErrInvalidArgument", err)
	}
	// A closed group and an ended ctx give an error and no Works; a
	// non-member gets completed Works.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if works, err := pg.BatchP2P(cctx, []comm.P2POp{{Op: comm.OpSend, Buf: f32(1), Peer: 0}}); works != nil || !errors.Is(err, context.Canceled) {
		t.Errorf("ended ctx: %v, %v", works, err)
	}
}

// TestObjectListValidation checks SendObjectList/RecvObjectList's argument
// errors: headed by the method, naming the bad value, nothing sent.
func TestObjectListValidation(t *testing.T) {
	ctx := context.Background()
	pg, rec, _ := newRecorded(t, 0, 3)
	objs := [][]byte{[]byte("a")}
	cases := []struct {
		name string
		err  error
		want []string
	}{
		{"send to self", pg.SendObjectList(ctx, objs, 0), []string{"invalid argument to SendObjectList", "invalid destination rank 0", "should not be the same"}},
		{"send out of range", pg.SendObjectList(ctx, objs, 3), []string{"invalid argument to SendObjectList", "invalid destination rank 3", "[0, 3)"}},
		{"send to AnySource", pg.SendObjectList(ctx, objs, comm.AnySource), []string{"invalid destination rank -1"}},
		{"recv negative count", func() error { _, _, err := pg.RecvObjectList(ctx, -1, 1); return err }(), []string{"invalid argument to RecvObjectList", "invalid object count -1"}},
		{"recv out of range", func() error { _, _, err := pg.RecvObjectList(ctx, 1, 5); return err }(), []string{"invalid argument to RecvObjectList", "invalid source rank 5"}},
		{"recv from self", func() error { _, _, err := pg.RecvObjectList(ctx, 1, 0); return err }(), []string{"invalid source rank 0", "should not be the same"}},
	}
	for _, tc := range cases {
		var ae *comm.ArgError
		if !errors.Is(tc.err, comm.ErrInvalidArgument) || !errors.As(tc.err, &ae) {
			t.Errorf("%s: %v, want an *ArgError wrapping ErrInvalidArgument", tc.name, tc.err)
			continue
		}
		for _, s := range tc.want {
			if !strings.Contains(tc.err.Error(), s) {
				t.Errorf("%s: error %q does not contain %q", tc.name, tc.err, s)
			}
		}
	}
	if n := len(rec.Ops()); n != 0 {
		t.Fatalf("%d ops reached the engine", n)
	}
}

// batchWork turns BatchP2P's result into one Work for the table of
// rejections: the error, or the batch's first Work.
func batchWork(works []*comm.Work, err error) *comm.Work {
	if err != nil {
		return comm.FailedWork(comm.OpCoalesced, err)
	}
	return works[0]
}
