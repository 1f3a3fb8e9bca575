package transport

import (
	"testing"
	"time"
)

// TestSlotCopierChoice: the copier times both ways first, prefers cached
// copies unless they are more than streamingMargin times slower, times the
// other way every exploreEvery slots, and follows a change in the timings.
func TestSlotCopierChoice(t *testing.T) {
	var c slotCopier
	cost := map[int]time.Duration{copyCached: 60 * time.Microsecond, copyStreaming: 70 * time.Microsecond}
	run := func(slots int) (counts [2]int) {
		for range slots {
			m := c.choose(streamingMargin)
			counts[m]++
			c.observe(m, cost[m], shmChunk)
		}
		return counts
	}
	if got := run(2); got != [2]int{1, 1} {
		t.Fatalf("first two slots: %v, want one of each way", got)
	}
	// Similar speeds: cached, with one timed streaming slot per 64.
	got := run(64 * 10)
	if got[copyStreaming] != 10 {
		t.Fatalf("similar speeds: %v, want 10 streaming slots of 640", got)
	}
	// Cached slows sixfold (the vCPUs moved apart): streaming takes over,
	// and cached is only timed every 64 slots.
	cost[copyCached] = 360 * time.Microsecond
	run(64 * 4)
	got = run(64 * 10)
	if got[copyCached] != 10 {
		t.Fatalf("slow cached copies: %v, want 10 cached slots of 640", got)
	}
	// Cached at 1.4x streaming is within the margin: back to cached.
	cost[copyCached] = 98 * time.Microsecond
	run(64 * 8) // within about six timed cached slots
	got = run(64 * 10)
	if got[copyStreaming] != 10 {
		t.Fatalf("cached within the margin: %v, want 10 streaming slots of 640", got)
	}
	// One descheduled copy does not flip the choice.
	cost[copyCached] = 60 * time.Microsecond
	run(64 * 2)
	cost[copyCached] = 50 * time.Millisecond
	if m := c.choose(streamingMargin); m != copyCached {
		t.Fatalf("slot %d: way %d, want cached", c.n, m)
	}
	c.observe(copyCached, cost[copyCached], shmChunk)
	cost[copyCached] = 60 * time.Microsecond
	if got := run(63); got[copyCached] < 62 {
		t.Fatalf("after one outlier: %v, want cached kept", got)
	}
}

// TestSlotCopierPerByte: pieces count by their time per MiB, so a way
// timed on 256 KiB pieces compares with one timed on 1 MiB pieces.
func TestSlotCopierPerByte(t *testing.T) {
	var c slotCopier
	c.observe(copyCached, 100*time.Microsecond, shmChunk/4) // 400 µs a slot
	c.observe(copyStreaming, 200*time.Microsecond, shmChunk)
	c.n = 1
	if m := c.choose(streamingMargin); m != copyStreaming {
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
