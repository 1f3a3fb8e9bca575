//go:build !cgo || !linux

package nvmlinfo

import "fmt"

// Devices returns an error wrapping ErrUnavailable: this build has no cgo,
// which go-nvml needs.
func Devices() ([]Device, error) {
	return nil, fmt.Errorf("%w: built without cgo", ErrUnavailable)
}
