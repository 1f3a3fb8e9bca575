package transport

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// flatStep is the step number written in slot headers.
const flatStep = 1 << 23

// Publish implements Slots. Op k uses slot k%2 and box k%2, which op
// k-2 used last: every peer must have finished reading them first. A
// peer reads op k-2's before it publishes op k-1 (one goroutine, in
// order), so it has once its box (k-1)%2 reached k-1. This rank saw every
// rank's reach k-1 if it completed op k-1 (m.fall, set by the op's first
// peer Slot), the case of every op after a successful one: then it
// checks nothing in shared memory, which saves a read of a line each
// peer wrote (a cache miss) and a write to one (an acknowledgement word
// the peers read, as this segment used to have). Otherwise it waits for
// each peer's box.
//
// The slot gets the op's full header; the box, one cache line, gets what
// a reader checks (a hash of the fingerprint, its seq and the payload's
// length), the payload itself when it fits (boxPayload bytes), and last
// the op's number, which publishes it. A reader that waits on the box
// finds everything a small op needs in the one line it waited on, where
// it used to find a sequence word and then read the slot's header and
// payload (two more lines, fetched after the word changed: one more
// transfer between the cores, on every op).
func (m *Mesh) Publish(payload []byte) error {
	g := m.Grp
	if m.early != 0 {
		return m.takeEarly(payload)
	}
	if len(payload) > g.slotBytes {
		return &comm.EngineError{Engine: "cpu", Rank: m.rank, FP: m.Cur.FP,
			Msg: fmt.Sprintf("internal error: %d bytes for a %d-byte shm slot", len(payload), g.slotBytes)}
	}
	k := g.K + 1
	if k > 2 && m.fall+1 < k {
		for p := range g.size {
			if p != m.rank {
				if err := m.flatWait(g.r[p].pub[(k-1)%2], k-1); err != nil {
					return err
				}
			}
		}
	}
	me := &g.r[m.rank]
	slot, box := me.slot[k%2], me.box[k%2]
	m.fh = Header{Kind: kindColl, Sender: m.rank, FP: m.Cur.FP, Step: flatStep, Len: uint64(len(payload))}
	m.fh.encode(slot[:HeaderSize])
	m.fph = fpHash(&m.Cur.FP)
	putBox(box, m.fph, m.Cur.FP.Seq, len(payload))
	if len(payload) <= boxPayload {
		copy(box[boxHead:], payload)
	} else {
		copy(slot[HeaderSize:], payload)
	}
	g.K = k
	me.pub[k%2].Store(k)
	// The peers wait for every slot (Slot(0) waits for all): only the
	// last rank to publish wakes them, so that a waiter sleeps and wakes
	// once per op, not once per peer. That rank sees every box at k; a
	// waiter that raised its sleeping flag after this check sees every
	// box too (sequentially consistent atomics), so none is missed.
	if m.allPublished(k) {
		m.wakePeers()
	}
	return nil
}

// PublishEarly begins op o and publishes payload as its one-step slot
// (Publish) ahead of the op's run, if that needs no wait: the launch of a
// small op on an idle stream (Engine.Launch) puts its slot where the peers
// see it before the launching rank goes through its bookkeeping, so that
// a peer that waits for this rank (one that arrived first) goes on
// sooner. The op's run later calls Begin and Publish with the same op and
// payload as usual; that Publish only checks that they are what was
// published (takeEarly). It reports whether it published: not when the
// mesh has no group segment, the payload does not fit a slot, or the
// slot's previous use may still be read by a peer (Publish would wait).
// The caller owns the mesh (the stream is idle) and must run the op next.
func (m *Mesh) PublishEarly(o OpCtx, payload []byte) bool {
	g := m.Grp
	if g == nil || len(payload) > g.slotBytes {
		return false
	}
	if k := g.K + 1; k > 2 && m.fall+1 < k {
		return false
	}
	m.Begin(o)
	if err := m.Publish(payload); err != nil {
		return false // unreachable: it fits and needs no wait
	}
	m.early, m.earlyData = g.K, payload
	return true
}

