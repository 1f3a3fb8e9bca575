package kernel

import (
	"sync"
	"unsafe"
)

// blockElems is the number of elements widened to float32 at a time on the
// float16/bfloat16 path: two float32 blocks (16 KiB) stay in L1 while they
// are reduced.
const blockElems = 2048

// stageBytes is the block size of the staged path (misaligned or aliased
// buffers); a multiple of 8 so every dtype's elements stay whole.
const stageBytes = 8 << 10

// scratch is the per-call working memory, pooled so the hot path does not
// allocate. The uint64 arrays give 8-byte alignment for staged bytes.
type scratch struct {
	fa, fb [blockElems]float32
	sa, sb [stageBytes / 8]uint64
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

func getScratch() *scratch  { return scratchPool.Get().(*scratch) }
func putScratch(s *scratch) { scratchPool.Put(s) }

// stage views one of a scratch's staging arrays as bytes.
func stage(w *[stageBytes / 8]uint64) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), stageBytes)
}

// isAligned reports whether b's first byte is aligned to size (a power of two).
func isAligned(b []byte, size int) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))&uintptr(size-1) == 0
}

// view reinterprets b, which must be aligned for T, as a []T of
// len(b)/sizeof(T) elements sharing b's memory.
func view[T any](b []byte) []T {
	var z T
	n := len(b) / int(unsafe.Sizeof(z))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), n)
}

// overlap classifies two non-empty byte ranges: same start and length
// (an exact alias), some other overlap (partial), or disjoint.
func overlap(a, b []byte) (same, partial bool) {
	if len(a) == 0 || len(b) == 0 {
		return false, false
	}
	a0 := uintptr(unsafe.Pointer(unsafe.SliceData(a)))
	b0 := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if a0 == b0 && len(a) == len(b) {
		return true, false
	}
	return false, a0 < b0+uintptr(len(b)) && b0 < a0+uintptr(len(a))
}

// asBytes views a slice's memory as bytes.
func asBytes[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}
