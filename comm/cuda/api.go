package cuda

import (
	"bytes"
	"fmt"
	"unsafe"
)

// Device is a CUdevice handle (cuDeviceGet).
type Device int32

// Context is a CUcontext.
type Context uintptr

// Stream is a CUstream; 0 is the legacy default stream.
type Stream uintptr

// Event is a CUevent.
type Event uintptr

// DevicePtr is a CUdeviceptr: an address in device memory.
type DevicePtr uintptr

// Flags for StreamCreate, EventCreate and StreamWaitValue32 (cuda.h).
const (
	StreamNonBlocking    uint32 = 0x1 // CU_STREAM_NON_BLOCKING: no implicit sync with stream 0
	EventDisableTiming   uint32 = 0x2 // CU_EVENT_DISABLE_TIMING: cheapest record/query
	StreamWaitValueGEQ   uint32 = 0x0 // CU_STREAM_WAIT_VALUE_GEQ: (int32)(*addr - value) >= 0
	StreamWaitValueEQ    uint32 = 0x1 // CU_STREAM_WAIT_VALUE_EQ
	StreamWaitValueAND   uint32 = 0x2 // CU_STREAM_WAIT_VALUE_AND: (*addr & value) != 0
	StreamWaitValueFlush uint32 = 1 << 30
)

// Init initializes the driver (cuInit(0)); call it before anything else.
func (l *Lib) Init() error { return l.check("cuInit", call(l.fn.init, 0)) }

// DriverVersion is the driver's CUDA version, e.g. 12080 for 12.8.
func (l *Lib) DriverVersion() (int, error) {
	v := new(int32)
	err := l.check("cuDriverGetVersion", call(l.fn.driverGetVersion, uintptr(unsafe.Pointer(v))))
	return int(*v), err
}

// DeviceCount is the number of CUDA devices visible to the process.
func (l *Lib) DeviceCount() (int, error) {
	n := new(int32)
	err := l.check("cuDeviceGetCount", call(l.fn.deviceGetCount, uintptr(unsafe.Pointer(n))))
	return int(*n), err
}

// DeviceGet returns the handle of device ordinal ord.
func (l *Lib) DeviceGet(ord int) (Device, error) {
	d := new(int32)
	err := l.check("cuDeviceGet", call(l.fn.deviceGet, uintptr(unsafe.Pointer(d)), uintptr(ord)))
	return Device(*d), err
}

// DeviceName is the device's marketing name (cuDeviceGetName).
func (l *Lib) DeviceName(d Device) (string, error) {
	buf := make([]byte, 256)
	if err := l.check("cuDeviceGetName", call(l.fn.deviceGetName, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(d))); err != nil {
		return "", err
	}
	return cTrim(buf), nil
}

// DevicePCIBusID is the device's PCI bus id, "domain:bus:device.function".
func (l *Lib) DevicePCIBusID(d Device) (string, error) {
	buf := make([]byte, 64)
	if err := l.check("cuDeviceGetPCIBusId", call(l.fn.deviceGetPCIBusID, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(d))); err != nil {
		return "", err
	}
	return cTrim(buf), nil
}

// DeviceUUID is the device's 16-byte UUID (cuDeviceGetUuid_v2).
func (l *Lib) DeviceUUID(d Device) ([16]byte, error) {
	u := new([16]byte)
	err := l.check("cuDeviceGetUuid", call(l.fn.deviceGetUUID, uintptr(unsafe.Pointer(u)), uintptr(d)))
	return *u, err
}

// FormatUUID renders a device UUID as nvidia-smi does: "GPU-xxxxxxxx-xxxx-...".
func FormatUUID(u [16]byte) string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// PrimaryCtxRetain retains device d's primary context (the one the CUDA
// runtime, NCCL and PyTorch use). Release it with PrimaryCtxRelease.
func (l *Lib) PrimaryCtxRetain(d Device) (Context, error) {
	c := new(uintptr)
	err := l.check("cuDevicePrimaryCtxRetain", call(l.fn.primaryCtxRetain, uintptr(unsafe.Pointer(c)), uintptr(d)))
	return Context(*c), err
}