// takeEarly is Publish for the op PublishEarly published: payload must be
// the bytes published then, and the op the current one.
func (m *Mesh) takeEarly(payload []byte) error {
	k, d := m.early, m.earlyData
	m.early, m.earlyData = 0, nil
	if k == m.Grp.K && len(payload) == len(d) && (len(d) == 0 || &payload[0] == &d[0]) {
		return nil
	}
	return &comm.EngineError{Engine: "cpu", Rank: m.rank, FP: m.Cur.FP,
		Msg: fmt.Sprintf("internal error: the op's slot was published early with %d bytes, its run publishes %d", len(d), len(payload))}
}

// allPublished reports whether every rank published one-step op k.
func (m *Mesh) allPublished(k uint64) bool {
	for p := range m.Grp.size {
		if m.Grp.r[p].pub[k%2].Load() < k {
			return false
		}
	}
	return true
}

// Slot implements Slots. A peer's box that matches this rank's op (the
// fingerprint's hash, its seq, n bytes) is all it reads besides the
// payload; one that does not sends it to the slot's full header, which
// names what differs (checkColl).
func (m *Mesh) Slot(p, n int) ([]byte, error) {
	g := m.Grp
	f := &g.r[p]
	slot, box := f.slot[g.K%2], f.box[g.K%2]
	if p != m.rank {
		if m.fall != g.K {
			// The op's first peer slot: wait for every rank's.
			if err := m.flatWait(nil, g.K); err != nil {
				return nil, err
			}
			m.fall = g.K
		}
		if !boxMatches(box, m.fph, m.Cur.FP.Seq, n) {
			return nil, m.slotMismatch(p, n, slot)
		}
	}
	if n <= boxPayload {
		return box[boxHead : boxHead+n], nil
	}
	return slot[HeaderSize : HeaderSize+n], nil
}

// slotMismatch is the error for rank p's slot of this op, whose box does
// not match it (Slot): the full header's difference (checkColl), or a
// protocol error if the header matches what the box did not.
func (m *Mesh) slotMismatch(p, n int, slot []byte) error {
	h, err := decodeHeader(slot[:HeaderSize])
	if err != nil {
		return &comm.EngineError{Engine: "cpu", Rank: m.rank, FP: m.Cur.FP, Msg: fmt.Sprintf("shm slot of rank %d: %v", p, err)}
	}
	if err := m.checkColl(p, flatStep, n, h); err != nil {
		return err
	}
	return &comm.EngineError{Engine: "cpu", Rank: m.rank, FP: m.Cur.FP,
		Msg: fmt.Sprintf("protocol error: rank %d's shm box disagrees with its slot header (%v)", p, h.FP)}
}

// The fast box after its op number (flatRank.box): the fingerprint's
// hash, its seq, the payload's length, then the payload when it fits.
const (
	boxHead    = 24
	boxPayload = 32
	boxBytes   = boxHead + boxPayload
)

func putBox(b []byte, fph, seq uint64, n int) {
	_ = b[boxHead-1]
	binary.LittleEndian.PutUint64(b[0:], fph)
	binary.LittleEndian.PutUint64(b[8:], seq)
	binary.LittleEndian.PutUint64(b[16:], uint64(n))
}

func boxMatches(b []byte, fph, seq uint64, n int) bool {
	_ = b[boxHead-1]
	return binary.LittleEndian.Uint64(b[0:]) == fph && binary.LittleEndian.Uint64(b[8:]) == seq &&
		binary.LittleEndian.Uint64(b[16:]) == uint64(n)
}

// fpHash is a 64-bit hash of every field of fp but its seq (the box
// carries the seq itself): group, epoch, op, dtype, reduce op, count,
// root and shape, each mixed in with splitmix64's finalizer (mix64).
// Two ops that differ in any of them agree on it with probability
// 2^-64; Slot relies on that to check a peer's op from its box alone.
func fpHash(fp *comm.Fingerprint) uint64 {
	h := fp.Group
	for _, v := range [...]uint64{uint64(fp.Epoch)<<32 | uint64(uint32(fp.Root)),
		uint64(fp.Op) | uint64(fp.DType)<<8 | uint64(fp.RedOp)<<16, uint64(fp.Count), uint64(fp.Shape)} {
		h = mix64(h^v) + 0x9e3779b97f4a7c15
	}
	return h
}

// wakePeers wakes the peers that sleep waiting (for a slot, a sequence
// word or a message): on their bells (shm_group.go), or through the pair links.
func (m *Mesh) wakePeers() {
	if m.Grp.Doorbell {
		m.Grp.wakePeers()
		return
	}
	for _, s := range m.ctl.Pumps {
		s.nudge()
	}
}

