// Package nvmlinfo discovers GPUs through NVML: their count,
// UUIDs and PCI bus ids, for rank-to-device placement and for events. A
// rank's device is its LOCAL_RANK modulo the GPU count (torchrun's
// convention: one process per GPU on a node).
//
// NVML is loaded at run time (libnvidia-ml.so.1, or RANKTREE_NVML_LIB)
// through purego, as comm/cuda loads libcuda: the build needs no cgo and
// prints no warning. Where NVML is absent, Devices returns an error
// wrapping ErrUnavailable (and comm.ErrUnsupported) and nothing crashes.
package nvmlinfo

import (
	"fmt"
	"os"
	"strconv"

	"github.com/ranktree/ranktree/comm"
)

// ErrUnavailable says NVML could not be used on this machine: no driver,
// no libnvidia-ml, or no GPU. It wraps comm.ErrUnsupported.
var ErrUnavailable = fmt.Errorf("%w: NVML unavailable", comm.ErrUnsupported)

// Device is one GPU as NVML reports it.
type Device struct {
	Index     int    // NVML index (matches the CUDA ordinal under CUDA_DEVICE_ORDER=PCI_BUS_ID)
	Name      string // e.g. "NVIDIA H100 80GB HBM3"
	UUID      string // "GPU-8f0c…", as nvidia-smi -L
	PCIBusID  string // "00000000:18:00.0"
	MemoryMiB uint64 // total memory
}

// LocalDevice is the CUDA ordinal rank localRank should use among n
// visible GPUs: localRank mod n (c10d/torchrun: device = LOCAL_RANK). It
// returns an error wrapping comm.ErrInvalidArgument if n < 1 or localRank < 0.
func LocalDevice(localRank, n int) (int, error) {
	if n < 1 {
		return -1, fmt.Errorf("%w: no GPU visible for local rank %d", comm.ErrInvalidArgument, localRank)
	}
	if localRank < 0 {
		return -1, fmt.Errorf("%w: negative local rank %d", comm.ErrInvalidArgument, localRank)
	}
	return localRank % n, nil
}

// LocalRankFromEnv reads LOCAL_RANK (set by rankrunner and torchrun); 0 if
// unset, an error wrapping comm.ErrInvalidArgument if malformed.
func LocalRankFromEnv() (int, error) {
	s := os.Getenv("LOCAL_RANK")
	if s == "" {
		return 0, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%w: LOCAL_RANK=%q is not a non-negative integer", comm.ErrInvalidArgument, s)
	}
	return v, nil
}

// Count is the number of GPUs NVML sees, or 0 and an error wrapping
// ErrUnavailable. rankrunner uses it as the default --nproc-per-node.
func Count() (int, error) {
	ds, err := Devices()
	return len(ds), err
}
