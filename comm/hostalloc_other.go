//go:build !linux

package comm

import (
	"errors"
	"unsafe"
)

// hugePages is Linux's (hostalloc_linux.go); elsewhere the buffer keeps
// the pages it has.
func hugePages(p unsafe.Pointer, n int) error {
	return errors.ErrUnsupported
}