// PrimaryCtxRelease releases one retain of device d's primary context.
func (l *Lib) PrimaryCtxRelease(d Device) error {
	return l.check("cuDevicePrimaryCtxRelease", call(l.fn.primaryCtxRelease, uintptr(d)))
}

// CtxSetCurrent binds c to the calling OS thread (lock the goroutine's
// thread first with runtime.LockOSThread).
func (l *Lib) CtxSetCurrent(c Context) error {
	return l.check("cuCtxSetCurrent", call(l.fn.ctxSetCurrent, uintptr(c)))
}

// CtxGetCurrent is the context bound to the calling OS thread (0 if none).
func (l *Lib) CtxGetCurrent() (Context, error) {
	c := new(uintptr)
	err := l.check("cuCtxGetCurrent", call(l.fn.ctxGetCurrent, uintptr(unsafe.Pointer(c))))
	return Context(*c), err
}

// StreamPriorityRange is the current context's stream priorities: least
// (usually 0) and greatest (a negative number; lower is higher priority).
func (l *Lib) StreamPriorityRange() (least, greatest int, err error) {
	lo, hi := new(int32), new(int32)
	err = l.check("cuCtxGetStreamPriorityRange", call(l.fn.ctxGetStreamPriorityRange, uintptr(unsafe.Pointer(lo)), uintptr(unsafe.Pointer(hi))))
	return int(*lo), int(*hi), err
}

// StreamCreate creates a stream in the current context with flags (e.g.
// StreamNonBlocking) and priority (0 normal; see StreamPriorityRange).
func (l *Lib) StreamCreate(flags uint32, priority int) (Stream, error) {
	s := new(uintptr)
	err := l.check("cuStreamCreateWithPriority", call(l.fn.streamCreateWithPriority, uintptr(unsafe.Pointer(s)), uintptr(flags), uintptr(int64(priority))))
	return Stream(*s), err
}

// StreamDestroy destroys s; work already queued on it still completes.
func (l *Lib) StreamDestroy(s Stream) error {
	return l.check("cuStreamDestroy_v2", call(l.fn.streamDestroy, uintptr(s)))
}

// StreamQuery reports whether all work queued on s has completed.
func (l *Lib) StreamQuery(s Stream) (bool, error) {
	r := call(l.fn.streamQuery, uintptr(s))
	if r == ErrorNotReady {
		return false, nil
	}
	return r == Success, l.check("cuStreamQuery", r)
}

// StreamSynchronize blocks the calling thread until s is idle.
func (l *Lib) StreamSynchronize(s Stream) error {
	return l.check("cuStreamSynchronize", call(l.fn.streamSynchronize, uintptr(s)))
}

// StreamWaitEvent makes later work on s wait for e's most recent record.
func (l *Lib) StreamWaitEvent(s Stream, e Event) error {
	return l.check("cuStreamWaitEvent", call(l.fn.streamWaitEvent, uintptr(s), uintptr(e), 0))
}

// StreamWaitValue32 makes later work on s wait until the 32-bit word at
// addr satisfies flags' condition against value (cuStreamWaitValue32_v2).
// Tests use it to hang a stream on purpose.
func (l *Lib) StreamWaitValue32(s Stream, addr DevicePtr, value, flags uint32) error {
	return l.check("cuStreamWaitValue32", call(l.fn.streamWaitValue32, uintptr(s), uintptr(addr), uintptr(value), uintptr(flags)))
}

// EventCreate creates an event (pass EventDisableTiming for sync-only events).
func (l *Lib) EventCreate(flags uint32) (Event, error) {
	e := new(uintptr)
	err := l.check("cuEventCreate", call(l.fn.eventCreate, uintptr(unsafe.Pointer(e)), uintptr(flags)))
	return Event(*e), err
}

// EventDestroy destroys e (deferred by the driver while a record is pending).
func (l *Lib) EventDestroy(e Event) error {
	return l.check("cuEventDestroy_v2", call(l.fn.eventDestroy, uintptr(e)))
}

