package ranktree

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cuda"
	"github.com/ranktree/ranktree/internal/fakegpu"
	"github.com/ranktree/ranktree/store"
)

// TestBackendNCCLThroughInit selects the NCCL engine with RANKTREE_BACKEND
// (over the fake libcuda/libnccl built from C, as in CI): the world group
// runs on it, a device-buffer allreduce completes with the right data, and a
// host buffer is refused before anything is sent.
func TestBackendNCCLThroughInit(t *testing.T) {
	fakegpu.Build(t)
	fakegpu.Reset()
	t.Setenv(EnvBackend, "nccl")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rt, err := Init(ctx, WithStore(store.NewMemStore()), WithRank(0), WithWorldSize(1), WithJob("nccl"),
		WithLocalRank(0), WithLocalWorldSize(1), WithNodeRank(0), WithRestartCount(0),
		WithNATSURL("unused://"), WithLogger(zerolog.Nop()))
	if err != nil {
		t.Fatalf("Init: %v", err)
	}
	defer rt.Close(ctx)
	pg := rt.World()
	if pg.Backend() != "nccl" {
		t.Fatalf("world group engine %q, want nccl", pg.Backend())
	}

	cu, err := cuda.Load()
	if err != nil {
		t.Fatal(err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cu.Init(); err != nil {
		t.Fatal(err)
	}
	dev, err := cu.DeviceGet(0)
	if err != nil {
		t.Fatal(err)
	}
	cctx, err := cu.PrimaryCtxRetain(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer cu.PrimaryCtxRelease(dev)
	if err := cu.CtxSetCurrent(cctx); err != nil {
		t.Fatal(err)
	}
	host := []float32{1, -2, 3.5, 4}
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&host[0])), 4*len(host))
	ptr, err := cu.MemAlloc(len(raw))
	if err != nil {
		t.Fatal(err)
	}
	defer cu.MemFree(ptr)
	if err := cu.MemcpyHtoD(ptr, raw); err != nil {
		t.Fatal(err)
	}
	buf := comm.DeviceBuffer(uintptr(ptr), len(host), comm.Float32, 0, 0)
	if err := pg.AllReduce(ctx, buf, comm.Sum).Wait(ctx); err != nil {
		t.Fatalf("device allreduce: %v", err)
	}
	got := make([]float32, len(host))
	if err := cu.MemcpyDtoH(unsafe.Slice((*byte)(unsafe.Pointer(&got[0])), 4*len(got)), ptr); err != nil {
		t.Fatal(err)
	}
	for i := range host {
		if got[i] != host[i] {
			t.Fatalf("allreduce at world size 1 changed element %d: %v -> %v", i, host[i], got[i])
		}
	}
	if err := pg.AllReduce(ctx, comm.HostBuffer(host), comm.Sum).Wait(ctx); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Fatalf("host buffer on the nccl group: err %v, want ErrInvalidArgument", err)
	}
}

// TestMain removes the compiled fake GPU libraries after the package's tests.
func TestMain(m *testing.M) { fakegpu.Main(m) }

func TestBackendInvalidValue(t *testing.T) {
	t.Setenv(EnvBackend, "gloo")
	_, err := Init(context.Background(), WithStore(store.NewMemStore()), WithRank(0), WithWorldSize(1), WithJob("bad"),
		WithLocalRank(0), WithLocalWorldSize(1), WithNodeRank(0), WithRestartCount(0),
		WithNATSURL("unused://"), WithLogger(zerolog.Nop()))
	var ee *EnvError
	if !errors.As(err, &ee) || ee.Var != EnvBackend {
		t.Fatalf("err %v, want an *EnvError naming %s", err, EnvBackend)
	}
}
