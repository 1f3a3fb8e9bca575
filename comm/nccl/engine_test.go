package nccl_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cuda"
	"github.com/ranktree/ranktree/comm/nccl"
	"github.com/ranktree/ranktree/internal/fakegpu"
	"github.com/ranktree/ranktree/store"
)

// opCase builds one op at world size 1 over device buffers and returns the
// buffer whose contents are checked and the bytes expected there.
type opCase struct {
	name  string
	ok    func(dt comm.DType) bool
	build func(v *env, dt comm.DType, n int) (op *comm.Op, check comm.Buffer, want []byte)
}

// floating: the dtypes Avg and PreMulSum take (floating and complex).
func floating(dt comm.DType) bool { return dt.IsFloating() || dt.IsComplex() }
func any_(comm.DType) bool        { return true }

// notComplex: Product, Min and Max, which torch refuses on complex dtypes.
func notComplex(dt comm.DType) bool { return !dt.IsComplex() }

func reduceCase(name string, ro comm.ReduceOp, scale float64, ok func(comm.DType) bool) opCase {
	return opCase{name: name, ok: ok, build: func(v *env, dt comm.DType, n int) (*comm.Op, comm.Buffer, []byte) {
		in := encode(dt, n, func(i int) float64 { return value(dt, i) })
		b := v.dev(dt, in, 0)
		want := encode(dt, n, func(i int) float64 { return value(dt, i) * scale })
		return &comm.Op{Type: comm.OpAllReduce, Reduce: ro.ForDType(dt), In: []comm.Buffer{b}}, b, want
	}}
}

