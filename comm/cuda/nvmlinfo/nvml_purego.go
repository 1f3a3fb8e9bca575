package nvmlinfo

import (
	"fmt"
	"os"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// LibEnv names the environment variable that overrides the NVML library
// path (tried first).
const LibEnv = "RANKTREE_NVML_LIB"

// nvmlSuccess is NVML_SUCCESS.
const nvmlSuccess = 0

// nvml holds NVML's entry points, resolved once at run time with purego
// (dlopen), so that the build needs no cgo and prints nothing.
type nvml struct {
	init, shutdown, errStr, getCount, getHandle, getName, getUUID, getPCI, getMemory uintptr
}

var (
	libOnce sync.Once
	lib     *nvml
	libErr  error
	mu      sync.Mutex // NVML Init/Shutdown pairs are process-wide
)

// load dlopens libnvidia-ml (RANKTREE_NVML_LIB, else libnvidia-ml.so.1,
// else libnvidia-ml.so) once and resolves the entry points Devices uses.
func load() (*nvml, error) {
	libOnce.Do(func() {
		cands := []string{"libnvidia-ml.so.1", "libnvidia-ml.so"}
		if p := os.Getenv(LibEnv); p != "" {
			cands = []string{p}
		}
		var errs []error
		for _, p := range cands {
			h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			l := &nvml{}
			for _, s := range []struct {
				dst   *uintptr
				names []string
			}{
				{&l.init, []string{"nvmlInit_v2", "nvmlInit"}},
				{&l.shutdown, []string{"nvmlShutdown"}},
				{&l.errStr, []string{"nvmlErrorString"}},
				{&l.getCount, []string{"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"}},
				{&l.getHandle, []string{"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"}},
				{&l.getName, []string{"nvmlDeviceGetName"}},
				{&l.getUUID, []string{"nvmlDeviceGetUUID"}},
				{&l.getPCI, []string{"nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2"}},
				{&l.getMemory, []string{"nvmlDeviceGetMemoryInfo"}},
			} {
				for _, n := range s.names {
					if a, err := purego.Dlsym(h, n); err == nil && a != 0 {
						*s.dst = a
						break
					}
				}
				if *s.dst == 0 {
					libErr = fmt.Errorf("%w: %s lacks %s", ErrUnavailable, p, s.names[0])
					return
				}
			}
			lib = l
			return
		}
		libErr = fmt.Errorf("%w: library not found (tried %v): %v", ErrUnavailable, cands, errs)
	})
	return lib, libErr
}

// call invokes an NVML function whose arguments are integers or pointers
// and returns its nvmlReturn_t.
//
//go:uintptrescapes
func call(fn uintptr, args ...uintptr) int32 {
	r, _, _ := purego.SyscallN(fn, args...)
	return int32(r)
}

// errorString is nvmlErrorString(r) (a static C string, copied by purego).
func (l *nvml) errorString(r int32) string {
	var f func(int32) string
	purego.RegisterFunc(&f, l.errStr)
	if s := f(r); s != "" {
		return s
	}
	return fmt.Sprintf("NVML error %d", r)
}

// cString is b up to its first NUL.
func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// pciInfo is nvmlPciInfo_t (nvml.h): busIdLegacy[16], five unsigned ints,
// busId[32].
type pciInfo struct {
	busIDLegacy                                      [16]byte
	domain, bus, device, pciDeviceID, pciSubSystemID uint32
	busID                                            [32]byte
}

// memoryInfo is nvmlMemory_t: total, free, used in bytes.
type memoryInfo struct{ total, free, used uint64 }

// Devices lists every GPU NVML sees, in NVML index order. It loads NVML at
// run time (no cgo), initializes it for the call and shuts it down after.
// Errors wrap ErrUnavailable with NVML's own reason (no library, no
// driver, no GPU).
func Devices() ([]Device, error) {
	l, err := load()
	if err != nil {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	if r := call(l.init); r != nvmlSuccess {
		return nil, fmt.Errorf("%w: nvmlInit: %s", ErrUnavailable, l.errorString(r))
	}
	defer call(l.shutdown)
	var n uint32
	if r := call(l.getCount, uintptr(unsafe.Pointer(&n))); r != nvmlSuccess {
		return nil, fmt.Errorf("%w: nvmlDeviceGetCount: %s", ErrUnavailable, l.errorString(r))
	}
	out := make([]Device, 0, n)
	for i := uint32(0); i < n; i++ {
		var h uintptr
		if r := call(l.getHandle, uintptr(i), uintptr(unsafe.Pointer(&h))); r != nvmlSuccess {
			return nil, fmt.Errorf("%w: nvmlDeviceGetHandleByIndex(%d): %s", ErrUnavailable, i, l.errorString(r))
		}
		d := Device{Index: int(i)}
		var name [96]byte // NVML_DEVICE_NAME_V2_BUFFER_SIZE
		if call(l.getName, h, uintptr(unsafe.Pointer(&name[0])), uintptr(len(name))) == nvmlSuccess {
			d.Name = cString(name[:])
		}
		var uuid [96]byte // ≥ NVML_DEVICE_UUID_V2_BUFFER_SIZE (96)
		if call(l.getUUID, h, uintptr(unsafe.Pointer(&uuid[0])), uintptr(len(uuid))) == nvmlSuccess {
			d.UUID = cString(uuid[:])
		}
		var pci pciInfo
		if call(l.getPCI, h, uintptr(unsafe.Pointer(&pci))) == nvmlSuccess {
			d.PCIBusID = cString(pci.busID[:])
		}
		var mem memoryInfo
		if call(l.getMemory, h, uintptr(unsafe.Pointer(&mem))) == nvmlSuccess {
			d.MemoryMiB = mem.total >> 20
		}
		out = append(out, d)
	}
	return out, nil
}
