package transport

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Shared-memory segment layout (one file per pair of ranks, created by the
// lower rank in ShmDir and unlinked once both mapped it):
//
//	0    ring 0 tail (u64, written by the lower rank)   ring 0: lower → higher
//	128  ring 0 head (u64, written by the higher rank)
//	256  ring 1 tail (u64, written by the higher rank)  ring 1: higher → lower
//	384  ring 1 head (u64, written by the lower rank)
//	512  lower rank asleep (u32)   640  higher rank asleep (u32)
//	4096 ring 0 data (R bytes), then ring 1 data (R bytes)
//
// Head and tail are running byte counts (never wrapped); producer and
// consumer sit on separate cache lines. Messages are a 64-byte header and
// the payload padded to 16 bytes (padMsg), and rings are a multiple of 16
// bytes, so every payload starts 16-byte aligned in the ring and every
// piece a writer publishes ends at a multiple of 16 bytes of payload (or
// the payload's end): no element (at most 16 bytes, complex128) is split
// between two pieces by the wrap or a piece boundary, so a reducing reader
// always gets whole elements. (With 8-byte padding a complex128 payload
// could start 8 bytes off and a piece end mid-element.)
const (
	shmDataOff = 4096
	// shmChunk is the unit of the copiers' estimates (their time per
	// shmChunk bytes, shm_copy.go). A reader copies at most a piece at a
	// time (shmPiece), so that each timed copy is of one way.
	shmChunk = 1 << 20
	// shmPiece bounds one copy into a ring: senders split the ring into
	// pieces of shmPiece bytes, a copy never crosses a piece boundary and
	// starts only once its whole piece is free. The reader can start on
	// a message after its first 256 KiB, which matters when the ranks
	// take turns (a chunk of the ring allreduce, comm/cpu/allreduce_ring.go,
	// waits for the first piece of the peer's chunk): measured with 2
	// ranks, 1 MiB pieces made 2 MiB allreduces 10-30 % slower and the
	// larger sizes no faster. slotCopier (shm_copy.go) chooses per piece
	// how to store it.
	shmPiece = 256 << 10
)

// shmRing is one direction of an shm pair.
type shmRing struct {
	tail, head *atomic.Uint64
	data       []byte
	size       uint64
	local      uint64 // our own counter: tail for the producer, head for the consumer
	// marks and rest: each piece's way, and the reader's times of them
	// (shm_copy.go).
	marks *[markSlots]atomic.Uint32
	rest  *readerEst
}

// markOf is the mark word of the piece at ring offset at.
func (r *shmRing) markOf(at uint64) *atomic.Uint32 {
	return &r.marks[(at/shmPiece)%markSlots]
}

// padMsg is n rounded up to the 16-byte granularity of the rings.
func padMsg(n uint64) uint64 { return (n + 15) &^ 15 }

// ShmLink is a link whose data moves through two shm rings; its control
// connection (a control-only tcpLink) carries mismatch notices and tells
// when the peer process died. Small sends are copied into the ring by the
// caller; what does not fit is finished by a writer goroutine, so sends
// never wait for the peer to receive. The receiver spins (with backoff) on
// the ring's tail and reduces straight out of the shared pages.
type ShmLink struct {
	Path string // the segment's file ("" for Go memory)
	mem  []byte // the mapped segment: shmDataOff control bytes, then both rings
	tx   shmRing
	rx   shmRing

	peer int
	ctl  *Ctl
	ctrl control

	cur    Header // polled, not yet read, when hasCur (progress goroutine only)
	hasCur bool

	// mySleep is set while this rank sleeps on its rings; peerSleep while
	// the peer does. Whoever moves a ring counter clears the other's flag
	// and wakes it through the control channel.
	mySleep, peerSleep *atomic.Uint32

	q    []*shmJob // queued sends, oldest first (progress goroutine only)
	werr error     // the peer died while we had sends queued
	// copiers choose how pieces are copied into tx (progress goroutine
	// only): [0] for sends, whose payload comes from memory, [1] for
	// forwards (mesh_forward.go), whose payload is still in cache.
	copiers [2]slotCopier

	// grp is the group segment, or nil: with it the peer sleeps on its
	// bell there, and nudge rings it instead of writing to the control
	// connection.
	Grp *ShmGroup

	unmapOnce sync.Once
}

type shmJob struct {
	hdr     [HeaderSize]byte
	payload []byte
	pos     uint64 // bytes of header+padded payload written so far
	// held is set while the payload is still being produced (a forward,
	// mesh_forward.go): only its first ready bytes may be copied.
	held  bool
	ready uint64
	fwd   bool // a forward: its payload is copied while in cache
}

func randomName() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// CreateShm creates and maps a new segment with two rings of ringBytes.
func CreateShm(dir string, ringBytes int) (*ShmLink, error) {
	path := filepath.Join(dir, fmt.Sprintf("ranktree-%d-%s", os.Getpid(), randomName()))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size := shmDataOff + 2*ringBytes
	if err := f.Truncate(int64(size)); err != nil {
		_ = os.Remove(path)
		return nil, err
	}
	s, err := mapShm(f, path, size, ringBytes, true)
	if err != nil {
		_ = os.Remove(path)
		return nil, err
	}
	return s, nil
}

// OpenShm maps the segment a lower rank created.
func OpenShm(path string, ringBytes int, creator bool) (*ShmLink, error) {
	size := shmDataOff + 2*ringBytes
	f, err := openSegment(path, size, "shm segment", "ShmRingBytes")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return mapShm(f, path, size, ringBytes, creator)
}

// openSegment opens the shared-memory file a peer created at path and
// checks that it has size bytes; a different size means the ranks were
// configured differently (hint names the option). The caller closes f.
func openSegment(path string, size int, what, hint string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if st.Size() != int64(size) {
		f.Close()
		return nil, fmt.Errorf("%s %s has %d bytes, want %d (ranks disagree on %s?)", what, path, st.Size(), size, hint)
	}
	return f, nil
}

// mapShm maps the segment with MAP_POPULATE: every page of both rings is
// allocated and mapped here, at rendezvous, instead of faulting in on first
// touch. The ring offsets only move forward, so without it the first lap
// of a ring pays a page fault per new 4 KiB page on each side, which made
// 1-8 KiB messages slower than 64 KiB ones until the rings had been lapped
// (issue 15). It then touches every page (touchPages), for hosts where a
// mapped page's first access is still dear.
func mapShm(f *os.File, path string, size, ringBytes int, creator bool) (*ShmLink, error) {
	mem, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	touchPages(mem)
	s := RingsOver(mem, ringBytes, creator)
	s.Path = path
	return s, nil
}

// RingsOver lays the two rings of a pair over mem (shmDataOff +
// 2·ringBytes bytes, 8-byte aligned): the lower rank passes creator true.
func RingsOver(mem []byte, ringBytes int, creator bool) *ShmLink {
	u64 := func(off int) *atomic.Uint64 { return (*atomic.Uint64)(unsafe.Pointer(&mem[off])) }
	R := uint64(ringBytes)
	marks := func(off int) *[markSlots]atomic.Uint32 { return (*[markSlots]atomic.Uint32)(unsafe.Pointer(&mem[off])) }
	est := func(off int) *readerEst { return (*readerEst)(unsafe.Pointer(&mem[off])) }
	// Control page: the counters and sleep flags on lines of their own
	// (0-767), the readers' estimates (768, 896), each ring's piece marks
	// (1024, 2048: markSlots words).
	r0 := shmRing{tail: u64(0), head: u64(128), data: mem[shmDataOff : shmDataOff+ringBytes], size: R, rest: est(768), marks: marks(1024)}
	r1 := shmRing{tail: u64(256), head: u64(384), data: mem[shmDataOff+ringBytes : shmDataOff+2*ringBytes], size: R, rest: est(896), marks: marks(2048)}
	u32 := func(off int) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Pointer(&mem[off])) }
	s := &ShmLink{mem: mem}
	if creator {
		s.tx, s.rx = r0, r1
		s.mySleep, s.peerSleep = u32(512), u32(640)
	} else {
		s.tx, s.rx = r1, r0
		s.mySleep, s.peerSleep = u32(640), u32(512)
	}
	return s
}

