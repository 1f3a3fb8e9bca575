package transport

import (
	"math"
	"sync/atomic"
	"time"
)

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
// third slower. So the copier times every piece it chooses for, keeps an
// estimate per way (of the time per MiB, shmChunk), and tries the other
// way every exploreEvery pieces so that the estimates follow a change.
//
// The writer's time is not the whole cost: the reader's copy out of the
// ring depends on the way too (from the writer's cache for cached pieces,
// from memory for streamed ones). So the reader times its copies of the
// pieces the copier chose for (readerEst, kept in the pair's control
// page), and for messages of at least pairMin bytes, once the reader has
// timed both ways, the copier takes the way whose writer and reader times
// add up to less (by pairMargin). Otherwise it takes streaming only when
// its own cached copies are more than streamingMargin times slower
// (smallStreamingMargin for short messages). On the VM of 2026-12-07,
// whose two vCPUs shared no cache (a cache-line round trip of 430-520 ns),
// the writer's own times kept cached copies for most pieces of 256 KiB-1
// MiB messages, while the reader's cached reads cost it up to five times
// its streamed ones: adding the reader's times made 2-rank allreduces,
// allgathers and broadcasts of 256 KiB-1 MiB 1.1-1.7 times faster
// (docs/benchmarks.md, "Issue 15, session 22").
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
	// pairMargin is how much more the writer's and reader's times of
	// one way must add up to than the other's before the copier leaves
	// it: enough that two ways within the estimates' noise do not
	// alternate.
	pairMargin = 1.1
	// pairMin is the smallest message whose way the reader's times help
	// decide. Below it, where a message's pieces stay in the caches
	// between the writer's copy and the reader's, the writer's times
	// alone decide: on the VM of 2026-12-07 streaming 128 KiB messages
	// made 2-rank allgathers and broadcasts 7-14 % slower, while the
	// reader's times, taken mostly on larger messages, favoured it.
	pairMin = shmPiece
)

// choose returns the way to copy the next piece (except every
// exploreEvery pieces, which take the other way): given the reader's
// times of both ways (rd, ns per shmChunk bytes; 0 where a way has none,
// and both for messages under pairMin), the way whose writer and reader
// times add up to less, by pairMargin; otherwise streaming if cached
// copies are more than margin times slower.
func (c *slotCopier) choose(margin float64, rd [2]float64) int {
	c.n++
	for m, e := range c.est {
		if e == 0 {
			return m
		}
	}
	best := copyCached
	if rd[copyCached] > 0 && rd[copyStreaming] > 0 {
		if c.est[copyCached]+rd[copyCached] > pairMargin*(c.est[copyStreaming]+rd[copyStreaming]) {
			best = copyStreaming
		}
	} else if c.est[copyCached] > margin*c.est[copyStreaming] {
		best = copyStreaming
	}
	if c.n%exploreEvery == 0 {
		return 1 - best
	}
	return best
}

// observe records that a piece of size bytes copied way m took d.
func (c *slotCopier) observe(m int, d time.Duration, size int) {
	c.est[m] = nextEst(c.est[m], d, size)
}

// nextEst is the estimate e (ns per shmChunk bytes, 0 for none yet)
// after a copy of size bytes that took d. A faster copy than the
// estimate replaces it: what slows a copy down from outside (the thread
// descheduled, a page's first touch, the peer's core busy with the same
// lines) only ever adds to its time, and one such sample of the way not
// in favour, timed once every exploreEvery pieces, would otherwise keep
// the choice wrong for hundreds of pieces. A slower one moves it a
// quarter of the way, counted as at most twice the estimate: one
// outlier raises it by at most a quarter, while a lasting slowdown (the
// vCPUs moved apart) doubles it within three samples.
func nextEst(e float64, d time.Duration, size int) float64 {
	x := float64(d.Nanoseconds()) * shmChunk / float64(max(size, 1))
	if e == 0 || x < e {
		return max(x, 1)
	}
	return 0.75*e + 0.25*min(x, 2*e)
}

// The marks and the reader's estimates live in a pair's control page
// (shmDataOff bytes before the rings; RingsOver lays them out):
//
//   - marks: one word per piece of a ring (the piece's index modulo
//     markSlots), which the writer stores before it publishes a piece it
//     chose a way for: 1 + way + 2·copier (copier 1: a forward), or
//     nothing for the pieces it did not choose for. The reader loads it
//     after it saw the piece published (the tail), before it frees it
//     (the head), so a mark is not rewritten while it is read, except
//     where two messages share a piece, which at worst misattributes one
//     sample.
//   - readerEst: the reader's estimate per copier and way (float64 bits,
//     as nextEst, of the time its copies out of the ring took, less what
//     a forward's sends copied meanwhile), written by the ring's reader
//     only, read by its writer.
const markSlots = 256

type readerEst [4]atomic.Uint64

// of returns the reader's estimates for copier ci (0 sends, 1 forwards).
func (r *readerEst) of(ci int) [2]float64 {
	return [2]float64{math.Float64frombits(r[2*ci].Load()), math.Float64frombits(r[2*ci+1].Load())}
}

// observe records a reader's copy of size bytes of a piece marked mark
// (see above) that took d.
func (r *readerEst) observe(mark uint32, d time.Duration, size int) {
	i := mark - 1
	if i >= uint32(len(r)) {
		return
	}
	e := math.Float64frombits(r[i].Load())
	r[i].Store(math.Float64bits(nextEst(e, d, size)))
}
