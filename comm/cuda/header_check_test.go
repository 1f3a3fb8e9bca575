package cuda

// Header checks: this package binds libcuda at run time from our own
// reading of cuda.h. TestHeaderCUDA compiles small C programs against a
// real cuda.h (with internal/cheader) and compares every CUresult value
// and flag we mirror, the sizes of the handle types, and the C prototype
// of every entry point we bind with the Go side. It needs gcc and
// RANKTREE_CUDA_INCLUDE (a colon-separated list of include directories
// holding cuda.h), which scripts/reallib-check.sh sets; without the
// variable it skips. The other TestHeaderCUDA* tests need no headers: they
// check that the tables below cover every symbol, call and constant of the
// package's source.

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/ranktree/ranktree/internal/cheader"
)

const envCUDAInclude = "RANKTREE_CUDA_INCLUDE"

// hdrCUDAProtos gives the prototype for every name in lib.go's symbols(),
// fallbacks included (a fallback has its preferred name's prototype). Byte
// counts are size_t (Go passes uintptr(int)), device addresses
// CUdeviceptr (64-bit), handles pointers.
var hdrCUDAProtos = []cheader.Proto{
	cheader.NewProto("cuInit", "CUresult", "unsigned int"),
	cheader.NewProto("cuDriverGetVersion", "CUresult", "int*"),
	cheader.NewProto("cuDeviceGetCount", "CUresult", "int*"),
	cheader.NewProto("cuDeviceGet", "CUresult", "CUdevice*", "int"),
	cheader.NewProto("cuDeviceGetName", "CUresult", "char*", "int", "CUdevice"),
	cheader.NewProto("cuDeviceGetPCIBusId", "CUresult", "char*", "int", "CUdevice"),
	cheader.NewProto("cuDeviceGetUuid_v2", "CUresult", "CUuuid*", "CUdevice"),
	cheader.NewProto("cuDeviceGetUuid", "CUresult", "CUuuid*", "CUdevice"),
	cheader.NewProto("cuDevicePrimaryCtxRetain", "CUresult", "CUcontext*", "CUdevice"),
	cheader.NewProto("cuDevicePrimaryCtxRelease_v2", "CUresult", "CUdevice"),
	cheader.NewProto("cuDevicePrimaryCtxRelease", "CUresult", "CUdevice"),
	cheader.NewProto("cuCtxSetCurrent", "CUresult", "CUcontext"),
	cheader.NewProto("cuCtxGetCurrent", "CUresult", "CUcontext*"),
	cheader.NewProto("cuCtxGetStreamPriorityRange", "CUresult", "int*", "int*"),
	cheader.NewProto("cuStreamCreateWithPriority", "CUresult", "CUstream*", "unsigned int", "int"),
	cheader.NewProto("cuStreamDestroy_v2", "CUresult", "CUstream"),
	cheader.NewProto("cuStreamDestroy", "CUresult", "CUstream"),
	cheader.NewProto("cuStreamQuery", "CUresult", "CUstream"),
	cheader.NewProto("cuStreamSynchronize", "CUresult", "CUstream"),
	cheader.NewProto("cuStreamWaitEvent", "CUresult", "CUstream", "CUevent", "unsigned int"),
	cheader.NewProto("cuEventCreate", "CUresult", "CUevent*", "unsigned int"),
	cheader.NewProto("cuEventDestroy_v2", "CUresult", "CUevent"),
	cheader.NewProto("cuEventDestroy", "CUresult", "CUevent"),
	cheader.NewProto("cuEventRecord", "CUresult", "CUevent", "CUstream"),
	cheader.NewProto("cuEventQuery", "CUresult", "CUevent"),
	cheader.NewProto("cuEventSynchronize", "CUresult", "CUevent"),
	cheader.NewProto("cuMemAlloc_v2", "CUresult", "CUdeviceptr*", "size_t"),
	cheader.NewProto("cuMemFree_v2", "CUresult", "CUdeviceptr"),
	cheader.NewProto("cuMemcpyHtoDAsync_v2", "CUresult", "CUdeviceptr", "const void*", "size_t", "CUstream"),
	cheader.NewProto("cuMemcpyDtoHAsync_v2", "CUresult", "void*", "CUdeviceptr", "size_t", "CUstream"),
	cheader.NewProto("cuMemcpyDtoDAsync_v2", "CUresult", "CUdeviceptr", "CUdeviceptr", "size_t", "CUstream"),
	cheader.NewProto("cuMemcpyHtoD_v2", "CUresult", "CUdeviceptr", "const void*", "size_t"),
	cheader.NewProto("cuMemcpyDtoH_v2", "CUresult", "void*", "CUdeviceptr", "size_t"),
	cheader.NewProto("cuMemsetD8Async", "CUresult", "CUdeviceptr", "unsigned char", "size_t", "CUstream"),
	cheader.NewProto("cuMemsetD32Async", "CUresult", "CUdeviceptr", "unsigned int", "size_t", "CUstream"),
	cheader.NewProto("cuStreamWaitValue32_v2", "CUresult", "CUstream", "CUdeviceptr", "cuuint32_t", "unsigned int"),
	cheader.NewProto("cuStreamWaitValue32", "CUresult", "CUstream", "CUdeviceptr", "cuuint32_t", "unsigned int"),
	cheader.NewProto("cuGetErrorName", "CUresult", "CUresult", "const char**"),
	cheader.NewProto("cuGetErrorString", "CUresult", "CUresult", "const char**"),
}

