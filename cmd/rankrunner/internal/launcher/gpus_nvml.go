//go:build cgo && linux

package launcher

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// GPUCount returns the number of NVIDIA GPUs NVML reports. libnvidia-ml is
// loaded lazily by nvml.Init (dlopen); when it is absent, or NVML fails,
// the count is 0 and err says why. It never panics.
func GPUCount() (n int, err error) {
	defer func() {
		if r := recover(); r != nil {
			n, err = 0, fmt.Errorf("launcher: NVML panicked: %v", r)
		}
	}()
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return 0, fmt.Errorf("launcher: NVML init: %v", nvml.ErrorString(ret))
	}
	defer nvml.Shutdown()
	c, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("launcher: NVML device count: %v", nvml.ErrorString(ret))
	}
	return c, nil
}
