package nvmlinfo

import (
	"errors"
	"os"
	"testing"
	"unsafe"

	"github.com/ranktree/ranktree/comm"
)

func TestLocalDevice(t *testing.T) {
	for _, c := range []struct{ lr, n, want int }{{0, 1, 0}, {3, 4, 3}, {5, 4, 1}, {7, 8, 7}} {
		if got, err := LocalDevice(c.lr, c.n); err != nil || got != c.want {
			t.Errorf("LocalDevice(%d, %d) = %d, %v; want %d", c.lr, c.n, got, err, c.want)
		}
	}
	if _, err := LocalDevice(0, 0); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Errorf("LocalDevice(0, 0) = %v; want ErrInvalidArgument", err)
	}
	if _, err := LocalDevice(-1, 2); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Errorf("LocalDevice(-1, 2) = %v; want ErrInvalidArgument", err)
	}
}

func TestLocalRankFromEnv(t *testing.T) {
	t.Setenv("LOCAL_RANK", "3")
	if v, err := LocalRankFromEnv(); v != 3 || err != nil {
		t.Fatalf("got %d, %v", v, err)
	}
	t.Setenv("LOCAL_RANK", "x")
	if _, err := LocalRankFromEnv(); !errors.Is(err, comm.ErrInvalidArgument) {
		t.Fatalf("malformed LOCAL_RANK: %v", err)
	}
}

// TestDevices runs NVML where present; on machines without it (CI) it
// checks the call fails cleanly with ErrUnavailable instead of crashing.
func TestDevices(t *testing.T) {
	ds, err := Devices()
	if os.Getenv("RANKTREE_GPU_TESTS") == "1" {
		if err != nil || len(ds) == 0 {
			t.Fatalf("Devices on a GPU machine = %v, %v", ds, err)
		}
		for _, d := range ds {
			if d.UUID == "" || d.PCIBusID == "" {
				t.Errorf("device %+v lacks UUID or bus id", d)
			}
			t.Logf("%+v", d)
		}
		return
	}
	if err != nil {
		if !errors.Is(err, ErrUnavailable) || !errors.Is(err, comm.ErrUnsupported) {
			t.Fatalf("Devices error %v does not wrap ErrUnavailable", err)
		}
		t.Logf("NVML absent as expected here: %v", err)
		return
	}
	t.Logf("NVML present: %+v", ds)
}

// TestStructLayouts pins the C layouts Devices passes to NVML (nvml.h):
// nvmlPciInfo_t is 68 bytes with busId at offset 36, nvmlMemory_t 24.
func TestStructLayouts(t *testing.T) {
	var p pciInfo
	if s, o := unsafe.Sizeof(p), unsafe.Offsetof(p.busID); s != 68 || o != 36 {
		t.Errorf("pciInfo: size %d, busId offset %d; want 68, 36", s, o)
	}
	if s := unsafe.Sizeof(memoryInfo{}); s != 24 {
		t.Errorf("memoryInfo: size %d, want 24", s)
	}
}
