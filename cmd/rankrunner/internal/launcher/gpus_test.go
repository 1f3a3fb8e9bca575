package launcher

import "testing"

// TestGPUCountNeverPanics: without libnvidia-ml (this CI) the count is 0
// with a reason; with it, a non-negative count.
func TestGPUCountNeverPanics(t *testing.T) {
	n, err := GPUCount()
	if err != nil && n != 0 {
		t.Fatalf("GPUCount = %d with error %v", n, err)
	}
	if n < 0 {
		t.Fatalf("GPUCount = %d", n)
	}
	t.Logf("GPUCount = %d, %v", n, err)
}
