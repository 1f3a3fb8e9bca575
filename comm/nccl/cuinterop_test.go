//go:build cuda

package nccl

import (
	"testing"

	"gorgonia.org/cu"

	"github.com/ranktree/ranktree/comm"
)

// TestCuBuffer needs a GPU: gorgonia.org/cu's init exits the process
// without one. It makes a real stream and allocation through cu and checks
// that CuBuffer carries them unchanged.
func TestCuBuffer(t *testing.T) {
	dev, err := cu.GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := dev.RetainPrimaryCtx()
	if err != nil {
		t.Fatal(err)
	}
	if err := cu.SetCurrentContext(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := cu.MakeStream(cu.NonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	p, err := cu.MemAlloc(32)
	if err != nil {
		t.Fatal(err)
	}
	defer cu.MemFree(p)
	b := CuBuffer(p, 8, comm.Float32, dev, s)
	if b.IsHost() || b.DevicePtr() != uintptr(p) || b.Len() != 8 || b.Device() != int(dev) || b.Stream() == 0 || b.Stream() != CuStreamHandle(s) {
		t.Fatalf("CuBuffer = %v (ptr %#x stream %#x), want ptr %#x on device %d", b, b.DevicePtr(), b.Stream(), uintptr(p), dev)
	}
	if h := CuStreamHandle(cu.NoStream); h != 0 {
		t.Fatalf("CuStreamHandle(NoStream) = %#x", h)
	}
}
