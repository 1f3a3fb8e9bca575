package transport

import "time"

// slotCopier copies the pieces of a send into an shm ring (up to
// shmPiece bytes at a time; those with at least streamMin bytes of
// payload), choosing per piece between two ways of storing them:
//
//   - cached: ordinary stores (the Go runtime's memmove). Each ring line
//     is first fetched for ownership, usually from the peer core, which
//     read it one ring turn earlier; the data then waits in cache for the
//     peer.
//   - streaming: non-temporal stores (streamCopy, ntcopy_amd64.go): no
//     fetch for ownership, and the peer reads the data back from memory.
//
// Which is faster depends on how the two cores share their caches, which
// on a VM changes with where the hypervisor runs its vCPUs. Measured on the
// 2-core VM this is developed on (docs/benchmarks.md), cached copies ran at
// about 15 GB/s for some seconds and at 2.5 GB/s for others, while
// streaming copies stayed at 13-19 GB/s but made the peer's reads about a
// third slower. So the copier times every piece it chooses for, keeps a
// moving average per way (of the time per MiB, shmChunk), takes
// streaming only when cached copies are more than streamingMargin times
// slower (smallStreamingMargin for short messages), and tries the other
// way every exploreEvery pieces so that the averages follow a change.
//
// Only the progress goroutine uses a slotCopier.
type slotCopier struct {
	est [2]float64 // moving average of ns per shmChunk bytes: copyCached, copyStreaming
	n   uint64     // pieces chosen for
}

const (
	copyCached    = 0
	copyStreaming = 1
	// exploreEvery is how often (in pieces) the way not in favour is timed:
	// a cached copy costs up to six times a streaming one, so timing it
	// every 16 MiB slowed 64 MiB allreduce by a quarter; every 64 pieces
	// (16 MiB, a few ms) still follows a change of the vCPUs' placement.
	exploreEvery = 64
	// streamMin is the smallest payload piece the copier chooses for:
	// smaller ones (the ends of messages) are copied the cached way
	// without being timed.
	streamMin = 64 << 10
	// streamMsgMin: messages of up to 512 KiB are streamed only when
	// cached copies are more than smallStreamingMargin times slower. They
	// are the messages of ops of up to about 1 MiB per rank, whose buffers
	// and ring pieces otherwise stay in cache for the reader, which the
	// copier, timing only the writer, does not see: with the ordinary
	// margin, streaming made 1 MiB allreduces slower. Where cached stores
	// are several times slower (the VM's slow mode, docs/benchmarks.md),
	// streaming wins for them too: 512 KiB ring chunks that could not be
	// streamed made 64 MiB allreduces four times slower there.
	streamMsgMin         = 512 << 10
	smallStreamingMargin = 3.0
	// streamingMargin is how much slower cached copies must be before
	// streaming is preferred: streaming also slows the peer's reads.
	streamingMargin = 1.5
)

// choose returns the way to copy the next piece: streaming if cached
// copies are more than margin times slower (except every exploreEvery
// pieces, which take the other way).
func (c *slotCopier) choose(margin float64) int {
	c.n++
	for m, e := range c.est {
		if e == 0 {
			return m
		}
	}
	best := copyCached
	if c.est[copyCached] > margin*c.est[copyStreaming] {
		best = copyStreaming
	}
	if c.n%exploreEvery == 0 {
		return 1 - best
	}
	return best
}

// observe records that a piece of size bytes copied way m took d. The
// average, of the time per shmChunk bytes, weighs the
// newest sample by half, so that the few samples of the way not in favour
// follow a change within about six of them. A sample counts as at most
// twice the average, so that one copy during which the thread was
// descheduled does not flip the choice, while two slow copies in a row do.
func (c *slotCopier) observe(m int, d time.Duration, size int) {
	x := float64(d.Nanoseconds()) * shmChunk / float64(max(size, 1))
	if e := c.est[m]; e == 0 {
		c.est[m] = max(x, 1)
	} else {
		c.est[m] = 0.5*e + 0.5*min(x, 2*e)
	}
}