var opCases = []opCase{
	reduceCase("AllReduceSum", comm.Sum, 1, any_),
	reduceCase("AllReduceProduct", comm.Product, 1, notComplex),
	reduceCase("AllReduceMin", comm.Min, 1, notComplex),
	reduceCase("AllReduceMax", comm.Max, 1, notComplex),
	reduceCase("AllReduceAvg", comm.Avg, 1, floating),
	reduceCase("AllReducePreMulSum", comm.PreMulSum(0.5), 0.5, floating),
	{name: "Broadcast", ok: any_, build: func(v *env, dt comm.DType, n int) (*comm.Op, comm.Buffer, []byte) {
		in := encode(dt, n, func(i int) float64 { return value(dt, i) })
		b := v.dev(dt, in, 0)
		return &comm.Op{Type: comm.OpBroadcast, Root: 0, In: []comm.Buffer{b}}, b, in
	}},
	{name: "Reduce", ok: any_, build: func(v *env, dt comm.DType, n int) (*comm.Op, comm.Buffer, []byte) {
		in := encode(dt, n, func(i int) float64 { return value(dt, i) })
		b := v.dev(dt, in, 0)
		return &comm.Op{Type: comm.OpReduce, Root: 0, Reduce: comm.Sum.ForDType(dt), In: []comm.Buffer{b}}, b, in
	}},
	{name: "AllGather", ok: any_, build: func(v *env, dt comm.DType, n int) (*comm.Op, comm.Buffer, []byte) {
		in := encode(dt, n, func(i int) float64 { return value(dt, i) })
		out := v.dev(dt, make([]byte, len(in)), 0)
		return &comm.Op{Type: comm.OpAllGather, In: []comm.Buffer{v.dev(dt, in, 0)}, Out: []comm.Buffer{out}}, out, in
	}},
	{name: "AllGatherV", ok: any_, build: func(v *env, dt comm.DType, n int) (*comm.Op, comm.Buffer, []byte) {
		in := encode(dt, n, func(i int) float64 { return value(dt, i) })
		out := v.dev(dt, make([]byte, len(in)), 0)
		return &comm.Op{Type: comm.OpAllGatherV, RecvCounts: []int{n}, In: []comm.Buffer{v.dev(dt, in, 0)}, Out: []comm.Buffer{out}}, out, in
	}},
	{name: "ReduceScatter", ok: any_, build: func(v *env, dt comm.DType, n int) (*comm.Op, comm.Buffer, []byte) {
		in := encode(dt, n, func(i int) float64 { return value(dt, i) })
		out := v.dev(dt, make([]byte, len(in)), 0)
		return &comm.Op{Type: comm.OpReduceScatter, Reduce: comm.Sum.ForDType(dt), In: []comm.Buffer{v.dev(dt, in, 0)}, Out: []comm.Buffer{out}}, out, in
	}},
	{name: "ReduceScatterV", ok: notComplex, build: func(v *env, dt comm.DType, n int) (*comm.Op, comm.Buffer, []byte) {
		in := encode(dt, n, func(i int) float64 { return value(dt, i) })
		out := v.dev(dt, make([]byte, len(in)), 0)
		return &comm.Op{Type: comm.OpReduceScatterV, Reduce: comm.Max, RecvCounts: []int{n}, In: []comm.Buffer{v.dev(dt, in, 0)}, Out: []comm.Buffer{out}}, out, in
	}},
	{name: "AllToAll", ok: any_, build: func(v *env, dt comm.DType, n int) (*comm.Op, comm.Buffer, []byte) {
		in := encode(dt, n, func(i int) float64 { return value(dt, i) })
		out := v.dev(dt, make([]byte, len(in)), 0)
		return &comm.Op{Type: comm.OpAllToAll, SendCounts: []int{n}, RecvCounts: []int{n}, In: []comm.Buffer{v.dev(dt, in, 0)}, Out: []comm.Buffer{out}}, out, in
	}},
	{name: "Gather", ok: any_, build: func(v *env, dt comm.DType, n int) (*comm.Op, comm.Buffer, []byte) {
		in := encode(dt, n, func(i int) float64 { return value(dt, i) })
		out := v.dev(dt, make([]byte, len(in)), 0)
		return &comm.Op{Type: comm.OpGather, Root: 0, In: []comm.Buffer{v.dev(dt, in, 0)}, Out: []comm.Buffer{out}}, out, in
	}},
	{name: "Scatter", ok: any_, build: func(v *env, dt comm.DType, n int) (*comm.Op, comm.Buffer, []byte) {
		in := encode(dt, n, func(i int) float64 { return value(dt, i) })
		out := v.dev(dt, make([]byte, len(in)), 0)
		return &comm.Op{Type: comm.OpScatter, Root: 0, In: []comm.Buffer{v.dev(dt, in, 0)}, Out: []comm.Buffer{out}}, out, in
	}},
	{name: "SendRecvSelf", ok: any_, build: func(v *env, dt comm.DType, n int) (*comm.Op, comm.Buffer, []byte) {
		in := encode(dt, n, func(i int) float64 { return value(dt, i) })
		out := v.dev(dt, make([]byte, len(in)), 0)
		send := &comm.Op{Type: comm.OpSend, Peer: 0, In: []comm.Buffer{v.dev(dt, in, 0)}}
		recv := &comm.Op{Type: comm.OpRecv, Peer: 0, Out: []comm.Buffer{out}}
		return &comm.Op{Type: comm.OpCoalesced, Children: []*comm.Op{send, recv}}, out, in
	}},
	{name: "CoalescedAllReduce", ok: floating, build: func(v *env, dt comm.DType, n int) (*comm.Op, comm.Buffer, []byte) {
		in := encode(dt, n, func(i int) float64 { return value(dt, i) })
		a, b := v.dev(dt, in, 0), v.dev(dt, in, 0)
		want := encode(dt, n, func(i int) float64 { return value(dt, i) * 2 })
		return &comm.Op{Type: comm.OpCoalesced, Children: []*comm.Op{
			{Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{a}},
			{Type: comm.OpAllReduce, Reduce: comm.PreMulSum(2), In: []comm.Buffer{b}},
		}}, b, want
	}},
}

