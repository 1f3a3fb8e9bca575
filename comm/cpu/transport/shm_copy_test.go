package transport

import (
	"bytes"
	"math"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// TestSlotCopierChoice: the copier times both ways first, prefers cached
// copies unless they are more than streamingMargin times slower, times the
// other way every exploreEvery slots, and follows a change in the timings.
func TestSlotCopierChoice(t *testing.T) {
	var c slotCopier
	cost := map[int]time.Duration{copyCached: 60 * time.Microsecond, copyStreaming: 70 * time.Microsecond}
	run := func(slots int) (counts [2]int) {
		for range slots {
			m := c.choose(streamingMargin, [2]float64{})
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
	if m := c.choose(streamingMargin, [2]float64{}); m != copyCached {
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
	if m := c.choose(streamingMargin, [2]float64{}); m != copyStreaming {
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

// TestSlotCopierPairChoice: once the reader has timed both ways, the
// copier weighs the sum of both sides' times: it streams when the
// reader's cached reads cost more than streaming costs the writer, though
// the writer's own cached copies are faster, and keeps cached copies when
// streamed reads cost the reader more than streaming saves the writer.
// Until the reader has timed both ways, the writer's times decide.
func TestSlotCopierPairChoice(t *testing.T) {
	c := slotCopier{n: 1}
	c.observe(copyCached, 60*time.Microsecond, shmChunk)
	c.observe(copyStreaming, 70*time.Microsecond, shmChunk)
	ns := func(d time.Duration) float64 { return float64(d.Nanoseconds()) }
	if m := c.choose(streamingMargin, [2]float64{ns(100 * time.Microsecond), 0}); m != copyCached {
		t.Fatalf("reader without a streaming time: way %d, want cached (the writer's own times)", m)
	}
	if m := c.choose(streamingMargin, [2]float64{ns(100 * time.Microsecond), ns(40 * time.Microsecond)}); m != copyStreaming {
		t.Fatalf("160 µs a MiB cached against 110 streaming: way %d, want streaming", m)
	}
	if m := c.choose(streamingMargin, [2]float64{ns(45 * time.Microsecond), ns(40 * time.Microsecond)}); m != copyCached {
		t.Fatalf("105 µs a MiB cached against 110 streaming: way %d, want cached", m)
	}
	// Within pairMargin: cached stays.
	if m := c.choose(streamingMargin, [2]float64{ns(55 * time.Microsecond), ns(40 * time.Microsecond)}); m != copyCached {
		t.Fatalf("115 µs a MiB cached against 110 streaming: way %d, want cached", m)
	}
	// The writer's cached copies 6x slower, but the reader's streamed
	// reads slower still: cached.
	c = slotCopier{n: 1}
	c.observe(copyCached, 360*time.Microsecond, shmChunk)
	c.observe(copyStreaming, 60*time.Microsecond, shmChunk)
	if m := c.choose(streamingMargin, [2]float64{ns(20 * time.Microsecond), ns(400 * time.Microsecond)}); m != copyCached {
		t.Fatalf("380 µs a MiB cached against 460 streaming: way %d, want cached", m)
	}
}

// TestShmReaderTimesPieces: over a pair of rings, the writer marks each
// piece it chose a way for and the reader times its copy of it into the
// ring's reader estimates, per way and per copier; the data arrives
// intact whatever the way; reader estimates written into the control page
// steer the writer's next choice.
func TestShmReaderTimesPieces(t *testing.T) {
	mem := make([]byte, shmDataOff+2*(1<<20))
	tx := RingsOver(mem, 1<<20, true)
	rx := RingsOver(mem, 1<<20, false)
	for _, l := range []*ShmLink{tx, rx} {
		l.ctl = NewCtl()
		l.ctrl = &departCtrl{before: func() {}, gone: true} // never asked: data is always there
	}
	msg := make([]byte, 3*shmPiece-HeaderSize) // header and payload fill three pieces
	for i := range msg {
		msg[i] = byte(i*13 + 5)
	}
	got := make([]byte, len(msg))
	send := func(seq uint64) {
		t.Helper()
		h := Header{Kind: kindColl, Sender: 0, FP: comm.Fingerprint{Seq: seq, Op: comm.OpBroadcast}, Len: uint64(len(msg))}
		if err := tx.send(&h, msg); err != nil {
			t.Fatal(err)
		}
		if err := tx.flush(); err != nil {
			t.Fatal(err)
		}
		hh, ok, err := rx.poll()
		if err != nil || !ok || hh != h {
			t.Fatalf("poll %d: %+v %v %v", seq, hh, ok, err)
		}
		clear(got)
		if err := rx.read(&hh, sink{dst: got}); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("message %d arrived changed (%v)", seq, err)
		}
	}
	send(1)
	// The copier's first two pieces take one way each (it has timed
	// neither), so the reader has timed both.
	if e := rx.rx.rest.of(0); e[copyCached] <= 0 || e[copyStreaming] <= 0 {
		t.Fatalf("reader estimates after one message: %v, want both ways timed", e)
	}
	if e := rx.rx.rest.of(1); e != [2]float64{} {
		t.Fatalf("forward estimates %v without a forward", e)
	}
	// Whatever the writer's own times, a reader whose cached reads cost
	// 100 times its streamed ones makes it stream, and the reverse.
	for _, way := range []int{copyStreaming, copyCached, copyStreaming} {
		slow := 1 - way
		tx.tx.rest[slow].Store(math.Float64bits(1e9))
		tx.tx.rest[way].Store(math.Float64bits(1e7))
		tx.copiers[0].n = 1 // not an exploring piece
		send(2)
		if m := tx.tx.markOf((tx.tx.local - shmPiece) % tx.tx.size).Load(); m != uint32(1+way) {
			t.Fatalf("reader times favour way %d: last piece marked %d, want %d", way, m, 1+way)
		}
	}
}

// TestNextEst: a sample faster than the estimate replaces it; a slower
// one moves it a quarter of the way, counting as at most twice it.
func TestNextEst(t *testing.T) {
	e := nextEst(0, 100*time.Microsecond, shmChunk)
	if e != 100e3 {
		t.Fatalf("first sample: %v ns a MiB, want 100000", e)
	}
	if e = nextEst(e, 40*time.Microsecond, shmChunk/2); e != 80e3 {
		t.Fatalf("after a faster sample (80 µs a MiB): %v, want 80000", e)
	}
	if e = nextEst(e, time.Second, shmChunk); e != 100e3 {
		t.Fatalf("after an outlier: %v, want 100000 (a quarter of the way to twice 80000)", e)
	}
	for range 3 {
		e = nextEst(e, 400*time.Microsecond, shmChunk)
	}
	if e < 190e3 {
		t.Fatalf("after three samples of 400 µs: %v, want at least 190000", e)
	}
}

// TestShmReaderTimesOwnCopy: the reader's time of a piece leaves out what
// a forward's sends copied during its delivery (Ctl.copyNs), and keeps
// the rest of the delivery's time.
func TestShmReaderTimesOwnCopy(t *testing.T) {
	mem := make([]byte, shmDataOff+2*(1<<20))
	tx := RingsOver(mem, 1<<20, true)
	rx := RingsOver(mem, 1<<20, false)
	for _, l := range []*ShmLink{tx, rx} {
		l.ctl = NewCtl()
		l.ctrl = &departCtrl{before: func() {}, gone: true}
	}
	msg := make([]byte, shmPiece-HeaderSize)
	recv := func(fn func(off int, seg []byte) error) {
		t.Helper()
		h := Header{Kind: kindColl, FP: comm.Fingerprint{Seq: 1, Op: comm.OpBroadcast}, Len: uint64(len(msg))}
		if err := tx.send(&h, msg); err != nil {
			t.Fatal(err)
		}
		hh, ok, err := rx.poll()
		if err != nil || !ok {
			t.Fatalf("poll: %v %v", ok, err)
		}
		if err := rx.read(&hh, sink{fn: fn}); err != nil {
			t.Fatal(err)
		}
	}
	// A delivery that spends 5 ms, all of it in a forward's copies: no
	// sample (the way is the copier's first, cached).
	recv(func(int, []byte) error {
		time.Sleep(5 * time.Millisecond)
		rx.ctl.copyNs += (10 * time.Millisecond).Nanoseconds()
		return nil
	})
	if e := rx.rx.rest.of(0); e != [2]float64{} {
		t.Fatalf("a delivery spent in a forward's copies was timed: %v", e)
	}
	// 5 ms of its own: timed, at 5 ms per 256 KiB or more.
	recv(func(int, []byte) error { time.Sleep(5 * time.Millisecond); return nil })
	e := rx.rx.rest.of(0)
	if got := e[copyCached] + e[copyStreaming]; got < 4*float64((5*time.Millisecond).Nanoseconds()) {
		t.Fatalf("a 5 ms delivery of 256 KiB: estimates %v ns a MiB, want at least 20 ms", e)
	}
}
