package transport

import "time"

// slotCopier copies whole slots (shmChunk bytes) of a send into an shm
// ring, choosing per slot between two ways of storing them:
//
//   - cached: two copies of half a slot (each published to the reader as
//     it is done), which the Go runtime's memmove does with ordinary
//     stores. Each ring line is first fetched for
//     ownership, usually from the peer core, which read it one ring turn
//     earlier; the data then waits in cache for the peer.
//   - streaming: one copy of the whole slot, which memmove does with
//     non-temporal stores from 1 MiB on (amd64): no fetch for ownership,
//     and the peer reads the data back from memory.
//
// Which is faster depends on how the two cores share their caches, which
// on a VM changes with where the hypervisor runs its vCPUs. Measured on the
// 2-core VM this is developed on (docs/benchmarks.md), cached copies ran at
// about 15 GB/s for some seconds and at 2.5 GB/s for others, while
// streaming copies stayed at 13-19 GB/s but made the peer's reads about a
// third slower. So the copier times every slot copy, keeps a moving
// average per way, takes streaming only when cached copies are more than
// streamingMargin times slower, and tries the other way every
// exploreEvery slots so that the averages follow a change.
//
// Only the progress goroutine uses a slotCopier.
type slotCopier struct {
	est [2]float64 // moving average of ns per slot: copyCached, copyStreaming
	n   uint64     // slots copied
}

const (
	copyCached    = 0
	copyStreaming = 1
	// exploreEvery is how often (in slots) the way not in favour is timed:
	// a cached slot costs up to six times a streaming one, so timing it
	// every 16 slots slowed 64 MiB allreduce by a quarter; every 64 slots
	// (64 MiB, a few ms) still follows a change of the vCPUs' placement.
	exploreEvery = 64
	// streamingMargin is how much slower cached copies must be before
	// streaming is preferred: streaming also slows the peer's reads.
	streamingMargin = 1.5
)

// choose returns the way to copy the next slot.
func (c *slotCopier) choose() int {
	c.n++
	for m, e := range c.est {
		if e == 0 {
			return m
		}
	}
	best := copyCached
	if c.est[copyCached] > streamingMargin*c.est[copyStreaming] {
		best = copyStreaming
	}
	if c.n%exploreEvery == 0 {
		return 1 - best
	}
	return best
}

// observe records that a slot copied way m took d. The average weighs the
// newest sample by half, so that the few samples of the way not in favour
// follow a change within about six of them. A sample counts as at most
// twice the average, so that one copy during which the thread was
// descheduled does not flip the choice, while two slow copies in a row do.
func (c *slotCopier) observe(m int, d time.Duration) {
	x := float64(d.Nanoseconds())
	if e := c.est[m]; e == 0 {
		c.est[m] = max(x, 1)
	} else {
		c.est[m] = 0.5*e + 0.5*min(x, 2*e)
	}
}
