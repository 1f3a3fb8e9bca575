//go:build cuda

package nccl

import (
	"testing"

	"github.com/ranktree/ranktree/comm"
)

type fakeCuPtr uintptr

type fakeCuStream uintptr

func (s fakeCuStream) CUstream() uintptr { return uintptr(s) }

func TestCuBuffer(t *testing.T) {
	b := CuBuffer(fakeCuPtr(0x1000), 8, comm.Float32, 2, fakeCuStream(0x77))
	if b.DevicePtr() != 0x1000 || b.Len() != 8 || b.Device() != 2 || b.Stream() != 0x77 || b.IsHost() {
		t.Fatalf("CuBuffer = %v (ptr %#x stream %#x)", b, b.DevicePtr(), b.Stream())
	}
	if b := CuBuffer(fakeCuPtr(1), 1, comm.Int8, 0, nil); b.Stream() != 0 {
		t.Fatal("nil stream not the default stream")
	}
}