// TestEveryOpEveryDType runs each op for each dtype at world size 1
// (counts 0, 1 and 1000) through the Engine and checks the data on the host.
func TestEveryOpEveryDType(t *testing.T) {
	v := newEnv(t)
	e := v.engine("matrix", nccl.Options{})
	if info := e.DeviceInfo(); info.UUID == "" || info.PCIBusID == "" || info.NCCLVersion == "" {
		t.Fatalf("DeviceInfo = %+v", info)
	}
	seq := uint64(0)
	for _, oc := range opCases {
		for _, dt := range comm.AllDTypes {
			if !oc.ok(dt) {
				continue
			}
			for _, n := range []int{0, 1, 1000} {
				op, check, want := oc.build(v, dt, n)
				seq++
				op.FP = fp(op.Type, dt, n, seq)
				w := launch(e, op)
				if err := wait(t, w, 30*time.Second); err != nil {
					t.Fatalf("%s %v×%d: %v", oc.name, dt, n, err)
				}
				if got := v.host(check); !bytes.Equal(got, want) {
					t.Fatalf("%s %v×%d: got % x, want % x", oc.name, dt, n, head(got), head(want))
				}
				if tm := w.Timings(); tm.Started.IsZero() || tm.Completed.Before(tm.Started) {
					t.Fatalf("%s: timings %+v", oc.name, tm)
				}
			}
		}
	}
	w := launch(e, &comm.Op{Type: comm.OpBarrier, FP: fp(comm.OpBarrier, 0, 0, seq+1)})
	if err := wait(t, w, 30*time.Second); err != nil {
		t.Fatalf("barrier: %v", err)
	}
}

func head(b []byte) []byte { return b[:min(len(b), 16)] }

// TestSelfP2POutsideGroup: a Send or Recv to the engine's own rank on its
// own is refused with an *comm.ArgError before anything reaches NCCL, and
// the engine stays usable. Real NCCL requires a send to self to be matched
// by a receive in the same ncclGroupStart/End (a coalesced op, which
// TestEveryOpEveryDType covers); alone it fails asynchronously with
// ncclInvalidUsage ("Trying to send to self without a matching recv"),
// which poisons a nonblocking communicator (seen on an H200 with NCCL
// 2.28.3, docs/gpu-verification.md). c10d refuses it too.
func TestSelfP2POutsideGroup(t *testing.T) {
	v := newEnv(t)
	e := v.engine("p2p", nccl.Options{})
	in := encode(comm.Int32, 8, func(i int) float64 { return float64(i) })
	out := v.dev(comm.Int32, make([]byte, len(in)), 0)
	for _, op := range []*comm.Op{
		{Type: comm.OpSend, Peer: 0, In: []comm.Buffer{v.dev(comm.Int32, in, 0)}},
		{Type: comm.OpRecv, Peer: 0, Out: []comm.Buffer{out}},
	} {
		err := wait(t, launch(e, op), 30*time.Second)
		var ae *comm.ArgError
		if !errors.As(err, &ae) || !errors.Is(err, comm.ErrInvalidArgument) || ae.Op != op.Type || !strings.Contains(err.Error(), "itself") {
			t.Fatalf("%v to self: %v; want *comm.ArgError naming the rank itself", op.Type, err)
		}
	}
	buf := v.dev(comm.Float32, encode(comm.Float32, 4, func(i int) float64 { return float64(i) }), 0)
	w := launch(e, &comm.Op{Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{buf}, FP: fp(comm.OpAllReduce, comm.Float32, 4, 1)})
	if err := wait(t, w, 30*time.Second); err != nil {
		t.Fatalf("allreduce after the refused sends: %v", err)
	}
}

