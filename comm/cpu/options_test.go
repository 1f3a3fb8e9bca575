package cpu

import "testing"

// TestFlatThresholdDefault: the one-step threshold defaults to 32 KiB for
// 2 ranks and 128 KiB for 3 or more; a value given is kept (rounded up to
// 64 bytes), a negative one disables the one-step algorithms.
func TestFlatThresholdDefault(t *testing.T) {
	for _, c := range []struct{ set, n, want int }{
		{0, 1, 32 << 10}, {0, 2, 32 << 10}, {0, 3, 128 << 10}, {0, 8, 128 << 10},
		{1000, 4, 1024}, {-1, 4, 0},
	} {
		o := Options{FlatThreshold: c.set}
		if err := o.validate(c.n); err != nil {
			t.Fatal(err)
		}
		if o.FlatThreshold != c.want {
			t.Errorf("FlatThreshold %d, %d ranks: got %d, want %d", c.set, c.n, o.FlatThreshold, c.want)
		}
	}
}