// nudge wakes the peer if it sleeps on its rings (after a counter moved).
func (s *ShmLink) nudge() {
	if s.Grp != nil {
		s.Grp.wake(s.peer)
		return
	}
	if s.peerSleep.Load() != 0 && s.peerSleep.CompareAndSwap(1, 0) {
		s.ctrl.wakePeer()
	}
}

// control is the side channel of a ring link: it reports a dead peer and
// carries mismatch notices (a control-only tcpLink for shm, the hub for
// inmem).
type control interface {
	readErr() error
	NoticeLink
	wakePeer()
	Close()
}

// Start attaches the link to its peer.
func (s *ShmLink) Start(peer int, c *Ctl, ctrl control) {
	s.peer, s.ctl, s.ctrl = peer, c, ctrl
}

func (s *ShmLink) spins() bool { return true }

// Unlink removes the segment's file (once both ranks mapped it).
func (s *ShmLink) Unlink() { _ = os.Remove(s.Path) }

// Unmap unmaps the segment, once no goroutine uses the link.
func (s *ShmLink) Unmap() {
	if s.Path == "" {
		return // Go memory (inmem transport)
	}
	s.unmapOnce.Do(func() { _ = syscall.Munmap(s.mem) })
}

// Close closes the link's control side (the peer sees it as gone).
func (s *ShmLink) Close() {
	if s.ctrl != nil {
		s.ctrl.Close()
	}
}