// flatWait waits until *w reaches target (w nil: every rank's seq), under the wait policy of
// shm_group.go. Meanwhile it watches for what would make the wait endless:
// the engine stopped, a recorded failure (a peer's notice), a dead peer,
// and a peer that sent a message of a message-based op at or before this
// op's seq (it launched something else: a mismatch, peerMsg).
func (m *Mesh) flatWait(w *atomic.Uint64, target uint64) error {
	if m.reached(w, target) || m.spinTight(w, target) || m.yieldTight(w, target) {
		return nil
	}
	var b backoff
	for {
		// What it waits for first, failures after, as the links read
		// data before they report a dead peer: a peer that published its
		// slot and then closed the group (it finished this op) does not
		// fail it.
		if m.reached(w, target) {
			b.reset()
			return nil
		}
		if err := m.Fatal(); err != nil {
			b.reset()
			return err
		}
		q, h, stray, err := m.peerMsg()
		if err != nil {
			b.reset()
			return m.unlessReached(w, target, err)
		}
		if stray {
			b.reset()
			// A peer that published what this wait needs and then went
			// on to a message-based part of the same op (the fallback of
			// a failed single copy, allgather_cma.go) sent that message
			// after its slot: it is no mismatch. Checked before Mismatch,
			// which records the failure and tells every peer.
			if m.reached(w, target) {
				return nil
			}
			return m.Mismatch(q, h, fmt.Sprintf("rank %d sent a message (%s) where rank %d expected a shared-memory slot",
				q, stepName(int(h.Step)), m.rank))
		}
		if err := b.pause(m.ctl); err != nil {
			b.reset()
			return err
		}
	}
}

// unlessReached is err, a peer's dead link, unless the wait's condition
// holds by now: the peer published what the wait needs between the wait's
// check and the poll that found its link gone (it published its last
// slot, finished the op, and destroyed the group or exited). Every rank's
// data for this op is there, so the op completes, as it did on that peer;
// failing it here would let the peer succeed where this rank fails. (A
// recorded failure of this op's seq fails it regardless: Engine.run.)
func (m *Mesh) unlessReached(w *atomic.Uint64, target uint64, err error) error {
	if m.reached(w, target) {
		return nil
	}
	return err
}

// tightSpin is how long a one-step op's wait first re-checks its
// condition in a tight loop (Mesh.spinTight), with no call in between;
// tightCheck is how many checks go between two readings of the clock.
// The policy of pace.next (shm_group.go) calls runtime.Gosched and reads
// the clock between checks, about 0.3 µs on the development VM, so a
// peer that publishes during that call is seen up to 0.3 µs late, on
// every small op; the tight loop sees it within a few nanoseconds. For
// at most tightSpin the rank's other goroutines (GOMAXPROCS=1 under
// rankrunner) do not run and a failure is not noticed, which the
// watchdog's and a peer's time scales (milliseconds) do not notice.
const (
	tightSpin  = 3 * time.Microsecond
	tightCheck = 64
)

// spinTight re-checks a one-step op's wait condition (flatWait) in a
// tight loop for at most tightSpin, when the rank may spin: its group
// spans processes whose ranks have a CPU each (ShmGroup.Spin > 0; never
// when the ranks outnumber the CPUs, docs/algorithms.md, "Waiting"). It
// reports whether the condition was reached, recording such a wait in
// the group's forecast as a zero wait (ShmGroup.noteShortWait).
func (m *Mesh) spinTight(w *atomic.Uint64, target uint64) bool {
	g := m.ctl.Grp.Load()
	if g == nil || g.Spin <= 0 {
		return false
	}
	var start time.Time
	for i := 1; ; i++ {
		if m.reached(w, target) {
			g.noteShortWait()
			return true
		}
		if i%tightCheck == 0 {
			if start.IsZero() {
				start = time.Now()
			} else if time.Since(start) >= tightSpin {
				return false
			}
		}
	}
}

