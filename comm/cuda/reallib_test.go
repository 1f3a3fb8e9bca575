package cuda_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cuda"
)

// EnvRealLib names a real libcuda.so.1 for TestRealDriver. Set by
// scripts/reallib-check.sh (Debian's driver library on a machine without a
// GPU) or by hand on a GPU machine; CI leaves it unset and the test skips.
const envRealLib = "RANKTREE_REAL_CUDA_LIB"

// TestRealDriver loads NVIDIA's own driver library, not the fake, and
// checks that every entry point we bind resolves in it, that
// cuDriverGetVersion answers, and that cuInit's outcome is either a usable
// device or a typed *cuda.Error carrying the driver's own name and text.
// Without a GPU it must be the error (CUDA_ERROR_NO_DEVICE, or
// CUDA_ERROR_NO_DEVICE's relatives where no kernel module is loaded), and
// every later call must report CUDA_ERROR_NOT_INITIALIZED, not crash.
func TestRealDriver(t *testing.T) {
	p := os.Getenv(envRealLib)
	if p == "" {
		t.Skipf("%s unset: no real libcuda to check (scripts/reallib-check.sh sets it)", envRealLib)
	}
	l, err := cuda.Open(p)
	if err != nil {
		t.Fatalf("Open(%s): %v", p, err)
	}
	v, err := l.DriverVersion()
	if err != nil || v < 11000 {
		t.Fatalf("DriverVersion = %d, %v; want a CUDA 11+ driver API version", v, err)
	}
	t.Logf("%s: driver API %d.%d", p, v/1000, v%1000/10)
	err = l.Init()
	if err == nil {
		n, err := l.DeviceCount()
		if err != nil || n < 1 {
			t.Fatalf("cuInit succeeded but DeviceCount = %d, %v", n, err)
		}
		t.Logf("cuInit: %d device(s)", n)
		return
	}
	var ce *cuda.Error
	if !errors.As(err, &ce) || !errors.Is(err, comm.ErrEngine) {
		t.Fatalf("cuInit error %v (%T) is not a *cuda.Error wrapping comm.ErrEngine", err, err)
	}
	if ce.Call != "cuInit" || !strings.HasPrefix(ce.Name, "CUDA_ERROR_") || ce.Msg == "" || ce.Code == cuda.Success {
		t.Fatalf("cuInit error fields: %+v", *ce)
	}
	t.Logf("cuInit without a GPU: %v", err)
	_, err = l.DeviceCount()
	if !errors.As(err, &ce) || ce.Name != "CUDA_ERROR_NOT_INITIALIZED" {
		t.Fatalf("DeviceCount after a failed cuInit: %v; want CUDA_ERROR_NOT_INITIALIZED", err)
	}
	if _, err := l.DeviceGet(0); err == nil {
		t.Fatal("DeviceGet(0) succeeded after a failed cuInit")
	}
}