// Notice implements NoticeLink through the control side.
func (s *ShmLink) Notice(payload []byte) <-chan struct{} { return s.ctrl.Notice(payload) }
func (s *ShmLink) ack()                                  { s.ctrl.ack() }

// Up implements NoticeLink.
func (s *ShmLink) Up() bool { return s.ctrl.Up() }

// peerErr is the control connection's error (peer died), or nil.
func (s *ShmLink) peerErr() error { return s.ctrl.readErr() }

// writeSome copies as much of j as the ring has room for; it reports
// whether j is complete and whether anything was copied.
func (s *ShmLink) writeSome(j *shmJob) (done, progressed bool) {
	r := &s.tx
	total := HeaderSize + padMsg(uint64(len(j.payload)))
	for j.pos < total {
		limit := total
		if j.held {
			// A forward: no further than the payload produced so far,
			// in whole 16-byte units (see padMsg).
			limit = HeaderSize + j.ready&^15
			if j.pos >= limit {
				return false, progressed
			}
		}
		free := r.size - (r.local - r.head.Load())
		at := r.local % r.size
		// Copy up to the next piece boundary, and only once that whole
		// piece is free (see shmPiece); a ring smaller than a piece
		// takes pieces of at most its size.
		n := min(limit-j.pos, r.size-at, shmPiece-at%shmPiece)
		if free < n {
			// Until the whole header is in, take any free space: the
			// reader frees nothing before it has read a whole header, so
			// waiting for room behind a partial one would deadlock.
			if j.pos >= HeaderSize || free == 0 {
				return false, progressed
			}
			n = free
		}
		way, cp := s.pieceWay(j, n, at)
		s.copyPiece(j, r.data[at:at+n], way, cp)
		j.pos += n
		r.local += n
		r.tail.Store(r.local)
		s.nudge()
		progressed = true
	}
	return true, progressed
}