// TestSpinningEngine: with SpinIdle and SpinWait set, the engine hands
// every Work its SpinWait and back-to-back allreduces still give the right
// sums (the spinning paths of the launch goroutine and of Wait).
func TestSpinningEngine(t *testing.T) {
	v := newEnv(t)
	e := v.engine("spin", nccl.Options{EagerInit: true, SpinIdle: 200 * time.Microsecond, SpinWait: 3 * time.Millisecond})
	in := encode(comm.Float32, 4, func(i int) float64 { return float64(i) + 0.5 })
	buf := v.dev(comm.Float32, in, 0)
	for i := 0; i < 50; i++ {
		w := launch(e, &comm.Op{Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{buf}})
		if w.SpinWait() != 3*time.Millisecond {
			t.Fatalf("Work.SpinWait = %v, want Options.SpinWait", w.SpinWait())
		}
		if err := wait(t, w, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if got := v.host(buf); !bytes.Equal(got, in) {
		t.Fatalf("one-rank allreduce changed the data: % x, want % x", got, in)
	}
}

// TestUnsupportedInputs: bitwise reductions fail with ErrUnsupported and
// the engine stays usable. (Host buffers, wildcard receives and buffers on
// another device are refused by the ProcessGroup before launch:
// comm.TestValidationDeviceEngine.)
func TestUnsupportedInputs(t *testing.T) {
	v := newEnv(t)
	e := v.engine("unsup", nccl.Options{})
	d := v.dev(comm.Int32, make([]byte, 16), 0)
	cases := []struct {
		name string
		op   *comm.Op
		want error
	}{
		{"bitwise and", &comm.Op{Type: comm.OpAllReduce, Reduce: comm.BAnd, In: []comm.Buffer{d}}, comm.ErrUnsupported},
	}
	for _, c := range cases {
		err := wait(t, launch(e, c.op), 30*time.Second)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v; want %v", c.name, err, c.want)
		}
	}
	if err := wait(t, launch(e, &comm.Op{Type: comm.OpAllReduce, Reduce: comm.Sum, In: []comm.Buffer{d}}), 30*time.Second); err != nil {
		t.Fatalf("engine unusable after rejected ops: %v", err)
	}
}

// TestNewRejectsBadConfig: host device, missing store, bad ranks.
func TestNewRejectsBadConfig(t *testing.T) {
	libs(t)
	for name, cfg := range map[string]comm.BackendConfig{
		"host device": func() comm.BackendConfig { c := testConfig("x", 1, 0, nil); c.Device = -1; return c }(),
		"no store":    testConfig("x", 2, 0, nil),
		"bad rank":    testConfig("x", 2, 2, store.NewMemStore()),
	} {
		if _, err := nccl.New(context.Background(), cfg, nccl.Options{}); !errors.Is(err, comm.ErrInvalidArgument) {
			t.Errorf("%s: %v; want ErrInvalidArgument", name, err)
		}
	}
	if _, err := nccl.New(context.Background(), testConfig("x", 1, 0, nil), nccl.Options{PollInterval: -1}); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Errorf("negative option: %v", err)
	}
}

