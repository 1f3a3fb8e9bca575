//go:build cuda

package nccl

import "github.com/ranktree/ranktree/comm"

// This file is the interop adapter for gorgonia.org/cu users, built only
// with `-tags cuda`. gorgonia.org/cu itself is deliberately not a
// dependency of ranktree: its cgo code needs the CUDA toolkit's headers,
// which the build machines do not have, and a require line in go.mod
// would tie every build to it. The adapter is written against the two
// facts of cu's API it needs: cu.DevicePtr is a uintptr-kind type, and a
// cu.Stream can give its raw CUstream handle. Programs that use cu pass
// their values through these generics; nothing here imports cu.

// CuDevicePtr is satisfied by gorgonia.org/cu's DevicePtr (and any other
// uintptr-kind device pointer type).
type CuDevicePtr interface{ ~uintptr }

// CuStream is anything that yields a raw CUstream handle; wrap a cu.Stream
// in a small type whose CUstream method returns its handle as a uintptr.
type CuStream interface{ CUstream() uintptr }

// CuBuffer describes count elements of dt at ptr on device, ordered after
// the work queued on stream (nil: the legacy default stream), as a
// comm.Buffer for the NCCL engine.
func CuBuffer[P CuDevicePtr](ptr P, count int, dt comm.DType, device int, stream CuStream) comm.Buffer {
	var s uintptr
	if stream != nil {
		s = stream.CUstream()
	}
	return comm.DeviceBuffer(uintptr(ptr), count, dt, device, s)
}
