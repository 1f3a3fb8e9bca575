package reducer

import (
	"context"
	"fmt"

	"github.com/ranktree/ranktree/comm"
)

// ExamplePowerSGDHook registers PowerSGD on a reducer: plain allreduce for
// the first two iterations, then rank-2 compression of the 64×32 weight
// (the bias is allreduced whole). Here one rank of the in-memory test
// group; in a job, g is the rank's process group.
func ExamplePowerSGDHook() {
	g := newMemWorld(1).groups()[0]
	w, b := make([]float32, 64*32), make([]float32, 32)
	red, err := New(context.Background(), g, []Param{
		{Name: "fc.weight", Data: comm.HostBuffer(w), Shape: []int{64, 32}},
		{Name: "fc.bias", Data: comm.HostBuffer(b), Shape: []int{32}},
	}, Config{})
	if err != nil {
		panic(err)
	}
	cfg := DefaultPowerSGDConfig()
	cfg.MatrixApproximationRank, cfg.StartPowerSGDIter = 2, 2
	state, err := NewPowerSGDState(cfg)
	if err != nil {
		panic(err)
	}
	if err := red.RegisterCommHook(PowerSGDHook(state)); err != nil {
		panic(err)
	}
	gw, gb := make([]float32, len(w)), make([]float32, len(b))
	for range 4 {
		// backward fills gw and gb ...
		if err := red.GradReady(1, comm.HostBuffer(gb)); err != nil {
			panic(err)
		}
		if err := red.GradReady(0, comm.HostBuffer(gw)); err != nil {
			panic(err)
		}
		if err := red.EndBackward(context.Background()); err != nil {
			panic(err)
		}
		// ... then the optimizer steps with the averaged gw and gb.
	}
	rate, before, after := state.CompressionStats()
	fmt.Printf("%d iterations, %s hook, %d elements sent as %d (%.1fx)\n", state.Iter(), red.Stats().CommHook, before, after, rate)
	// Output: 4 iterations, powerSGD hook, 4160 elements sent as 448 (9.3x)
}
