//go:build !cgo || !linux

package launcher

import "errors"

// GPUCount reports 0 GPUs: this rankrunner was built without cgo, which
// go-nvml needs, so NVML cannot be queried.
func GPUCount() (int, error) {
	return 0, errors.New("launcher: rankrunner built without cgo; NVML unavailable")
}