func hdrCUDAProto(name string) (cheader.Proto, bool) {
	for _, p := range hdrCUDAProtos {
		if p.Name == name {
			return p, true
		}
	}
	return cheader.Proto{}, false
}

// hdrCUDAConsts pairs each Go constant with the cuda.h enum value it
// mirrors.
var hdrCUDAConsts = []struct {
	goName, cName string
	val           int64
}{
	{"Success", "CUDA_SUCCESS", int64(Success)},
	{"ErrorNotReady", "CUDA_ERROR_NOT_READY", int64(ErrorNotReady)},
	{"StreamNonBlocking", "CU_STREAM_NON_BLOCKING", int64(StreamNonBlocking)},
	{"EventDisableTiming", "CU_EVENT_DISABLE_TIMING", int64(EventDisableTiming)},
	{"StreamWaitValueGEQ", "CU_STREAM_WAIT_VALUE_GEQ", int64(StreamWaitValueGEQ)},
	{"StreamWaitValueEQ", "CU_STREAM_WAIT_VALUE_EQ", int64(StreamWaitValueEQ)},
	{"StreamWaitValueAND", "CU_STREAM_WAIT_VALUE_AND", int64(StreamWaitValueAND)},
	{"StreamWaitValueFlush", "CU_STREAM_WAIT_VALUE_FLUSH", int64(StreamWaitValueFlush)},
}

// hdrCUDASizes pairs C types with the size of the Go type that mirrors
// them.
var hdrCUDASizes = []struct {
	cType string
	size  uintptr
}{
	{"CUresult", unsafe.Sizeof(Result(0))},
	{"CUdevice", unsafe.Sizeof(Device(0))},
	{"CUcontext", unsafe.Sizeof(Context(0))},
	{"CUstream", unsafe.Sizeof(Stream(0))},
	{"CUevent", unsafe.Sizeof(Event(0))},
	{"CUdeviceptr", unsafe.Sizeof(DevicePtr(0))},
	{"CUuuid", unsafe.Sizeof([16]byte{})}, // DeviceUUID's buffer
}

// hdrCUDASymbols returns lib.go's symbols() table as the fns field name
// and the exported names, preferred first.
func hdrCUDASymbols() []struct {
	field string
	names []string
} {
	var f fns
	v := reflect.ValueOf(&f).Elem()
	fieldOf := map[*uintptr]string{}
	for i := range v.NumField() {
		fieldOf[(*uintptr)(v.Field(i).Addr().UnsafePointer())] = v.Type().Field(i).Name
	}
	var out []struct {
		field string
		names []string
	}
	for _, s := range f.symbols() {
		out = append(out, struct {
			field string
			names []string
		}{fieldOf[s.dst], s.names})
	}
	return out
}

