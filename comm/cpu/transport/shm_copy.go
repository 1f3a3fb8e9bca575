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
// slower (smallStreamingMargin for short messages), and now and then
// tries the other way so that the averages follow a change: every
// explorePieces pieces for long messages, seldom for short ones
// (shortExploreEvery, shortExplorePieces). Short and long messages keep
// separate averages (one copier each): a short one's pieces are copied
// from and to cache, a long one's from memory.
//
// Only the progress goroutine uses a slotCopier.
type slotCopier struct {
	est [2]float64 // moving average of ns per shmChunk bytes: copyCached, copyStreaming
	n   uint64     // pieces chosen for
	// explored is when the way not in favour was last tried, on the
	// copier clock (copierNow), and exploredN the value of n then.
	explored  time.Duration
	exploredN uint64
}

const (
	copyCached    = 0
	copyStreaming = 1
	// explorePieces is how often (in pieces) a long message's copier
	// tries the way not in favour: a cached copy costs up to six times a
	// streaming one, so trying it every 16 MiB slowed 64 MiB allreduce
	// by a quarter; every 64 pieces (16 MiB, a few ms) still follows a
	// change of the vCPUs' placement.
	explorePieces = 64
	// A short message's copier tries the way not in favour on the first
	// piece that comes both shortExploreEvery and shortExplorePieces
	// after its last try: the time bounds what the tries cost when ops
	// come back to back, the pieces when they come seldom (a training
	// step's allreduces, seconds apart). A try can cost far more than
	// its own copy: in one state of the development VM a streamed piece
	// of a 1 MiB allreduce, whose ring pieces the peer otherwise reads
	// from cache, made that op take 250-450 µs instead of about 60 (in
	// others it cost nothing measurable). Tried every 64 pieces, as long
	// messages are (until 2026-11-27), that was every 32nd 1 MiB
	// allreduce. A change of the vCPUs' placement lasts seconds: tries
	// 100 ms apart follow it, and a slowdown of the cached way, timed on
	// every piece, shows at once.
	shortExploreEvery  = 100 * time.Millisecond
	shortExplorePieces = 1024
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

// choose returns the way to copy the next piece of a message, short (of
// up to streamMsgMin bytes) or not: streaming if cached copies are more
// than the margin (smallStreamingMargin or streamingMargin) times slower,
// except for a try of the other way (see explorePieces and
// shortExploreEvery). now is the copier clock (copierNow). A copier
// serves either short messages or long ones.
func (c *slotCopier) choose(short bool, now time.Duration) int {
	c.n++
	for m, e := range c.est {
		if e == 0 {
			c.explored, c.exploredN = now, c.n
			return m
		}
	}
	margin, every, pieces := streamingMargin, time.Duration(0), uint64(explorePieces)
	if short {
		margin, every, pieces = smallStreamingMargin, shortExploreEvery, shortExplorePieces
	}
	best := copyCached
	if c.est[copyCached] > margin*c.est[copyStreaming] {
		best = copyStreaming
	}
	if c.n-c.exploredN >= pieces && now-c.explored >= every {
		c.explored, c.exploredN = now, c.n
		return 1 - best
	}
	return best
}

// copierEpoch is the copier clock's zero.
var copierEpoch = time.Now()

// copierNow is the copier clock: monotonic time since copierEpoch.
func copierNow() time.Duration { return time.Since(copierEpoch) }

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
