package nccl

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/ranktree/ranktree/comm/cuda"
)

// LibEnv names the environment variable that overrides the NCCL library
// path; it is tried first.
const LibEnv = "RANKTREE_NCCL_LIB"

var configSize = unsafe.Sizeof(Config{})

// Lib is a loaded libnccl with its entry points resolved. Safe for
// concurrent use (NCCL's own rules about which calls may overlap on one
// communicator still apply); never unloaded.
type Lib struct {
	path string
	fn   struct {
		getVersion, getUniqueID, commGetAsyncError, commAbort, commFinalize, commDestroy uintptr
		commSplit, commCount, commUserRank, commCuDevice, getErrorString, getLastError   uintptr
		allReduce, broadcast, reduce, allGather, reduceScatter, send, recv               uintptr
		groupStart, groupEnd, redOpCreatePreMulSum, redOpDestroy                         uintptr
	}
	commInitRankConfig func(comm *uintptr, nranks int32, id UniqueID, rank int32, cfg *Config) int32
	version            int
}

var (
	loadOnce sync.Once
	loaded   *Lib
	loadErr  error
)

// Load loads libnccl once per process. Candidates, in order: the file
// named by RANKTREE_NCCL_LIB; libnccl.so.2 through the dynamic loader
// (LD_LIBRARY_PATH, ld.so.cache); the lib folder of the pip wheel
// nvidia-nccl-cu12/cu13 (site-packages/nvidia/nccl/lib/libnccl.so.2) under
// $VIRTUAL_ENV, $CONDA_PREFIX, the common system and user site folders and,
// last, python3's own site folders (asked with a 3 s bound). A failure is
// a *cuda.LoadError wrapping cuda.ErrNoLibrary (and comm.ErrUnsupported).
func Load() (*Lib, error) {
	loadOnce.Do(func() {
		if p := os.Getenv(LibEnv); p != "" {
			loaded, loadErr = Open(p)
			return
		}
		tried := &cuda.LoadError{Lib: "libnccl"}
		try := func(p string) bool {
			l, err := Open(p)
			if err == nil {
				loaded, loadErr = l, nil
				return true
			}
			tried.Tried = append(tried.Tried, p)
			tried.Errs = append(tried.Errs, err.Error())
			return false
		}
		if try("libnccl.so.2") {
			return
		}
		for _, p := range wheelCandidates(false) {
			if try(p) {
				return
			}
		}
		for _, p := range wheelCandidates(true) {
			if try(p) {
				return
			}
		}
		loadErr = tried
	})
	return loaded, loadErr
}

// wheelCandidates lists existing site-packages/nvidia/nccl/lib/libnccl.so.2
// files (then any site-packages/nvidia/*/lib/libnccl.so.2): from well-known
// prefixes, or (askPython) from python3's site dirs.
func wheelCandidates(askPython bool) []string {
	var sites []string
	if askPython {
		py, err := exec.LookPath("python3")
		if err != nil {
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, py, "-c",
			"import site,sys;print('\\n'.join(site.getsitepackages()+[site.getusersitepackages()]+sys.path))").Output()
		if err != nil {
			return nil
		}
		sites = strings.Fields(string(out))
	} else {
		var pats []string
		for _, pre := range []string{os.Getenv("VIRTUAL_ENV"), os.Getenv("CONDA_PREFIX"), "/usr/local", "/usr", "/opt/conda"} {
			if pre != "" {
				pats = append(pats, filepath.Join(pre, "lib", "python3*", "*-packages"))
			}
		}
		if home, err := os.UserHomeDir(); err == nil {
			pats = append(pats, filepath.Join(home, ".local", "lib", "python3*", "site-packages"))
		}
		pats = append(pats, "/usr/lib/python3/dist-packages")
		for _, pat := range pats {
			m, _ := filepath.Glob(pat)
			sort.Sort(sort.Reverse(sort.StringSlice(m))) // newest python first
			sites = append(sites, m...)
		}
	}
	var out []string
	seen := map[string]bool{}
	for _, s := range sites {
		// nvidia-nccl-cu12/cu13 install nvidia/nccl/lib; any other
		// nvidia/<pkg>/lib (a consolidated cu13 folder) comes after it.
		ps := []string{filepath.Join(s, "nvidia", "nccl", "lib", "libnccl.so.2")}
		m, _ := filepath.Glob(filepath.Join(s, "nvidia", "*", "lib", "libnccl.so.2"))
		sort.Strings(m)
		for _, p := range append(ps, m...) {
			if seen[p] {
				continue
			}
			seen[p] = true
			if _, err := os.Stat(p); err == nil {
				out = append(out, p)
			}
		}
	}
	return out
}