// pieceWay picks how to store a piece of n bytes of j at ring offset at.
// A piece with at least streamMin bytes of payload: slotCopier picks the
// way (shm_copy.go), from the writer's and, for messages from pairMin,
// the reader's times, and the piece is marked with its way for the
// reader to time it. Otherwise way is -1: a plain copy, untimed.
func (s *ShmLink) pieceWay(j *shmJob, n, at uint64) (way int, cp *slotCopier) {
	ci := 0
	if j.fwd {
		ci = 1
	}
	cp = &s.copiers[ci]
	if payloadIn(j, n) < streamMin {
		return -1, cp
	}
	margin := streamingMargin
	if len(j.payload) <= streamMsgMin {
		margin = smallStreamingMargin
	}
	var rd [2]float64
	if len(j.payload) >= pairMin {
		rd = s.tx.rest.of(ci)
	}
	way = cp.choose(margin, rd)
	s.tx.markOf(at).Store(uint32(1 + way + 2*ci))
	return way, cp
}

// copyPiece copies into dst the part of j from j.pos that is header,
// then payload, storing the payload way way (timed into cp) or, for -1,
// with a plain copy; padding is left as is.
func (s *ShmLink) copyPiece(j *shmJob, dst []byte, way int, cp *slotCopier) {
	p := j.pos
	if p < HeaderSize {
		k := copy(dst, j.hdr[p:])
		dst, p = dst[k:], p+uint64(k)
	}
	if len(dst) == 0 || p-HeaderSize >= uint64(len(j.payload)) {
		return
	}
	src := j.payload[p-HeaderSize:]
	k := min(len(dst), len(src))
	if way < 0 {
		copy(dst[:k], src[:k])
		return
	}
	t0 := time.Now()
	if way == copyStreaming {
		streamCopy(dst[:k], src[:k])
	} else {
		copy(dst[:k], src[:k])
	}
	d := time.Since(t0)
	cp.observe(way, d, k)
	s.ctl.copyNs += d.Nanoseconds()
}

func (s *ShmLink) send(h *Header, payload []byte) error {
	if s.ctl.Stopped.Load() {
		return ErrStopped
	}
	if s.werr != nil {
		return s.werr
	}
	// Nothing queued: try to copy the message in at once from a job on
	// the stack, and queue (allocate) only what the ring has no room for.
	if len(s.q) == 0 {
		var j shmJob
		j.payload = payload
		h.encode(j.hdr[:])
		if done, _ := s.writeSome(&j); done {
			return nil
		}
		q := new(shmJob)
		*q = j
		s.q = append(s.q, q)
		return nil
	}
	j := &shmJob{payload: payload}
	h.encode(j.hdr[:])
	s.q = append(s.q, j)
	s.pump()
	return nil
}

// payloadIn is how many payload bytes (not header, not padding) the n
// bytes of j from j.pos hold.
func payloadIn(j *shmJob, n uint64) int {
	lo := max(j.pos, HeaderSize) - HeaderSize
	hi := min(j.pos+n-min(j.pos+n, HeaderSize), uint64(len(j.payload)))
	if hi <= lo {
		return 0
	}
	return int(hi - lo)
}

// hold queues a message whose payload is still being produced: the header
// goes into the ring at once, the payload only as far as j.ready, which the
// producer advances (mesh_forward.go) before it clears j.held. Messages
// queued after it wait behind it.
func (s *ShmLink) hold(h *Header, payload []byte) (*shmJob, error) {
	if s.ctl.Stopped.Load() {
		return nil, ErrStopped
	}
	if s.werr != nil {
		return nil, s.werr
	}
	j := &shmJob{payload: payload, held: true, fwd: true}
	h.encode(j.hdr[:])
	s.q = append(s.q, j)
	s.pump()
	return j, nil
}