// EventRecord captures s's current work in e.
func (l *Lib) EventRecord(e Event, s Stream) error {
	return l.check("cuEventRecord", call(l.fn.eventRecord, uintptr(e), uintptr(s)))
}

// EventQuery reports whether the work captured by e's last record is done
// (true for an event never recorded). CUDA_ERROR_NOT_READY is (false, nil).
func (l *Lib) EventQuery(e Event) (bool, error) {
	r := call(l.fn.eventQuery, uintptr(e))
	if r == ErrorNotReady {
		return false, nil
	}
	return r == Success, l.check("cuEventQuery", r)
}

// EventSynchronize blocks the calling thread until e completes.
func (l *Lib) EventSynchronize(e Event) error {
	return l.check("cuEventSynchronize", call(l.fn.eventSynchronize, uintptr(e)))
}

// MemAlloc allocates bytes of device memory in the current context.
func (l *Lib) MemAlloc(bytes int) (DevicePtr, error) {
	p := new(uintptr)
	err := l.check("cuMemAlloc_v2", call(l.fn.memAlloc, uintptr(unsafe.Pointer(p)), uintptr(bytes)))
	return DevicePtr(*p), err
}

// MemFree frees device memory from MemAlloc.
func (l *Lib) MemFree(p DevicePtr) error {
	return l.check("cuMemFree_v2", call(l.fn.memFree, uintptr(p)))
}

// MemcpyHtoDAsync queues a copy of src (host bytes) to dst on s. src must
// stay alive and unchanged until s has passed the copy.
func (l *Lib) MemcpyHtoDAsync(dst DevicePtr, src []byte, s Stream) error {
	if len(src) == 0 {
		return nil
	}
	return l.check("cuMemcpyHtoDAsync_v2", call(l.fn.memcpyHtoDAsync, uintptr(dst), uintptr(unsafe.Pointer(&src[0])), uintptr(len(src)), uintptr(s)))
}

// MemcpyDtoHAsync queues a copy of len(dst) bytes at src into dst on s; dst
// holds the data once s has passed the copy.
func (l *Lib) MemcpyDtoHAsync(dst []byte, src DevicePtr, s Stream) error {
	if len(dst) == 0 {
		return nil
	}
	return l.check("cuMemcpyDtoHAsync_v2", call(l.fn.memcpyDtoHAsync, uintptr(unsafe.Pointer(&dst[0])), uintptr(src), uintptr(len(dst)), uintptr(s)))
}

// MemcpyDtoDAsync queues a device-to-device copy of bytes on s.
func (l *Lib) MemcpyDtoDAsync(dst, src DevicePtr, bytes int, s Stream) error {
	return l.check("cuMemcpyDtoDAsync_v2", call(l.fn.memcpyDtoDAsync, uintptr(dst), uintptr(src), uintptr(bytes), uintptr(s)))
}

// MemcpyHtoD copies src to dst synchronously.
func (l *Lib) MemcpyHtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return l.check("cuMemcpyHtoD_v2", call(l.fn.memcpyHtoD, uintptr(dst), uintptr(unsafe.Pointer(&src[0])), uintptr(len(src))))
}

// MemcpyDtoH copies len(dst) bytes at src into dst synchronously.
func (l *Lib) MemcpyDtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	return l.check("cuMemcpyDtoH_v2", call(l.fn.memcpyDtoH, uintptr(unsafe.Pointer(&dst[0])), uintptr(src), uintptr(len(dst))))
}

// MemsetD8Async queues setting n bytes at dst to v on s.
func (l *Lib) MemsetD8Async(dst DevicePtr, v uint8, n int, s Stream) error {
	return l.check("cuMemsetD8Async", call(l.fn.memsetD8Async, uintptr(dst), uintptr(v), uintptr(n), uintptr(s)))
}

// MemsetD32Async queues setting n 32-bit words at dst to v on s.
func (l *Lib) MemsetD32Async(dst DevicePtr, v uint32, n int, s Stream) error {
	return l.check("cuMemsetD32Async", call(l.fn.memsetD32Async, uintptr(dst), uintptr(v), uintptr(n), uintptr(s)))
}

func cTrim(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}
