//go:build cuda

package nccl

import (
	"unsafe"

	"gorgonia.org/cu"

	"github.com/ranktree/ranktree/comm"
)

// This file is the interop adapter for gorgonia.org/cu, built only with
// `-tags cuda`: cu's cgo code needs the CUDA toolkit's cuda.h (give its
// folder in CGO_CFLAGS=-I…) and links libcuda, which builds without the
// tag never need. Note that cu's package init calls cuInit and exits the
// process when it fails, so a `-tags cuda` binary runs only where a GPU is.
// scripts/reallib-check.sh compiles this file against a real cuda.h.

// CuBuffer describes count elements of dt at the device pointer ptr on dev,
// ordered after the work queued on stream (cu.NoStream: the legacy default
// stream), as a comm.Buffer for the NCCL engine: the NCCL stream waits on
// stream before the collective runs, as c10d orders a collective after the
// caller's current stream. ptr must be device memory of dev's primary
// context (cu.Device.RetainPrimaryCtx), the context the engine uses; the
// engine checks count and dtype against the op, not the allocation's size.
func CuBuffer(ptr cu.DevicePtr, count int, dt comm.DType, dev cu.Device, stream cu.Stream) comm.Buffer {
	return comm.DeviceBuffer(uintptr(ptr), count, dt, int(dev), CuStreamHandle(stream))
}

// CuStreamHandle is the raw CUstream behind a cu.Stream (0 for
// cu.NoStream), as comm.DeviceBuffer and the CUDA driver API take it.
func CuStreamHandle(s cu.Stream) uintptr { return uintptr(unsafe.Pointer(s.C())) }
