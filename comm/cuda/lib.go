package cuda

import (
	"os"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// LibEnv names the environment variable that overrides the driver library
// path (tried first; e.g. a fake library in tests).
const LibEnv = "RANKTREE_CUDA_LIB"

// Lib is a loaded libcuda with its entry points resolved. Safe for
// concurrent use; the library is never unloaded.
type Lib struct {
	path string
	fn   fns
}

type fns struct {
	init, driverGetVersion, deviceGetCount, deviceGet, deviceGetName, deviceGetPCIBusID, deviceGetUUID uintptr
	primaryCtxRetain, primaryCtxRelease, ctxSetCurrent, ctxGetCurrent, ctxGetStreamPriorityRange       uintptr
	streamCreateWithPriority, streamDestroy, streamQuery, streamSynchronize, streamWaitEvent           uintptr
	eventCreate, eventDestroy, eventRecord, eventQuery, eventSynchronize                               uintptr
	memAlloc, memFree, memcpyHtoDAsync, memcpyDtoHAsync, memcpyDtoDAsync, memcpyHtoD, memcpyDtoH       uintptr
	memsetD8Async, memsetD32Async, streamWaitValue32, getErrorName, getErrorString                     uintptr
}

// symbols maps each entry point to its exported names, preferred first
// (the _v2 names are the ones cuda.h's macros select since CUDA 4.0/11.x).
func (f *fns) symbols() []struct {
	dst   *uintptr
	names []string
} {
	type s = struct {
		dst   *uintptr
		names []string
	}
	return []s{
		{&f.init, []string{"cuInit"}},
		{&f.driverGetVersion, []string{"cuDriverGetVersion"}},
		{&f.deviceGetCount, []string{"cuDeviceGetCount"}},
		{&f.deviceGet, []string{"cuDeviceGet"}},
		{&f.deviceGetName, []string{"cuDeviceGetName"}},
		{&f.deviceGetPCIBusID, []string{"cuDeviceGetPCIBusId"}},
		{&f.deviceGetUUID, []string{"cuDeviceGetUuid_v2", "cuDeviceGetUuid"}},
		{&f.primaryCtxRetain, []string{"cuDevicePrimaryCtxRetain"}},
		{&f.primaryCtxRelease, []string{"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"}},
		{&f.ctxSetCurrent, []string{"cuCtxSetCurrent"}},
		{&f.ctxGetCurrent, []string{"cuCtxGetCurrent"}},
		{&f.ctxGetStreamPriorityRange, []string{"cuCtxGetStreamPriorityRange"}},
		{&f.streamCreateWithPriority, []string{"cuStreamCreateWithPriority"}},
		{&f.streamDestroy, []string{"cuStreamDestroy_v2", "cuStreamDestroy"}},
		{&f.streamQuery, []string{"cuStreamQuery"}},
		{&f.streamSynchronize, []string{"cuStreamSynchronize"}},
		{&f.streamWaitEvent, []string{"cuStreamWaitEvent"}},
		{&f.eventCreate, []string{"cuEventCreate"}},
		{&f.eventDestroy, []string{"cuEventDestroy_v2", "cuEventDestroy"}},
		{&f.eventRecord, []string{"cuEventRecord"}},
		{&f.eventQuery, []string{"cuEventQuery"}},
		{&f.eventSynchronize, []string{"cuEventSynchronize"}},
		{&f.memAlloc, []string{"cuMemAlloc_v2"}},
		{&f.memFree, []string{"cuMemFree_v2"}},
		{&f.memcpyHtoDAsync, []string{"cuMemcpyHtoDAsync_v2"}},
		{&f.memcpyDtoHAsync, []string{"cuMemcpyDtoHAsync_v2"}},
		{&f.memcpyDtoDAsync, []string{"cuMemcpyDtoDAsync_v2"}},
		{&f.memcpyHtoD, []string{"cuMemcpyHtoD_v2"}},
		{&f.memcpyDtoH, []string{"cuMemcpyDtoH_v2"}},
		{&f.memsetD8Async, []string{"cuMemsetD8Async"}},
		{&f.memsetD32Async, []string{"cuMemsetD32Async"}},
		{&f.streamWaitValue32, []string{"cuStreamWaitValue32_v2", "cuStreamWaitValue32"}},
		{&f.getErrorName, []string{"cuGetErrorName"}},
		{&f.getErrorString, []string{"cuGetErrorString"}},
	}
}

var (
	loadOnce sync.Once
	loaded   *Lib
	loadErr  error
)

// Load loads the driver library once per process: the file named by
// RANKTREE_CUDA_LIB if set, else libcuda.so.1 through the dynamic loader's
// search path (LD_LIBRARY_PATH, ld.so.cache), else libcuda.so. A failure
// is a *LoadError wrapping ErrNoLibrary and is remembered.
func Load() (*Lib, error) {
	loadOnce.Do(func() {
		var cands []string
		if p := os.Getenv(LibEnv); p != "" {
			cands = []string{p}
		} else {
			cands = []string{"libcuda.so.1", "libcuda.so"}
		}
		loaded, loadErr = openFirst(cands)
	})
	return loaded, loadErr
}

// Open loads the driver library at path (a file path or a soname), without
// caching. Most callers want Load.
func Open(path string) (*Lib, error) { return openFirst([]string{path}) }

func openFirst(cands []string) (*Lib, error) {
	le := &LoadError{Lib: "libcuda", Tried: cands}
	for _, p := range cands {
		h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			le.Errs = append(le.Errs, err.Error())
			continue
		}
		l := &Lib{path: p}
		for _, s := range l.fn.symbols() {
			for _, name := range s.names {
				if a, err := purego.Dlsym(h, name); err == nil && a != 0 {
					*s.dst = a
					break
				}
			}
			if *s.dst == 0 {
				return nil, &LoadError{Lib: "libcuda", Tried: []string{p}, Symbol: s.names[0]}
			}
		}
		return l, nil
	}
	return nil, le
}

// Path is the path or soname the library was loaded from.
func (l *Lib) Path() string { return l.path }

// call invokes a driver function whose arguments are integers or pointers
// and returns its CUresult. Pointer arguments converted with
// uintptr(unsafe.Pointer(p)) in the call expression stay valid (the
// directive below moves them to the heap for the call).
//
//go:uintptrescapes
func call(fn uintptr, args ...uintptr) Result {
	r, _, _ := purego.SyscallN(fn, args...)
	return Result(int32(r))
}

// check turns a CUresult into nil or a *Error for function name.
func (l *Lib) check(name string, r Result) error {
	if r == Success {
		return nil
	}
	e := &Error{Call: name, Code: r, Name: "CUDA_ERROR_UNKNOWN", Msg: "unknown error"}
	var s *byte
	if call(l.fn.getErrorName, uintptr(r), uintptr(unsafe.Pointer(&s))) == Success && s != nil {
		e.Name = cString(s)
	}
	s = nil
	if call(l.fn.getErrorString, uintptr(r), uintptr(unsafe.Pointer(&s))) == Success && s != nil {
		e.Msg = cString(s)
	}
	return e
}

// cString copies a NUL-terminated C string (at most 4 KiB).
func cString(p *byte) string {
	if p == nil {
		return ""
	}
	var n int
	for n < 4096 && *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}
