package comm

import (
	"fmt"
	"unsafe"
)

// Buffer is a typed, contiguous run of elements: a Go slice in host memory
// (HostBuffer) or a device pointer (DeviceBuffer) that the NCCL engine uses.
// It plays the role of a dense, contiguous torch.Tensor in torch.distributed
// calls. A Buffer is a small value; copies share the memory. The zero Buffer
// is an invalid buffer (DType 0). A Buffer may carry a shape (WithShape),
// which collectives check across ranks.
type Buffer struct {
	dtype  DType
	count  int
	host   unsafe.Pointer // first element of the Go slice (keeps it alive); nil if empty or device
	dev    uintptr        // device pointer, for device buffers
	device int            // -1 for host memory, else the CUDA device ordinal
	stream uintptr        // caller's CUDA stream (0: the default/legacy stream); device only
	shape  *shapeInfo     // optional shape (WithShape); nil: a 1-D buffer of count elements
}

// HostBuffer wraps s without copying. Collectives read and write s in place;
// the caller must not touch s until the Work that uses it is done.
func HostBuffer[T Elem](s []T) Buffer {
	b := Buffer{dtype: DTypeOf[T](), count: len(s), device: -1}
	if len(s) > 0 {
		b.host = unsafe.Pointer(unsafe.SliceData(s))
	}
	return b
}

// NewHostBuffer allocates a zeroed host buffer of count elements of dt,
// in Go memory (the garbage collector frees it), aligned to 8 bytes.
//
// A buffer of at least HugePageBytes (2 MiB) starts on a 2 MiB boundary
// and, on Linux, its whole 2 MiB pages are backed by transparent huge
// pages, faulted in by NewHostBuffer (hostalloc_linux.go). Where huge
// pages are turned off (/sys/kernel/mm/transparent_hugepage/enabled:
// never), on other systems, or when the kernel has none free, it keeps 4
// KiB pages, silently. numpy does the same for its arrays (from 4 MiB),
// and so for the buffers of Open MPI's mpi4py benchmarks. It matters most
// for the single-copy transfers of two ranks on one host (cross-memory
// attach pins every page it reads): on the 2-core VM of 2026-12-06 a
// two-rank broadcast of 8 MiB took 224-238 µs with huge pages and 422-427
// µs without. Such a buffer takes up to 2 MiB more memory than its
// elements, for the alignment. Memory that comes from elsewhere
// (HostBuffer, HostBufferFromBytes) keeps the pages it has.
//
// It panics only if dt is invalid or count is negative (a programming error).
func NewHostBuffer(dt DType, count int) Buffer {
	if !dt.Valid() || count < 0 {
		panic(fmt.Sprintf("comm.NewHostBuffer(%v, %d): invalid arguments", dt, count))
	}
	if count == 0 {
		return Buffer{dtype: dt, device: -1}
	}
	return Buffer{dtype: dt, count: count, host: allocHost(count * dt.Size()), device: -1}
}

// HostBufferFromBytes views raw bytes as count elements of dt. len(p) must be
// a multiple of dt.Size(); p should be aligned to dt.Size() for speed.
func HostBufferFromBytes(dt DType, p []byte) (Buffer, error) {
	if !dt.Valid() {
		return Buffer{}, fmt.Errorf("%w: invalid dtype %v", ErrInvalidArgument, dt)
	}
	if len(p)%dt.Size() != 0 {
		return Buffer{}, fmt.Errorf("%w: %d bytes is not a whole number of %v elements", ErrInvalidArgument, len(p), dt)
	}
	b := Buffer{dtype: dt, count: len(p) / dt.Size(), device: -1}
	if len(p) > 0 {
		b.host = unsafe.Pointer(unsafe.SliceData(p))
	}
	return b, nil
}

// DeviceBuffer describes count elements of dt at device pointer ptr on CUDA
// device `device`, ordered after work already queued on `stream` (a CUstream;
// 0 for the legacy default stream). ranktree never dereferences ptr on the host.
func DeviceBuffer(ptr uintptr, count int, dt DType, device int, stream uintptr) Buffer {
	return Buffer{dtype: dt, count: count, dev: ptr, device: device, stream: stream}
}

// DType is the element type.
func (b Buffer) DType() DType { return b.dtype }

// Len is the number of elements.
func (b Buffer) Len() int { return b.count }

// NumBytes is Len() × DType().Size().
func (b Buffer) NumBytes() int { return b.count * b.dtype.Size() }

// IsHost reports whether the buffer lives in host memory.
func (b Buffer) IsHost() bool { return b.device < 0 }

// Device is the CUDA device ordinal, or -1 for host memory.
func (b Buffer) Device() int { return b.device }

// DevicePtr is the device pointer of a device buffer (0 for host buffers).
func (b Buffer) DevicePtr() uintptr { return b.dev }

// Stream is the caller's CUDA stream of a device buffer.
func (b Buffer) Stream() uintptr { return b.stream }

// Valid reports whether b has a valid dtype and a non-negative length.
func (b Buffer) Valid() bool { return b.dtype.Valid() && b.count >= 0 }

// Bytes views a host buffer's memory as bytes (nil for an empty or device
// buffer). Writes through the slice change the buffer.
func (b Buffer) Bytes() []byte {
	if b.host == nil || b.count == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(b.host), b.count*b.dtype.Size())
}

// Slice returns the view of elements [off, off+n), without a shape (a 1-D
// view). Out-of-range arguments panic, as slicing does.
func (b Buffer) Slice(off, n int) Buffer {
	if off < 0 || n < 0 || off+n > b.count {
		panic(fmt.Sprintf("comm.Buffer.Slice(%d, %d) out of range for %d elements", off, n, b.count))
	}
	s := b
	s.count = n
	s.shape = nil
	if n == 0 {
		s.host = nil
		if !b.IsHost() {
			s.dev = b.dev + uintptr(off*b.dtype.Size())
		}
		return s
	}
	if b.IsHost() {
		s.host = unsafe.Add(b.host, off*b.dtype.Size())
	} else {
		s.dev = b.dev + uintptr(off*b.dtype.Size())
	}
	return s
}

// String describes the buffer, e.g. "float32×1024", "float32×1024@cuda:0"
// or, with a shape, "float32×12 [3, 4]".
func (b Buffer) String() string {
	s := fmt.Sprintf("%v×%d", b.dtype, b.count)
	if !b.IsHost() {
		s += fmt.Sprintf("@cuda:%d", b.device)
	}
	if b.shape != nil {
		s += " " + FormatShape(b.shape.dims)
	}
	return s
}

// AsSlice returns a host buffer's memory as []T. It fails (wrapping
// ErrInvalidArgument) if T does not match the buffer's dtype or the buffer
// is on a device.
func AsSlice[T Elem](b Buffer) ([]T, error) {
	if dt := DTypeOf[T](); dt != b.dtype {
		return nil, fmt.Errorf("%w: buffer holds %v, not %v", ErrInvalidArgument, b.dtype, dt)
	}
	if !b.IsHost() {
		return nil, fmt.Errorf("%w: buffer is on cuda:%d, not in host memory", ErrInvalidArgument, b.device)
	}
	if b.count == 0 {
		return []T{}, nil
	}
	return unsafe.Slice((*T)(b.host), b.count), nil
}

// CopyBuffer copies min(dst.Len(), src.Len()) elements of host buffers of the
// same dtype and returns the number copied.
func CopyBuffer(dst, src Buffer) int {
	return copy(dst.Bytes(), src.Bytes()) / max(1, dst.dtype.Size())
}
