package nvmlinfo

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// envRealLib names a real libnvidia-ml.so.1 that the dynamic loader finds
// by its soname (scripts/reallib-check.sh puts its folder on the loader's
// path and sets this); unset in CI, where the test skips.
const envRealLib = "RANKTREE_REAL_NVML_LIB"

// TestRealNVML queries NVIDIA's own NVML. On a GPU machine every device
// must come back with a name, a "GPU-" UUID and a PCI bus id. Without a
// GPU or a loaded kernel driver, Devices must fail with ErrUnavailable and
// NVML's own reason, which must not be "library not found": that would mean
// the real library was never reached.
func TestRealNVML(t *testing.T) {
	if os.Getenv(envRealLib) == "" {
		t.Skipf("%s unset: no real NVML to check (scripts/reallib-check.sh sets it)", envRealLib)
	}
	ds, err := Devices()
	if err != nil {
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Devices error %v does not wrap ErrUnavailable", err)
		}
		if strings.Contains(strings.ReplaceAll(strings.ToLower(err.Error()), "_", " "), "library not found") {
			t.Fatalf("NVML library was not loaded: %v", err)
		}
		if n, cerr := Count(); n != 0 || cerr == nil {
			t.Fatalf("Count = %d, %v after Devices failed", n, cerr)
		}
		t.Logf("NVML without a GPU: %v", err)
		return
	}
	if len(ds) == 0 {
		t.Fatal("NVML initialized but reports no device")
	}
	for _, d := range ds {
		if d.Name == "" || !strings.HasPrefix(d.UUID, "GPU-") || d.PCIBusID == "" {
			t.Fatalf("device %+v lacks name, UUID or PCI bus id", d)
		}
		t.Logf("NVML device %+v", d)
	}
}