// Open loads libnccl from path (a file path or soname), without caching.
// Required symbols: every function this package binds except
// ncclCommSplit, ncclCommFinalize and ncclGetLastError, which older
// libraries lack (the methods then return an error wrapping
// comm.ErrUnsupported). ncclCommInitRankConfig needs NCCL 2.14+.
func Open(path string) (*Lib, error) {
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, &cuda.LoadError{Lib: "libnccl", Tried: []string{path}, Errs: []string{err.Error()}}
	}
	l := &Lib{path: path}
	f := &l.fn
	req := []struct {
		dst      *uintptr
		name     string
		optional bool
	}{
		{&f.getVersion, "ncclGetVersion", false},
		{&f.getUniqueID, "ncclGetUniqueId", false},
		{&f.commGetAsyncError, "ncclCommGetAsyncError", false},
		{&f.commAbort, "ncclCommAbort", false},
		{&f.commFinalize, "ncclCommFinalize", true},
		{&f.commDestroy, "ncclCommDestroy", false},
		{&f.commSplit, "ncclCommSplit", true},
		{&f.commCount, "ncclCommCount", false},
		{&f.commUserRank, "ncclCommUserRank", false},
		{&f.commCuDevice, "ncclCommCuDevice", false},
		{&f.getErrorString, "ncclGetErrorString", false},
		{&f.getLastError, "ncclGetLastError", true},
		{&f.allReduce, "ncclAllReduce", false},
		{&f.broadcast, "ncclBroadcast", false},
		{&f.reduce, "ncclReduce", false},
		{&f.allGather, "ncclAllGather", false},
		{&f.reduceScatter, "ncclReduceScatter", false},
		{&f.send, "ncclSend", false},
		{&f.recv, "ncclRecv", false},
		{&f.groupStart, "ncclGroupStart", false},
		{&f.groupEnd, "ncclGroupEnd", false},
		{&f.redOpCreatePreMulSum, "ncclRedOpCreatePreMulSum", false},
		{&f.redOpDestroy, "ncclRedOpDestroy", false},
	}
	for _, r := range req {
		a, err := purego.Dlsym(h, r.name)
		if err != nil || a == 0 {
			if r.optional {
				continue
			}
			return nil, &cuda.LoadError{Lib: "libnccl", Tried: []string{path}, Symbol: r.name}
		}
		*r.dst = a
	}
	a, err := purego.Dlsym(h, "ncclCommInitRankConfig")
	if err != nil || a == 0 {
		return nil, &cuda.LoadError{Lib: "libnccl", Tried: []string{path}, Symbol: "ncclCommInitRankConfig"}
	}
	// The unique id is passed by value (128 bytes, on the stack): purego's
	// typed binding lays out such a struct argument per the platform ABI.
	purego.RegisterFunc(&l.commInitRankConfig, a)
	v := new(int32)
	if r := call(f.getVersion, uintptr(unsafe.Pointer(v))); r != Success {
		return nil, &cuda.LoadError{Lib: "libnccl", Tried: []string{path}, Errs: []string{"ncclGetVersion: " + r.String()}}
	}
	l.version = int(*v)
	return l, nil
}

// Path is the path or soname the library was loaded from.
func (l *Lib) Path() string { return l.path }

// Version is ncclGetVersion's code, e.g. 22807 for 2.28.7.
func (l *Lib) Version() int { return l.version }

//go:uintptrescapes
func call(fn uintptr, args ...uintptr) Result {
	r, _, _ := purego.SyscallN(fn, args...)
	return Result(int32(r))
}

func cString(p uintptr) string {
	if p == 0 {
		return ""
	}
	// p points into C memory (a static string); reinterpret without
	// uintptr arithmetic on Go pointers.
	base := *(*unsafe.Pointer)(unsafe.Pointer(&p))
	var b []byte
	for i := 0; i < 4096; i++ {
		c := *(*byte)(unsafe.Add(base, i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}