// pump copies queued messages into the tx ring as far as it has room,
// without blocking, and reports whether it copied anything. The progress
// goroutine calls it whenever it would otherwise wait (see ctl.pump), so
// sends progress while this rank receives: no helper goroutine is needed.
func (s *ShmLink) pump() bool {
	progressed := false
	for len(s.q) > 0 {
		done, prog := s.writeSome(s.q[0])
		progressed = progressed || prog
		if !done {
			break
		}
		k := copy(s.q, s.q[1:]) // shift: the array is reused
		s.q[k] = nil
		s.q = s.q[:k]
	}
	return progressed
}

func (s *ShmLink) flush() error {
	var b backoff
	for len(s.q) > 0 {
		if s.ctl.pumpAll() {
			b.reset()
			continue
		}
		if len(s.q) == 0 {
			break
		}
		if err := s.peerErr(); err != nil {
			s.werr = fmt.Errorf("rank %d: %w", s.peer, err)
			s.q = nil
			return s.werr
		}
		if err := s.ctl.Fatal(); err != nil {
			return err
		}
		if err := b.pause(s.ctl); err != nil {
			return err
		}
	}
	return nil
}

func (s *ShmLink) poll() (Header, bool, error) {
	if s.hasCur {
		return s.cur, true, nil
	}
	r := &s.rx
	if r.tail.Load()-r.local < HeaderSize {
		if s.ctl.Stopped.Load() {
			return Header{}, false, ErrStopped
		}
		err := s.peerErr()
		if err == nil {
			return Header{}, false, nil
		}
		// Data before departure: a peer that wrote its last message and
		// then closed the link (it finished the op) between the two
		// checks has that message read, as a socket's would be.
		if r.tail.Load()-r.local < HeaderSize {
			return Header{}, false, err
		}
	}
	var hb [HeaderSize]byte
	at := r.local % r.size
	k := copy(hb[:], r.data[at:])
	copy(hb[k:], r.data)
	r.local += HeaderSize
	r.head.Store(r.local)
	s.nudge()
	h, err := decodeHeader(hb[:])
	if err != nil {
		return Header{}, false, fmt.Errorf("shm ring from rank %d: %w", s.peer, err)
	}
	s.cur, s.hasCur = h, true
	return h, true, nil
}

func (s *ShmLink) read(h *Header, sk sink) error {
	s.hasCur = false
	r := &s.rx
	total := padMsg(h.Len)
	var b backoff
	for got := uint64(0); got < total; {
		avail := r.tail.Load() - r.local
		if avail == 0 {
			if s.ctl.pumpAll() {
				b.reset()
				continue
			}
			if err := s.peerErr(); err != nil {
				if r.tail.Load() != r.local {
					continue // the rest came before the peer left (poll)
				}
				return err
			}
			if err := s.ctl.Fatal(); err != nil {
				return err
			}
			if err := b.pause(s.ctl); err != nil {
				return err
			}
			continue
		}
		b.reset()
		at := r.local % r.size
		// One piece at most (shmPiece), so that a timed copy is of one
		// way (see slotCopier).
		n := min(avail, total-got, r.size-at, shmPiece-at%shmPiece)
		if got < h.Len {
			k := min(n, h.Len-got)
			var mark uint32
			if k >= streamMin {
				mark = r.markOf(at).Load()
			}
			var t0 time.Time
			var w0 int64
			if mark != 0 {
				t0, w0 = time.Now(), s.ctl.copyNs
			}
			if err := sk.deliver(int(got), r.data[at:at+k]); err != nil {
				return err
			}
			if mark != 0 {
				// Less what a forward's sends copied meanwhile (see Ctl.copyNs).
				if d := time.Since(t0) - time.Duration(s.ctl.copyNs-w0); d > 0 {
					r.rest.observe(mark, d, int(k))
				}
			}
		}
		got += n
		r.local += n
		r.head.Store(r.local)
		s.nudge()
		if s.ctl.Stopped.Load() {
			return ErrStopped
		}
		s.ctl.pumpAll()
	}
	return nil
}
