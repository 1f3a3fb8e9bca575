// Package fakegpu builds and controls the fake libcuda/libnccl used by the
// tests of comm/cuda and comm/nccl on machines without a GPU.
//
// The fake is C code (testdata/fakegpu_cuda.c, fakegpu_nccl.c and
// fakegpu.h) that exports the CUDA driver API and NCCL entry points
// ranktree binds. Build compiles it with
// `gcc -shared -fPIC` into a temporary folder once per test binary and
// returns the path of the shared object, to be used as both
// RANKTREE_CUDA_LIB and RANKTREE_NCCL_LIB (one library, so the fake NCCL
// enqueues on the fake CUDA streams). Its semantics:
//
//   - "device" memory is host memory (cuMemAlloc_v2 is malloc, filled with
//     0xAB garbage); copies and memsets run on the host;
//   - streams are in-order op queues; an event completes when its stream
//     reaches it; cuStreamWaitValue32 blocks a stream until the 32-bit
//     value at the address satisfies the condition (written later by
//     cuMemsetD32Async on another stream);
//   - NCCL communicators have world-size-1 semantics (data copied, only
//     PreMulSum scales it); nranks > 1 never finish init (a missing peer);
//     nonblocking init stays ncclInProgress for init_polls polls;
//   - faults (Set): hang_after N makes collectives after the first N block
//     their stream until ncclCommAbort; async_error_after N makes
//     ncclCommGetAsyncError report ncclSystemError after N collectives.
//
// This package is for tests only (it imports testing).
package fakegpu

import (
	"embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ebitengine/purego"
)

//go:embed testdata/fakegpu.h testdata/fakegpu_cuda.c testdata/fakegpu_nccl.c
var sources embed.FS

// Env is the environment variable a test binary can set to a prebuilt fake
// library (scripts/gpu-check.sh does not use the fake; CI may).
const Env = "RANKTREE_FAKEGPU_LIB"

var (
	once     sync.Once
	libPath  string
	dir      string
	buildErr error
	handle   uintptr
	setFn    func(name string, v int64) int32
	liveFn   func(what string) int64
)

// Path compiles the fake once and returns the shared object's path. It
// returns an error if gcc is absent or the compile fails.
func Path() (string, error) {
	once.Do(func() {
		if p := os.Getenv(Env); p != "" {
			libPath = p
		} else {
			gcc, err := exec.LookPath("gcc")
			if err != nil {
				buildErr = fmt.Errorf("fakegpu: gcc not found on PATH: %w", err)
				return
			}
			dir, err = os.MkdirTemp("", "ranktree-fakegpu-")
			if err != nil {
				buildErr = err
				return
			}
			for _, name := range []string{"fakegpu.h", "fakegpu_cuda.c", "fakegpu_nccl.c"} {
				b, err := sources.ReadFile("testdata/" + name)
				if err == nil {
					err = os.WriteFile(filepath.Join(dir, name), b, 0o644)
				}
				if err != nil {
					buildErr = err
					return
				}
			}
			libPath = filepath.Join(dir, "libfakegpu.so")
			out, err := exec.Command(gcc, "-shared", "-fPIC", "-O1", "-Wall", "-o", libPath,
				filepath.Join(dir, "fakegpu_cuda.c"), filepath.Join(dir, "fakegpu_nccl.c"), "-lm", "-lpthread").CombinedOutput()
			if err != nil {
				buildErr = fmt.Errorf("fakegpu: gcc failed: %v\n%s", err, out)
				return
			}
		}
		h, err := purego.Dlopen(libPath, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			buildErr = fmt.Errorf("fakegpu: dlopen %s: %w", libPath, err)
			return
		}
		handle = h
		purego.RegisterLibFunc(&setFn, h, "fakegpu_set")
		purego.RegisterLibFunc(&liveFn, h, "fakegpu_live")
	})
	return libPath, buildErr
}

// Build returns the fake library's path, skipping tb with a clear message
// if gcc is absent and failing it if the compile fails. It also points
// RANKTREE_CUDA_LIB and RANKTREE_NCCL_LIB at the fake for tb's duration.
func Build(tb testing.TB) string {
	tb.Helper()
	p, err := Path()
	if err != nil {
		var ee *exec.Error
		if errors.As(err, &ee) || os.IsNotExist(errors.Unwrap(err)) {
			tb.Skipf("skipping: the fake GPU library needs gcc: %v", err)
		}
		tb.Fatal(err)
	}
	tb.Setenv("RANKTREE_CUDA_LIB", p)
	tb.Setenv("RANKTREE_NCCL_LIB", p)
	return p
}

// Set sets fault knob name ("hang_after", "async_error_after",
// "init_polls", "abort_blocks", "split_late", "reset_count") to v; -1 disables hang_after and
// async_error_after. It panics for an unknown name (a test bug).
func Set(name string, v int64) {
	if setFn == nil {
		panic("fakegpu.Set before Build")
	}
	if setFn(name, v) != 0 {
		panic("fakegpu: unknown knob " + name)
	}
}

// Reset disables every fault and zeroes the collective counter.
func Reset() {
	Set("hang_after", -1)
	Set("async_error_after", -1)
	Set("init_polls", 2)
	Set("abort_blocks", 0)
	Set("split_late", 0)
	Set("reset_count", 0)
}

// Live is the number of live fake objects of a kind: "allocs", "streams",
// "events" or "comms" (for leak checks).
func Live(what string) int64 {
	if liveFn == nil {
		panic("fakegpu.Live before Build")
	}
	return liveFn(what)
}

// Remove deletes the temporary folder holding the compiled fake (call it
// from TestMain after m.Run; the library stays mapped).
func Remove() {
	if dir != "" {
		_ = os.RemoveAll(dir)
	}
}

// Main runs a test binary's tests, removes the compiled fake, and exits with
// the tests' status: call it from TestMain in packages that use the fake.
func Main(m *testing.M) {
	code := m.Run()
	Remove()
	os.Exit(code)
}

// OnGPU reports whether the tests run against the real driver and NCCL
// (RANKTREE_GPU_TESTS=1, as scripts/gpu-check.sh sets) instead of the fake.
func OnGPU() bool { return os.Getenv("RANKTREE_GPU_TESTS") == "1" }