// TestCallerStreamOrdering: an op whose buffer's stream is blocked (by
// cuStreamWaitValue32) does not run until the stream moves on, then sees
// the data the caller queued before it.
func TestCallerStreamOrdering(t *testing.T) {
	v := newEnv(t)
	e := v.engine("order", nccl.Options{})
	caller, err := v.cu.StreamCreate(cuda.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer v.cu.StreamDestroy(caller)
	side, _ := v.cu.StreamCreate(cuda.StreamNonBlocking, 0)
	defer v.cu.StreamDestroy(side)
	flag := v.dev(comm.Int32, make([]byte, 4), 0)
	src := encode(comm.Float32, 256, func(i int) float64 { return float64(i) })
	buf := v.dev(comm.Float32, make([]byte, len(src)), caller)
	out := v.dev(comm.Float32, make([]byte, len(src)), caller)
	must(t, v.cu.StreamWaitValue32(caller, cuda.DevicePtr(flag.DevicePtr()), 1, cuda.StreamWaitValueGEQ))
	must(t, v.cu.MemcpyHtoDAsync(cuda.DevicePtr(buf.DevicePtr()), src, caller))
	w := launch(e, &comm.Op{Type: comm.OpAllGather, In: []comm.Buffer{buf}, Out: []comm.Buffer{out}, FP: fp(comm.OpAllGather, comm.Float32, 256, 1)})
	if err := wait(t, w, 100*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("op behind a blocked caller stream finished: %v", err)
	}
	must(t, v.cu.MemsetD32Async(cuda.DevicePtr(flag.DevicePtr()), 1, 1, side))
	if err := wait(t, w, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := v.host(out); !bytes.Equal(got, src) {
		t.Fatalf("op did not see the caller's copy: % x", head(got))
	}
}

// TestSeveralCommunicators: independent engines (groups) in one process,
// driven concurrently, each with its own communicator and stream (half of
// them high-priority); Close releases them all.
func TestSeveralCommunicators(t *testing.T) {
	v := newEnv(t)
	var baseComms, baseStreams, baseEvents int64
	if !onGPU() {
		baseComms, baseStreams, baseEvents = fakegpu.Live("comms"), fakegpu.Live("streams"), fakegpu.Live("events")
	}
	const k = 4
	var engines []*nccl.Engine
	for i := 0; i < k; i++ {
		e, err := nccl.New(context.Background(), testConfig(fmt.Sprintf("pg%d", i), 1, 0, store.NewMemStore()), nccl.Options{EagerInit: true, HighPriorityStream: i%2 == 1})
		if err != nil {
			t.Fatal(err)
		}
		engines = append(engines, e)
	}
	if !onGPU() {
		if got := fakegpu.Live("comms") - baseComms; got != k {
			t.Fatalf("%d live communicators after eager init of %d engines", got, k)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, k)
	for i, e := range engines {
		in := encode(comm.Float32, 64, func(j int) float64 { return float64(i*100 + j) })
		bufs := make([]comm.Buffer, 20)
		for r := range bufs {
			bufs[r] = v.dev(comm.Float32, in, 0)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ws []*comm.Work
			for r, b := range bufs {
				ws = append(ws, launch(e, &comm.Op{Type: comm.OpAllReduce, Reduce: comm.PreMulSum(2), In: []comm.Buffer{b}, FP: fp(comm.OpAllReduce, comm.Float32, 64, uint64(r+1))}))
			}
			for _, w := range ws {
				if err := wait(t, w, 30*time.Second); err != nil {
					errs <- err
					return
				}
			}
		}()
		t.Cleanup(func() {
			want := encode(comm.Float32, 64, func(j int) float64 { return 2 * float64(i*100+j) })
			for _, b := range bufs {
				if got := v.host(b); !bytes.Equal(got, want) {
					t.Errorf("engine %d: got % x", i, head(got))
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, e := range engines {
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if !onGPU() {
		if got := fakegpu.Live("comms") - baseComms; got != 0 {
			t.Fatalf("%d communicators left after Close", got)
		}
		if s, ev := fakegpu.Live("streams")-baseStreams, fakegpu.Live("events")-baseEvents; s != 0 || ev != 0 {
			t.Fatalf("%d streams and %d events leaked by Close", s, ev)
		}
	}
}

// TestUIDThroughStore: rank 0 publishes the unique id under the counter
// key of its group and epoch; the bytes are a valid id.
func TestUIDThroughStore(t *testing.T) {
	v := newEnv(t)
	st := store.NewMemStore()
	cfg := testConfig("uidpg", 1, 0, st)
	cfg.Size = 1
	e, err := nccl.New(context.Background(), cfg, nccl.Options{EagerInit: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	// A one-rank group needs no exchange; a two-rank group publishes.
	cfg2 := testConfig("uidpg2", 2, 0, st)
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		_, err := nccl.New(ctx, cfg2, nccl.Options{EagerInit: true, InitTimeout: 300 * time.Millisecond})
		done <- err
	}()
	key := nccl.UIDKey("uidpg2", 1, 0)
	if key != "nccl/uidpg2/e1/uid/0" {
		t.Fatalf("UIDKey = %q", key)
	}
	b, err := st.Get(ctx, key)
	if err != nil || len(b) != nccl.UniqueIDBytes {
		t.Fatalf("store %s: %d bytes, %v", key, len(b), err)
	}
	err = <-done
	var ite *nccl.InitTimeoutError
	if !errors.Is(err, comm.ErrTimeout) || !errors.As(err, &ite) || ite.Key != key {
		t.Fatalf("two-rank init without a peer: %v; want *InitTimeoutError for %s", err, key)
	}
	_ = v
}
