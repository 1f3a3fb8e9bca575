package nccl_test

import (
	"errors"
	"math"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cuda"
	"github.com/ranktree/ranktree/comm/nccl"
	"github.com/ranktree/ranktree/internal/fakegpu"
)

func TestMain(m *testing.M) { fakegpu.Main(m) }

// onGPU: see fakegpu.OnGPU.
func onGPU() bool { return fakegpu.OnGPU() }

// libs loads CUDA and NCCL (the fake in CI) and resets the fake's faults.
func libs(t testing.TB) (*cuda.Lib, *nccl.Lib) {
	t.Helper()
	if !onGPU() {
		fakegpu.Build(t)
		fakegpu.Reset()
	}
	cu, err := cuda.Load()
	if err != nil {
		t.Fatalf("cuda.Load: %v", err)
	}
	if err := cu.Init(); err != nil {
		t.Fatal(err)
	}
	nc, err := nccl.Load()
	if err != nil {
		t.Fatalf("nccl.Load: %v", err)
	}
	return cu, nc
}

// lockCtx locks the goroutine's thread and makes device 0's primary
// context current on it.
func lockCtx(t testing.TB, cu *cuda.Lib) {
	t.Helper()
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	d, err := cu.DeviceGet(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := cu.PrimaryCtxRetain(d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !cudaWedged.Load() {
			_ = cu.PrimaryCtxRelease(d)
		}
	})
	if err := cu.CtxSetCurrent(ctx); err != nil {
		t.Fatal(err)
	}
}

// initComm creates a world-size-1 nonblocking communicator and polls it ready.
func initComm(t *testing.T, nc *nccl.Lib) nccl.Comm {
	t.Helper()
	id, err := nc.GetUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	cfg := nccl.NewConfig(nc.Version())
	cfg.Blocking = 0
	c, r, err := nc.CommInitRankConfig(1, id, 0, cfg)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for r == nccl.InProgress {
		if time.Now().After(deadline) {
			t.Fatal("init did not finish in 60 s")
		}
		time.Sleep(time.Millisecond)
		if r, err = nc.CommGetAsyncError(c); err != nil {
			t.Fatal(err)
		}
	}
	if r != nccl.Success {
		t.Fatalf("init ended with %v: %s", r, nc.LastError(c))
	}
	return c
}

