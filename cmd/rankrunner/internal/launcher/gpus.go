package launcher

import "github.com/ranktree/ranktree/comm/cuda/nvmlinfo"

// GPUCount returns the number of NVIDIA GPUs NVML reports (nvmlinfo.Count):
// rankrunner's --nproc-per-node auto/gpu. Where NVML is absent, the driver
// is not loaded or there is no GPU, the count is 0 and
// err (wrapping nvmlinfo.ErrUnavailable) says why. It never panics.
func GPUCount() (int, error) { return nvmlinfo.Count() }
