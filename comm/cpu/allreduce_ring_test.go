package cpu

import (
	"fmt"
	"testing"

	"github.com/ranktree/ranktree/comm"
)

// TestAllReduceRingChunkedDTypes runs the ring allreduce in many chunks
// (4 KiB shm rings: 1 KiB chunks, so a 1001-element buffer's blocks are
// cut into up to 8) for every dtype and reduction, through engines over
// shm and inmem (both have a group segment, so both cut chunks), and checks
// every element against the closed form and every rank against rank 0.
func TestAllReduceRingChunkedDTypes(t *testing.T) {
	for _, tr := range []string{TransportSHM, TransportInmem} {
		for _, n := range []int{2, 3} {
			t.Run(fmt.Sprintf("%s/n=%d", tr, n), func(t *testing.T) {
				g := newGroup(t, n, Options{Transport: tr, RingThreshold: 64, ShmRingBytes: 4096})
				if c := g.engines[0].ringOptions(0).chunk; c != 1024 {
					t.Fatalf("chunk %d, want 1024", c)
				}
				for _, dt := range comm.AllDTypes {
					for _, red := range opsFor(dt) {
						checkAllReduce(t, g, dt, red, 1001)
					}
				}
			})
		}
	}
}