func TestBindingSmoke(t *testing.T) {
	cu, nc := libs(t)
	lockCtx(t, cu)
	v := nc.Version()
	if v < 21400 {
		t.Fatalf("Version = %d; want >= 2.14", v)
	}
	t.Logf("NCCL %s from %s", nccl.VersionString(v), nc.Path())
	id1, err := nc.GetUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	id2, _ := nc.GetUniqueID()
	if id1 == id2 || id1 == (nccl.UniqueID{}) {
		t.Fatal("two unique ids are equal or zero")
	}
	c := initComm(t, nc)
	if n, err := nc.CommCount(c); n != 1 || err != nil {
		t.Fatalf("CommCount = %d, %v", n, err)
	}
	if r, err := nc.CommUserRank(c); r != 0 || err != nil {
		t.Fatalf("CommUserRank = %d, %v", r, err)
	}
	if d, err := nc.CommCuDevice(c); d != 0 || err != nil {
		t.Fatalf("CommCuDevice = %d, %v", d, err)
	}

	// AllReduce with a PreMulSum op on float32, data checked on the host.
	s, _ := cu.StreamCreate(cuda.StreamNonBlocking, 0)
	defer cu.StreamDestroy(s)
	buf, _ := cu.MemAlloc(16)
	defer cu.MemFree(buf)
	in := []float32{1, 2, 3, 4}
	must(t, cu.MemcpyHtoD(buf, f32bytes(in)))
	factor := float32(0.5)
	op, err := nc.RedOpCreatePreMulSum(unsafe.Pointer(&factor), nccl.Float32, nccl.ScalarHostImmediate, c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.AllReduce(buf, buf, 4, nccl.Float32, op, c, s); err != nil {
		t.Fatal(err)
	}
	must(t, nc.RedOpDestroy(op, c))
	must(t, cu.StreamSynchronize(s))
	out := make([]byte, 16)
	must(t, cu.MemcpyDtoH(out, buf))
	got := unsafe.Slice((*float32)(unsafe.Pointer(&out[0])), 4)
	for i := range in {
		if got[i] != in[i]*0.5 {
			t.Fatalf("premul allreduce: got %v want %v×0.5", got, in)
		}
	}
	// Split (NCCL 2.18+) gives a working one-rank communicator.
	sc, r, err := nc.CommSplit(c, 0, 0, nil, 30*time.Second)
	if errors.Is(err, comm.ErrUnsupported) {
		t.Logf("split unsupported: %v", err)
	} else if err != nil || (r != nccl.Success && r != nccl.InProgress) || sc == 0 {
		t.Fatalf("CommSplit = %v, %v, %v", sc, r, err)
	} else {
		for r == nccl.InProgress {
			time.Sleep(time.Millisecond)
			r, _ = nc.CommGetAsyncError(sc)
		}
		if n, _ := nc.CommCount(sc); n != 1 {
			t.Fatalf("split comm size %d", n)
		}
		must(t, nc.CommDestroy(sc))
	}
	if r, err := nc.CommFinalize(c); err != nil {
		t.Fatal(err)
	} else {
		for r == nccl.InProgress {
			time.Sleep(time.Millisecond)
			r, _ = nc.CommGetAsyncError(c)
		}
	}
	must(t, nc.CommDestroy(c))

	// A bad call returns an *nccl.Error with the result name and last-error
	// text. It runs on a communicator of its own, aborted after: a
	// nonblocking communicator keeps the error as its async state, so
	// every later call on it fails the same way (real NCCL 2.28; the fake
	// does not model this).
	bc := initComm(t, nc)
	_, err = nc.AllReduce(buf, buf, 4, nccl.DataType(99), nccl.Sum, bc, s)
	var ne *nccl.Error
	if !errors.As(err, &ne) || !errors.Is(err, comm.ErrEngine) || ne.Code != nccl.InvalidArgument {
		t.Fatalf("bad dtype: %v; want *nccl.Error ncclInvalidArgument", err)
	}
	t.Logf("bad dtype error: %v", err)
	if !onGPU() && ne.Last == "" {
		t.Fatal("error lacks ncclGetLastError text")
	}
	must(t, nc.CommAbort(bc))
}

// TestSplitHandleWrittenLate (fake): when NCCL writes a nonblocking
// split's handle after ncclCommSplit returned (as NCCL 2.28 does, from its
// own thread, once the child's init ends), CommSplit waits for it; a wait
// that runs out fails with ErrTimeout, and NCCL's late write then lands in
// memory CommSplit keeps alive.
func TestSplitHandleWrittenLate(t *testing.T) {
	fakeOnly(t)
	cu, nc := libs(t)
	lockCtx(t, cu)
	c := initComm(t, nc)
	defer func() { must(t, nc.CommDestroy(c)) }()
	fakegpu.Set("split_late", 1)
	defer fakegpu.Set("split_late", 0)
	sc, r, err := nc.CommSplit(c, 0, 0, nil, 5*time.Second)
	if err != nil || r != nccl.Success || sc == 0 {
		t.Fatalf("CommSplit with a late handle = %v, %v, %v; want a communicator", sc, r, err)
	}
	if n, err := nc.CommCount(sc); n != 1 || err != nil {
		t.Fatalf("split comm size %d, %v", n, err)
	}
	must(t, nc.CommDestroy(sc))
	sc, _, err = nc.CommSplit(c, 0, 0, nil, time.Millisecond)
	if !errors.Is(err, comm.ErrTimeout) || sc != 0 {
		t.Fatalf("CommSplit whose handle comes after the wait = %v, %v; want ErrTimeout", sc, err)
	}
	runtime.GC()
	time.Sleep(50 * time.Millisecond) // the late write lands in the kept slot
	runtime.GC()
}

func TestDataTypeOfCoversEveryDType(t *testing.T) {
	for _, dt := range comm.AllDTypes {
		if dt.IsComplex() {
			// No NCCL complex type: the engine views it as real pairs.
			if _, err := nccl.DataTypeOf(dt); !errors.Is(err, comm.ErrUnsupported) {
				t.Fatalf("%v: %v, want ErrUnsupported", dt, err)
			}
			if n, err := nccl.DataTypeOf(dt.Real()); err != nil || 2*n.Size() != dt.Size() {
				t.Fatalf("%v: real part %v (%v) is not half an element", dt, n, err)
			}
			continue
		}
		n, err := nccl.DataTypeOf(dt)
		if err != nil {
			t.Fatalf("%v: %v", dt, err)
		}
		if n.Size() != dt.Size() {
			t.Errorf("%v → %v: size %d != %d", dt, n, n.Size(), dt.Size())
		}
	}
	if _, err := nccl.DataTypeOf(comm.DType(0)); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Fatal("invalid dtype accepted")
	}
	if len(nccl.AllDataTypes) != 12 || nccl.Float8e5m2.Size() != 1 || nccl.Uint64.String() != "ncclUint64" {
		t.Fatal("NCCL dtype table wrong")
	}
	if got := nccl.VersionString(22807); got != "2.28.7" {
		t.Fatalf("VersionString = %q", got)
	}
	if got := nccl.VersionString(2708); got != "2.7.8" {
		t.Fatalf("VersionString(2708) = %q", got)
	}
}

func TestConfigLayout(t *testing.T) {
	// Offsets of ncclConfig_t on LP64 (nccl.h, 2.31): netName at 32,
	// commName at 48, nvlsHostMode last at 112, size 120 (padded to 8).
	var c nccl.Config
	if off := unsafe.Offsetof(c.NetName); off != 32 {
		t.Errorf("netName offset %d", off)
	}
	if off := unsafe.Offsetof(c.CommName); off != 48 {
		t.Errorf("commName offset %d", off)
	}
	if off := unsafe.Offsetof(c.NvlsHostMode); off != 112 {
		t.Errorf("nvlsHostMode offset %d", off)
	}
	cfg := nccl.NewConfig(22807)
	if cfg.Size != 120 || cfg.Magic != 0xcafebeef || cfg.Blocking != math.MinInt32 {
		t.Errorf("NewConfig = %+v", cfg)
	}
}

func f32bytes(s []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), 4*len(s))
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
