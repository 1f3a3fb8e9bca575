package cpu

import (
	"errors"
	"testing"

	"github.com/ranktree/ranktree/comm"
)

// TestFlatThresholdDefault: the one-step threshold defaults to 64 KiB for
// 2 ranks and 128 KiB for 3 or more; a value given is kept (rounded up to
// 64 bytes), a negative one disables the one-step algorithms.
func TestFlatThresholdDefault(t *testing.T) {
	for _, c := range []struct{ set, n, want int }{
		{0, 1, 64 << 10}, {0, 2, 64 << 10}, {0, 3, 128 << 10}, {0, 8, 128 << 10},
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

// TestSlotBytesDefault: the slots default to FlatThreshold for 2 ranks
// and to at least 1 MiB for 3 or more; a value given is raised to
// FlatThreshold and rounded up to 64 bytes; no slots when the one-step
// algorithms are disabled; negative and above 16 MiB are rejected.
func TestSlotBytesDefault(t *testing.T) {
	for _, c := range []struct{ flat, slot, n, want int }{
		{0, 0, 2, 64 << 10}, {0, 0, 3, 1 << 20}, {0, 0, 8, 1 << 20},
		{4 << 20, 0, 4, 4 << 20}, {0, 5000, 4, 128 << 10}, {1024, 5000, 3, 5056},
		{-1, 0, 4, 0}, {-1, 4096, 4, 0},
	} {
		o := Options{FlatThreshold: c.flat, SlotBytes: c.slot}
		if err := o.validate(c.n); err != nil {
			t.Fatal(err)
		}
		if o.SlotBytes != c.want {
			t.Errorf("FlatThreshold %d, SlotBytes %d, %d ranks: got %d, want %d", c.flat, c.slot, c.n, o.SlotBytes, c.want)
		}
	}
	for _, bad := range []int{-1, 16<<20 + 1} {
		o := Options{SlotBytes: bad}
		if err := o.validate(3); !errors.Is(err, comm.ErrInvalidArgument) {
			t.Errorf("SlotBytes %d: got %v, want ErrInvalidArgument", bad, err)
		}
	}
}

// TestSlotAllReduceMaxDefault: the slots take allreduces up to 1 MiB
// among 3 ranks and 8 MiB among 4 or more by default; a value given is
// kept, a negative one (disabled) too.
func TestSlotAllReduceMaxDefault(t *testing.T) {
	for _, c := range []struct{ set, n, want int }{
		{0, 3, 1 << 20}, {0, 4, 8 << 20}, {0, 8, 8 << 20}, {4096, 3, 4096}, {-1, 4, -1},
	} {
		o := Options{SlotAllReduceMax: c.set}
		if err := o.validate(c.n); err != nil {
			t.Fatal(err)
		}
		if o.SlotAllReduceMax != c.want {
			t.Errorf("SlotAllReduceMax %d, %d ranks: got %d, want %d", c.set, c.n, o.SlotAllReduceMax, c.want)
		}
	}
}
