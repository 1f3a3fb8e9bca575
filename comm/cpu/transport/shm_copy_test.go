package transport

import (
	"testing"
	"time"
)

// TestSlotCopierChoice: a long message's copier times both ways first,
// prefers cached copies unless they are more than streamingMargin times
// slower, tries the other way every explorePieces pieces however fast they
// come, and follows a change in the timings.
func TestSlotCopierChoice(t *testing.T) {
	var c slotCopier
	cost := map[int]time.Duration{copyCached: 60 * time.Microsecond, copyStreaming: 70 * time.Microsecond}
	run := func(slots int) (counts [2]int) {
		for range slots {
			m := c.choose(false, 0)
			counts[m]++
			c.observe(m, cost[m], shmChunk)
		}
		return counts
	}
	if got := run(2); got != [2]int{1, 1} {
		t.Fatalf("first two slots: %v, want one of each way", got)
	}
	// Similar speeds: cached, with one timed streaming slot per explorePieces.
	got := run(explorePieces * 10)
	if got[copyStreaming] != 10 {
		t.Fatalf("similar speeds: %v, want 10 streaming slots of %d", got, explorePieces*10)
	}
	// Cached slows sixfold (the vCPUs moved apart): streaming takes over,
	// and cached is only timed every explorePieces slots.
	cost[copyCached] = 360 * time.Microsecond
	run(explorePieces * 4)
	got = run(explorePieces * 10)
	if got[copyCached] != 10 {
		t.Fatalf("slow cached copies: %v, want 10 cached slots of %d", got, explorePieces*10)
	}
	// Cached at 1.4x streaming is within the margin: back to cached.
	cost[copyCached] = 98 * time.Microsecond
	run(explorePieces * 8) // within about six timed cached slots
	got = run(explorePieces * 10)
	if got[copyStreaming] != 10 {
		t.Fatalf("cached within the margin: %v, want 10 streaming slots of %d", got, explorePieces*10)
	}
	// One descheduled copy does not flip the choice.
	cost[copyCached] = 60 * time.Microsecond
	run(explorePieces * 2)
	cost[copyCached] = 50 * time.Millisecond
	if m := c.choose(false, 0); m != copyCached {
		t.Fatalf("slot %d: way %d, want cached", c.n, m)
	}
	c.observe(copyCached, cost[copyCached], shmChunk)
	cost[copyCached] = 60 * time.Microsecond
	if got := run(explorePieces - 1); got[copyCached] < explorePieces-2 {
		t.Fatalf("after one outlier: %v, want cached kept", got)
	}
}

// TestSlotCopierShortTries: a short message's copier prefers cached copies
// unless they are more than smallStreamingMargin times slower, tries the
// other way on the first piece both shortExploreEvery and
// shortExplorePieces after its last try, and follows a change in the
// timings.
func TestSlotCopierShortTries(t *testing.T) {
	var c slotCopier
	var now time.Duration
	cost := map[int]time.Duration{copyCached: 60 * time.Microsecond, copyStreaming: 70 * time.Microsecond}
	// run chooses for pieces that come step apart.
	run := func(pieces int, step time.Duration) (counts [2]int) {
		for range pieces {
			now += step
			m := c.choose(true, now)
			counts[m]++
			c.observe(m, cost[m], shmChunk)
		}
		return counts
	}
	if got := run(2, time.Microsecond); got != [2]int{1, 1} {
		t.Fatalf("first two pieces: %v, want one of each way", got)
	}
	// Similar speeds, pieces 10 µs apart: cached, with one try of
	// streaming per shortExploreEvery (100 ms: 10,000 pieces).
	fast := shortExploreEvery / 10000
	got := run(10000*10, fast)
	if got[copyStreaming] != 10 {
		t.Fatalf("similar speeds, pieces %v apart: %v, want 10 streaming pieces of 100,000", fast, got)
	}
	// Pieces a second apart (ops seldom): one try per shortExplorePieces.
	got = run(shortExplorePieces*3, time.Second)
	if got[copyStreaming] != 3 {
		t.Fatalf("similar speeds, pieces 1 s apart: %v, want 3 streaming pieces of %d", got, shortExplorePieces*3)
	}
	// Cached slows sixfold, beyond smallStreamingMargin (the vCPUs moved apart): streaming takes over
	// at once, and cached is only tried every shortExploreEvery.
	cost[copyCached] = 360 * time.Microsecond
	if got := run(6, fast); got[copyStreaming] < 2 {
		t.Fatalf("cached slowed sixfold: %v, want streaming within 6 pieces", got)
	}
	got = run(10000*10, fast)
	if got[copyCached] != 10 {
		t.Fatalf("slow cached copies: %v, want 10 cached pieces of 100,000", got)
	}
	// Cached at 2.8x streaming is within the margin: back to cached
	// within about six tries.
	cost[copyCached] = 196 * time.Microsecond
	run(10000*8, fast)
	got = run(10000*10, fast)
	if got[copyStreaming] != 10 {
		t.Fatalf("cached within the margin: %v, want 10 streaming pieces of 100,000", got)
	}
	// One descheduled copy does not flip the choice.
	cost[copyCached] = 60 * time.Microsecond
	run(10000*2, fast)
	now += fast
	if m := c.choose(true, now); m != copyCached {
		t.Fatalf("piece %d: way %d, want cached", c.n, m)
	}
	c.observe(copyCached, 50*time.Millisecond, shmChunk)
	if got := run(63, fast); got[copyCached] < 62 {
		t.Fatalf("after one outlier: %v, want cached kept", got)
	}
}

// TestSlotCopierPerByte: pieces count by their time per MiB, so a way
// timed on 256 KiB pieces compares with one timed on 1 MiB pieces.
func TestSlotCopierPerByte(t *testing.T) {
	var c slotCopier
	c.observe(copyCached, 100*time.Microsecond, shmChunk/4) // 400 µs a slot
	c.observe(copyStreaming, 200*time.Microsecond, shmChunk)
	if m := c.choose(false, 0); m != copyStreaming {
		t.Fatalf("cached at 400 µs a slot against streaming at 200: way %d, want streaming", m)
	}
}

// TestStreamCopy: streamCopy copies exactly src, whatever the alignment
// of either side and the length (below, at and above the 128-byte
// blocks of the non-temporal loop), and writes nothing past it.
func TestStreamCopy(t *testing.T) {
	src := make([]byte, 5000)
	for i := range src {
		src[i] = byte(i*7 + 3)
	}
	for _, n := range []int{0, 1, 15, 127, 128, 129, 143, 255, 256, 1000, 4096, 4900} {
		for so := range 17 {
			for do := range 17 {
				dst := make([]byte, n+do+32)
				streamCopy(dst[do:do+n], src[so:so+n])
				for i := range dst {
					want := byte(0)
					if i >= do && i < do+n {
						want = src[so+i-do]
					}
					if dst[i] != want {
						t.Fatalf("n=%d src+%d dst+%d: byte %d is %d, want %d", n, so, do, i, dst[i], want)
					}
				}
			}
		}
	}
}
