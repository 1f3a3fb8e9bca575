package nccl

import (
	"runtime"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// TestOptionsSpinDefaults: SpinIdle and SpinWait spin by default only
// where GOMAXPROCS leaves cores for it; explicit values, negative ones
// included, are kept.
func TestOptionsSpinDefaults(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	cfg := comm.BackendConfig{Size: 1}
	for _, c := range []struct {
		procs          int
		in             Options
		idle, spinWait time.Duration
	}{
		{2, Options{}, 0, 0},
		{spinMinProcs, Options{}, 100 * time.Microsecond, 200 * time.Microsecond},
		{16, Options{}, 100 * time.Microsecond, 200 * time.Microsecond},
		{16, Options{SpinIdle: -1, SpinWait: -1}, -1, -1},
		{2, Options{SpinIdle: 7 * time.Microsecond, SpinWait: 9 * time.Microsecond}, 7 * time.Microsecond, 9 * time.Microsecond},
	} {
		runtime.GOMAXPROCS(c.procs)
		o := c.in
		if err := o.validate(cfg); err != nil {
			t.Fatal(err)
		}
		if o.SpinIdle != c.idle || o.SpinWait != c.spinWait {
			t.Errorf("GOMAXPROCS %d, %+v: SpinIdle %v SpinWait %v; want %v %v", c.procs, c.in, o.SpinIdle, o.SpinWait, c.idle, c.spinWait)
		}
	}
}