// TestHeaderCUDA checks the binding against a real cuda.h (see the top of
// this file).
func TestHeaderCUDA(t *testing.T) {
	dirs := cheader.IncludeDirs(t, envCUDAInclude)
	text := cheader.Preprocess(t, dirs, "cuda.h")

	// For each symbols() entry, the first name cuda.h declares.
	var protos []cheader.Proto
	var missing []string
	for _, s := range hdrCUDASymbols() {
		found := false
		for _, n := range s.names {
			if cheader.Declares(text, n) {
				p, ok := hdrCUDAProto(n)
				if !ok {
					t.Errorf("%s: no prototype in hdrCUDAProtos", n)
				} else {
					protos = append(protos, p)
				}
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, strings.Join(s.names, "/"))
		}
	}
	for _, m := range missing {
		t.Errorf("cuda.h declares none of %s", m)
	}

	var b strings.Builder
	b.WriteString("#include <stdio.h>\n#include <cuda.h>\nint main(void) {\n")
	b.WriteString("\tprintf(\"version %d\\n\", CUDA_VERSION);\n")
	for _, c := range hdrCUDAConsts {
		fmt.Fprintf(&b, "\tprintf(\"const %s %%lld\\n\", (long long)(%s));\n", c.cName, c.cName)
	}
	for _, s := range hdrCUDASizes {
		fmt.Fprintf(&b, "\tprintf(\"sizeof %s %%zu\\n\", sizeof(%s));\n", s.cType, s.cType)
	}
	for _, p := range protos {
		for _, ty := range append([]string{p.Ret}, p.Params...) {
			fmt.Fprintf(&b, "\tprintf(\"argsize %s %%zu\\n\", sizeof(%s));\n", p.Name, ty)
		}
	}
	b.WriteString("\treturn 0;\n}\n")
	var version int64
	consts, sizes, argSizes := map[string]int64{}, map[string]int64{}, map[string][]int64{}
	for _, l := range cheader.CompileRun(t, dirs, b.String()) {
		n, err := strconv.ParseInt(l[len(l)-1], 10, 64)
		if err != nil {
			t.Fatalf("C program output %q: %v", l, err)
		}
		switch l[0] {
		case "version":
			version = n
		case "const":
			consts[l[1]] = n
		case "sizeof":
			sizes[l[1]] = n
		case "argsize":
			argSizes[l[1]] = append(argSizes[l[1]], n)
		}
	}
	t.Logf("checked against cuda.h CUDA_VERSION %d (%d.%d) in %s", version, version/1000, version%1000/10, strings.Join(dirs, ":"))

	t.Run("Constants", func(t *testing.T) {
		for _, c := range hdrCUDAConsts {
			if got := consts[c.cName]; got != c.val {
				t.Errorf("%s: cuda.h has %d, Go's %s is %d", c.cName, got, c.goName, c.val)
			}
		}
		for _, s := range hdrCUDASizes {
			if got := sizes[s.cType]; got != int64(s.size) {
				t.Errorf("sizeof(%s) is %d, the Go type's size %d", s.cType, got, s.size)
			}
		}
		t.Logf("%d constants and %d type sizes compared", len(consts), len(sizes))
	})

	t.Run("Signatures", func(t *testing.T) {
		// Every argument goes through call as a uintptr, so it must fit a
		// register; the result is read as an int32 CUresult.
		for _, p := range protos {
			sz := argSizes[p.Name]
			if sz[0] != 4 {
				t.Errorf("%s returns %d bytes; call reads an int32", p.Name, sz[0])
			}
			for i, n := range sz[1:] {
				if n > int64(unsafe.Sizeof(uintptr(0))) {
					t.Errorf("%s: parameter %d (%s) is %d bytes, more than the uintptr call passes", p.Name, i+1, p.Params[i], n)
				}
			}
		}
		cheader.CheckSignatures(t, dirs, "cuda.h", protos)
	})
}

// TestHeaderCUDASymbolTable needs no headers: hdrCUDAProtos has a
// prototype for exactly the names in lib.go's symbols().
func TestHeaderCUDASymbolTable(t *testing.T) {
	var bound []string
	for _, s := range hdrCUDASymbols() {
		bound = append(bound, s.names...)
	}
	for _, n := range bound {
		if _, ok := hdrCUDAProto(n); !ok {
			t.Errorf("lib.go's symbols() has %s, which hdrCUDAProtos lacks", n)
		}
	}
	for _, p := range hdrCUDAProtos {
		if !slices.Contains(bound, p.Name) {
			t.Errorf("hdrCUDAProtos lists %s, which lib.go's symbols() lacks", p.Name)
		}
	}
}

// TestHeaderCUDACalls needs no headers: every call site passes as many
// arguments as the prototypes of its symbol's names have parameters, and
// every numeric constant of the package is in hdrCUDAConsts.
func TestHeaderCUDACalls(t *testing.T) {
	files := cheader.ParseGoPackage(t, ".", "cuda")
	arity := cheader.CallArity(files)
	for _, s := range hdrCUDASymbols() {
		if len(arity[s.field]) == 0 {
			t.Errorf("%s: no call(l.fn.%s, ...) in the package", s.names[0], s.field)
		}
		for _, name := range s.names {
			p, ok := hdrCUDAProto(name)
			if !ok {
				continue // TestHeaderCUDASymbolTable reports it
			}
			for _, n := range arity[s.field] {
				if n != len(p.Params) {
					t.Errorf("%s: a call passes %d arguments; the prototype %s has %d", name, n, p, len(p.Params))
				}
			}
		}
	}
	var listed []string
	for _, c := range hdrCUDAConsts {
		listed = append(listed, c.goName)
	}
	for _, n := range cheader.ConstNames(files) {
		if !slices.Contains(listed, n) {
			t.Errorf("constant %s is not in hdrCUDAConsts: add the C name it mirrors", n)
		}
	}
}
