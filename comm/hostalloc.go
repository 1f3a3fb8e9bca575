package comm

import "unsafe"

// HugePageBytes is the size of a transparent huge page (x86-64 and arm64
// with 4 KiB base pages): NewHostBuffer backs a buffer of at least this
// many bytes with huge pages where the kernel allows (hugePages).
const HugePageBytes = 2 << 20

// allocHost allocates n > 0 zeroed bytes of Go memory, 8-byte aligned, and
// returns a pointer to the first; the pointer keeps the allocation alive
// (an interior pointer does too). From HugePageBytes up it allocates
// HugePageBytes more, returns the first 2 MiB boundary in it and asks
// for huge pages on the whole 2 MiB pages of the n bytes from there
// (hugePages; a failure leaves 4 KiB pages, which serve as well).
func allocHost(n int) unsafe.Pointer {
	if n < HugePageBytes {
		words := make([]uint64, (n+7)/8)
		return unsafe.Pointer(&words[0])
	}
	words := make([]uint64, (n+HugePageBytes)/8)
	p := unsafe.Pointer(&words[0])
	p = unsafe.Add(p, -int(uintptr(p))&(HugePageBytes-1))
	_ = hugePages(p, n&^(HugePageBytes-1))
	return p
}
