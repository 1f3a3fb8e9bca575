package bench

import (
	"errors"
	"flag"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
)

func TestParseArgsDefaults(t *testing.T) {
	o, err := ParseArgs(nil, "", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := o.Config
	if c.Collective != AllReduce || c.Op != comm.Sum || c.DType != comm.Float32 || c.Iters != 20 || c.Warmup != 5 ||
		c.Root != 0 || o.Transport != "auto" || o.JSON || c.PlacementEvery != 64 || !c.Blocking {
		t.Errorf("defaults = %+v", o)
	}
	if !slices.Equal(c.Sizes, DefaultSizes) {
		t.Errorf("default sizes = %v, want %v", c.Sizes, DefaultSizes)
	}
	if o, _ := ParseArgs(nil, "tcp", io.Discard); o.Transport != "tcp" {
		t.Errorf("transport default from the environment: %q", o.Transport)
	}
}

func TestParseArgsAll(t *testing.T) {
	o, err := ParseArgs([]string{"--collective", "reducescatter", "--op", "max", "--dtype", "bf16",
		"--sizes", "4,4KiB,64MiB", "--iters", "7", "--warmup", "0", "--root", "1", "--transport", "shm", "--json", "--placement-every", "8",
		"--blocking=false"}, "", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := o.Config
	if c.Collective != ReduceScatter || c.Op != comm.Max || c.DType != comm.BFloat16 || c.Iters != 7 || c.Warmup != 0 ||
		c.Root != 1 || o.Transport != "shm" || !o.JSON || !slices.Equal(c.Sizes, []int64{4, 4096, 64 << 20}) || c.PlacementEvery != 8 || c.Blocking {
		t.Errorf("parsed = %+v", o)
	}
}

func TestParseArgsErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--collective", "gather"}, {"--op", "mean"}, {"--dtype", "complex32"}, {"--sizes", "4,x"},
		{"--dtype", "complex64", "--op", "max"}, // torch refuses max on complex
		{"--iters", "0"}, {"--warmup", "-1"}, {"--root", "-2"}, {"--transport", "ib"}, {"extra"},
		{"--op", "band"}, // bitwise op on the default float32
		{"--dtype", "int32", "--op", "avg"},
		{"--no-such-flag"}, {"--placement-every", "0"},
	} {
		if _, err := ParseArgs(args, "", io.Discard); err == nil {
			t.Errorf("ParseArgs(%q): want an error", args)
		}
	}
	// A bitwise op is accepted for a collective that does not reduce.
	if _, err := ParseArgs([]string{"--collective", "allgather", "--op", "band"}, "", io.Discard); err != nil {
		t.Errorf("allgather with --op band: %v", err)
	}
	if _, err := ParseArgs([]string{"-h"}, "", io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: err = %v, want flag.ErrHelp", err)
	}
}

// TestParseArgsLate: the late-arrival flags fill Options.Late; without
// --late-rank there is none.
func TestParseArgsLate(t *testing.T) {
	o, err := ParseArgs([]string{"--late-rank", "1", "--late-us", "2000", "--late-skew", "random", "--late-busy"}, "", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if l := o.Late; l == nil || l.Rank != 1 || l.Delay != 2*time.Millisecond || l.Skew != LateRandom || !l.Busy {
		t.Errorf("late = %+v", o.Late)
	}
	if o, _ := ParseArgs([]string{"--late-rank", "0"}, "", io.Discard); o.Late == nil || o.Late.Busy || o.Late.Delay != 5*time.Millisecond {
		t.Errorf("late defaults = %+v, want asleep, 5 ms", o.Late)
	}
	if o, _ := ParseArgs([]string{"--late-busy"}, "", io.Discard); o.Late != nil {
		t.Errorf("--late-busy without --late-rank: late = %+v", o.Late)
	}
}
