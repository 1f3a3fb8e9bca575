package transport

import "unsafe"

// streamCopy copies src into dst (len(dst) >= len(src)) with
// non-temporal stores: the destination's cache lines are written to
// memory without first being read for ownership, and leave this core's
// cache (see slotCopier in shm_copy.go). The stores are ordered before
// any store that follows the call, so a ring counter published after it
// covers the data. The unaligned head and the tail below 128 bytes are
// copied with ordinary stores.
func streamCopy(dst, src []byte) {
	n := len(src)
	if n == 0 {
		return
	}
	head := int(-uintptr(unsafe.Pointer(&dst[0])) & 15)
	if n < head+128 {
		copy(dst, src)
		return
	}
	copy(dst[:head], src[:head])
	body := (n - head) &^ 127
	streamCopy128(&dst[head], &src[head], body)
	copy(dst[head+body:n], src[head+body:])
}

//go:noescape
func streamCopy128(dst, src *byte, n int)