// tightYields is how many times an oversubscribed one-step op's wait
// first hands the CPU over (sched_yield) with nothing but a re-check of
// its condition in between (Mesh.yieldTight). The paced policy's yield
// step (shm_group.go) also runs this process's other goroutines
// (runtime.Gosched), reads the clock and polls every pair link between
// two yields; with more ranks than CPUs an op waits there once per op
// for a peer that shares its CPU, and those calls lengthened every such
// op. On the 2-core VM, 2026-11-27, 5000 ops a size, 5–6 rounds
// interleaved with the build before, mean µs per op (median over
// rounds), before → after: broadcast at 3 ranks 4 B 9.18 → 6.64, 4 KiB
// 9.07 → 7.62; at 4 ranks 4 B 10.31 → 8.04, 4 KiB 12.69 → 9.93;
// allreduce at 4 ranks 4 B 11.32 → 8.65. In an earlier run 16 yields
// were no better than 4, and a clock reading after each yield, to bound
// the loop's time as well, cost 0.5–1 µs of the gain, so the count alone
// bounds it.
const tightYields = 4

// yieldTight is spinTight's counterpart for a rank that may not spin but
// yields (ShmGroup.Spin 0 and Yield > 0: the group's ranks outnumber
// their CPUs): it yields the CPU at most tightYields times, re-checking
// the condition after each, and reports whether it was reached. A
// failure is not noticed meanwhile, for those few yields: each lasts
// until the processes queued on this CPU had their turn (microseconds
// for a peer rank, a scheduler slice, a few milliseconds, for a process
// that computes). Oversubscribed waits are not forecast, so nothing is
// recorded.
func (m *Mesh) yieldTight(w *atomic.Uint64, target uint64) bool {
	g := m.ctl.Grp.Load()
	if g == nil || g.Spin > 0 || g.Yield <= 0 {
		return false
	}
	for range tightYields {
		osYield()
		if m.reached(w, target) {
			return true
		}
	}
	return false
}

func (m *Mesh) reached(w *atomic.Uint64, target uint64) bool {
	if w == nil {
		return m.allPublished(target)
	}
	return w.Load() >= target
}

// peerMsg polls every link while a one-step op waits, and returns the
// first peer q whose next message h is a collective's at or before the
// current seq (stray). Unless q has published what the wait needs (then
// the message belongs to a later, message-based part of the same op:
// flatWait), its sender runs a message-based op where this rank runs a
// one-step one: the ranks launched different ops (the choice between the
// two is a function of the fingerprint alone), a mismatch. A message of a
// later seq is left for the op it belongs to (its sender finished this
// op already); a point-to-point message is stashed for its Recv, as
// recvColl does.
func (m *Mesh) peerMsg() (int, Header, bool, error) {
	for q, l := range m.links {
		if l == nil {
			continue
		}
		h, ok, err := l.poll()
		if err != nil {
			return q, Header{}, false, m.transportErr(q, err)
		}
		if !ok {
			continue
		}
		if h.Kind == kindP2P {
			if err := m.stashMsg(q, h); err != nil {
				return q, Header{}, false, err
			}
			continue
		}
		if h.Kind == kindColl && h.FP.Seq <= m.Cur.FP.Seq {
			return q, h, true, nil
		}
	}
	return 0, Header{}, false, nil
}

// checkPeerSlots is recvColl's counterpart of peerMsg: while a
// message-based op waits, a peer that published a slot of a one-step op
// this rank has not run, at or before the current seq, launched something
// else (a mismatch). Unlike peerMsg's, this check has no exception for a
// peer that sent what the wait needs and then went on to a one-step part
// of the same op: no op moves from messages to slots within one seq.
func (m *Mesh) checkPeerSlots() error {
	g := m.Grp
	for q := range g.size {
		if q == m.rank {
			continue
		}
		s := g.r[q].published()
		if s <= g.K {
			continue
		}
		// Slot s%2 stays as rank q wrote it until this rank publishes op
		// s+1 (q reuses it for op s+2 only then), and it has not run op s.
		h, err := decodeHeader(g.r[q].slot[s%2][:HeaderSize])
		if err != nil {
			return &comm.EngineError{Engine: "cpu", Rank: m.rank, FP: m.Cur.FP, Msg: fmt.Sprintf("shm slot of rank %d: %v", q, err)}
		}
		if h.FP.Seq <= m.Cur.FP.Seq {
			return m.Mismatch(q, h, fmt.Sprintf("rank %d published a shared-memory slot where rank %d expected a message", q, m.rank))
		}
	}
	return nil
}
