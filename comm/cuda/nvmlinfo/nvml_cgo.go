//go:build cgo && linux

package nvmlinfo

import (
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

var mu sync.Mutex

// Devices lists every GPU NVML sees, in NVML index order. It initializes
// NVML for the call and shuts it down after. It never panics: a panic
// inside go-nvml comes back as an error wrapping ErrUnavailable.
func Devices() (ds []Device, err error) {
	mu.Lock()
	defer mu.Unlock()
	defer func() {
		if r := recover(); r != nil {
			ds, err = nil, fmt.Errorf("%w: NVML panicked: %v", ErrUnavailable, r)
		}
	}()
	if r := nvml.Init(); r != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: nvmlInit: %s", ErrUnavailable, nvml.ErrorString(r))
	}
	defer nvml.Shutdown()
	n, r := nvml.DeviceGetCount()
	if r != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: nvmlDeviceGetCount: %s", ErrUnavailable, nvml.ErrorString(r))
	}
	out := make([]Device, 0, n)
	for i := 0; i < n; i++ {
		h, r := nvml.DeviceGetHandleByIndex(i)
		if r != nvml.SUCCESS {
			return nil, fmt.Errorf("%w: nvmlDeviceGetHandleByIndex(%d): %s", ErrUnavailable, i, nvml.ErrorString(r))
		}
		d := Device{Index: i}
		d.Name, _ = h.GetName()
		d.UUID, _ = h.GetUUID()
		if pci, r := h.GetPciInfo(); r == nvml.SUCCESS {
			d.PCIBusID = int8String(pci.BusId[:])
		}
		if mem, r := h.GetMemoryInfo(); r == nvml.SUCCESS {
			d.MemoryMiB = mem.Total >> 20
		}
		out = append(out, d)
	}
	return out, nil
}

func int8String(b []int8) string {
	s := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}
