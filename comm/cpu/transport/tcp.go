package transport

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/ranktree/ranktree/comm"
)

// TCP link tuning.
const (
	// tcpSmallMax: payloads up to this size are read eagerly by the reader
	// goroutine (no hand-off round trip) and written inline by the caller.
	tcpSmallMax = 64 << 10
	// tcpFreeMin is the smallest payload buffer the reader allocates, so
	// that a recycled one (tcpLink.free) fits most small messages.
	tcpFreeMin = 4 << 10
	// tcpSegment is the segment size in which large payloads are handed to
	// a reducing sink, so that reduction overlaps the transfer.
	tcpSegment = 256 << 10
	tcpInbox   = 64
	// tcpSockBuf is the kernel socket buffer size asked for data links.
	tcpSockBuf = 4 << 20
	// tcpPeekIters is how many times a wait peeks at the sockets (about
	// a microsecond each) before it sleeps (mesh.wait).
	tcpPeekIters = 50
	// tcpParkMax bounds a park for a TCP reader in a mesh that also has
	// shm links (which nothing pokes): should the reader not poke, the
	// shm rings are polled again after this.
	tcpParkMax = 200 * time.Microsecond
)

// TCPLink is a link over one TCP connection (TCP_NODELAY), authenticated at
// setup (see comm/cpu/rendezvous.go). A reader goroutine parses headers and hands
// messages to the progress goroutine; a writer goroutine drains queued
// sends, so that a rank can send a large chunk while it receives one (as
// Gloo's tcp::Pair does with its event loop). With data false the link
// only carries control messages (notices) and watches the peer's liveness
// for an shm link.
type TCPLink struct {
	peer int
	conn net.Conn
	ctl  *Ctl
	data bool

	// read side: reader goroutine → progress goroutine
	br     *bufio.Reader
	in     chan inMsg
	free   chan []byte   // small payload buffers read has finished with, for the reader
	resume chan struct{} // progress goroutine → reader: big payload consumed
	cur    inMsg         // polled, not yet read, when hasCur (progress goroutine only)
	hasCur bool
	rerr   atomic.Pointer[error]
	dead   chan struct{} // closed when the reader stops
	seg    []byte        // scratch for segmented reads (progress goroutine only)

	// write side
	mu      sync.Mutex
	q       []*tcpJob
	wbuf    []byte           // scratch of write for small messages (whoever holds busy)
	whdr    [HeaderSize]byte // scratch of write for a large message's header
	busy    bool
	wake    chan struct{} // cap 1
	sent    chan struct{} // cap 1: a queued job finished
	pending atomic.Int64
	werr    atomic.Pointer[error]

	closeOnce sync.Once

	rc      syscall.RawConn // for readable; nil if not a TCP connection
	peek    *peeker         // over rc, made on first use (progress goroutine only)
	stalled atomic.Bool     // the reader waits for the progress goroutine to take a big payload
}

type inMsg struct {
	h    Header
	data []byte // payload, for small messages
	big  bool   // payload still on the connection
}

type tcpJob struct {
	hdr     [HeaderSize]byte
	payload []byte
	written chan struct{} // if not nil, closed once the writer has written it
}

// NewTCPLink wraps an authenticated connection to peer (br reads it,
// holding what the handshake buffered) and starts its reader and writer
// goroutines; with data false it carries notices and liveness only.
func NewTCPLink(peer int, conn net.Conn, br *bufio.Reader, c *Ctl, data bool) *TCPLink {
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
		if data {
			_ = tc.SetReadBuffer(tcpSockBuf)
			_ = tc.SetWriteBuffer(tcpSockBuf)
		}
	}
	l := &TCPLink{
		peer: peer, conn: conn, ctl: c, data: data, br: br,
		in: make(chan inMsg, tcpInbox), free: make(chan []byte, tcpInbox), resume: make(chan struct{}, 1), dead: make(chan struct{}),
		wake: make(chan struct{}, 1), sent: make(chan struct{}, 1),
	}
	if tc, ok := conn.(*net.TCPConn); ok && data {
		l.rc, _ = tc.SyscallConn()
	}
	go l.readLoop()
	go l.writeLoop()
	return l
}

// readable reports whether the kernel holds unread bytes for this
// connection, without blocking or consuming them (recv with MSG_PEEK and
// MSG_DONTWAIT). RawConn.Control keeps the descriptor open during the call
// and, unlike RawConn.Read, does not wait for the reader goroutine, which
// sits in Read on the same connection.
func (l *TCPLink) readable() bool {
	if l.rc == nil || l.stalled.Load() {
		return false
	}
	if l.peek == nil {
		l.peek = newPeeker(l.rc)
	}
	return l.peek.readable()
}

// peeker asks a socket whether it has unread bytes (recv with MSG_PEEK,
// MSG_DONTWAIT). It keeps its RawConn.Control callback, made once, so that
// the progress goroutine's waits, which ask many times per op, allocate
// nothing. One goroutine at a time.
type peeker struct {
	rc  syscall.RawConn
	fn  func(fd uintptr)
	got bool
	b   [1]byte
}

func newPeeker(rc syscall.RawConn) *peeker {
	p := &peeker{rc: rc}
	p.fn = func(fd uintptr) {
		n, _, errno := syscall.Syscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&p.b[0])), 1,
			syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		p.got = errno == 0 && n > 0
	}
	return p
}

func (p *peeker) readable() bool {
	p.got = false
	_ = p.rc.Control(p.fn)
	return p.got
}

func peekReadable(rc syscall.RawConn) bool { return newPeeker(rc).readable() }

func (l *TCPLink) spins() bool { return false }

func (l *TCPLink) fail(err error) {
	if l.ctl.Stopped.Load() {
		err = ErrStopped
	}
	l.rerr.CompareAndSwap(nil, &err)
	l.ctl.Poke()
}

// readErr is the reader's terminal error, or nil while it runs.
func (l *TCPLink) readErr() error {
	if p := l.rerr.Load(); p != nil {
		return *p
	}
	return nil
}

func (l *TCPLink) readLoop() {
	defer close(l.dead)
	var hb [HeaderSize]byte
	for {
		if _, err := io.ReadFull(l.br, hb[:]); err != nil {
			l.fail(fmt.Errorf("reading from rank %d: %w", l.peer, err))
			return
		}
		h, err := decodeHeader(hb[:])
		if err != nil {
			l.fail(fmt.Errorf("from rank %d: %w", l.peer, err))
			return
		}
		if h.Kind == kindWake {
			l.ctl.Poke()
			continue
		}
		if h.Kind == kindAck {
			if l.ctl.OnAck != nil {
				l.ctl.OnAck(l.peer)
			}
			continue
		}
		if h.Kind == kindNotice {
			payload := make([]byte, h.Len)
			if _, err := io.ReadFull(l.br, payload); err != nil {
				l.fail(fmt.Errorf("reading from rank %d: %w", l.peer, err))
				return
			}
			if l.ctl.OnNotice != nil {
				l.ctl.OnNotice(l.peer, payload, l.ack)
			}
			l.ctl.Poke()
			continue
		}
		if !l.data {
			l.fail(fmt.Errorf("rank %d sent data on a control-only connection", l.peer))
			return
		}
		m := inMsg{h: h}
		if h.Len <= tcpSmallMax {
			// Reuse a payload buffer the progress goroutine has finished
			// with (read gives them back), so that small messages do not
			// allocate.
			var d []byte
			select {
			case d = <-l.free:
			default:
			}
			if uint64(cap(d)) < h.Len {
				d = make([]byte, h.Len, max(h.Len, tcpFreeMin))
			}
			m.data = d[:h.Len]
			if _, err := io.ReadFull(l.br, m.data); err != nil {
				l.fail(fmt.Errorf("reading from rank %d: %w", l.peer, err))
				return
			}
		} else {
			// The payload stays in the kernel until the progress
			// goroutine reads it: readable must not count it.
			m.big = true
			l.stalled.Store(true)
		}
		select {
		case l.in <- m:
		case <-l.ctl.Stop:
			return
		}
		l.ctl.Poke()
		if m.big {
			select {
			case <-l.resume:
			case <-l.ctl.Stop:
				return
			}
			l.stalled.Store(false)
		}
	}
}

func (l *TCPLink) poll() (Header, bool, error) {
	if l.hasCur {
		return l.cur.h, true, nil
	}
	select {
	case l.cur = <-l.in:
		l.hasCur = true
		return l.cur.h, true, nil
	default:
	}
	if err := l.readErr(); err != nil {
		return Header{}, false, err
	}
	return Header{}, false, nil
}

func (l *TCPLink) read(h *Header, s sink) error {
	m := &l.cur
	if !l.hasCur {
		return fmt.Errorf("cpu: internal error: read without poll on link to rank %d", l.peer)
	}
	l.hasCur = false // m stays valid until the next poll, which follows this read
	if !m.big {
		if len(m.data) == 0 {
			return nil
		}
		err := s.deliver(0, m.data)
		select {
		case l.free <- m.data: // the reader may reuse it
		default:
		}
		m.data = nil
		return err
	}
	n := int(m.h.Len)
	var err error
	if s.copies() {
		_, err = io.ReadFull(l.br, s.dst[:n])
	} else {
		if l.seg == nil {
			l.seg = make([]byte, tcpSegment)
		}
		for off := 0; off < n && err == nil; {
			k := min(n-off, len(l.seg))
			if _, err = io.ReadFull(l.br, l.seg[:k]); err == nil {
				err = s.deliver(off, l.seg[:k])
				off += k
			}
		}
	}
	if err != nil {
		if l.ctl.Stopped.Load() {
			return ErrStopped
		}
		return fmt.Errorf("reading from rank %d: %w", l.peer, err)
	}
	l.resume <- struct{}{}
	return nil
}

func (l *TCPLink) send(h *Header, payload []byte) error {
	if l.ctl.Stopped.Load() {
		return ErrStopped
	}
	if p := l.werr.Load(); p != nil {
		return *p
	}
	l.mu.Lock()
	if !l.busy && len(l.q) == 0 && len(payload) <= tcpSmallMax {
		l.busy = true
		l.mu.Unlock()
		var j tcpJob // written now: stays on the stack
		j.payload = payload
		h.encode(j.hdr[:])
		err := l.write(&j)
		l.mu.Lock()
		l.busy = false
		more := len(l.q) > 0
		l.mu.Unlock()
		if more {
			l.kick()
		}
		return err
	}
	j := &tcpJob{payload: payload}
	h.encode(j.hdr[:])
	l.q = append(l.q, j)
	l.pending.Add(1)
	l.mu.Unlock()
	l.kick()
	return nil
}

func (l *TCPLink) kick() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *TCPLink) write(j *tcpJob) error {
	var err error
	if len(j.payload) <= tcpSmallMax {
		// One write from the link's scratch buffer (the writer holds
		// busy, so it is alone): no allocation per small message.
		l.wbuf = append(append(l.wbuf[:0], j.hdr[:]...), j.payload...)
		_, err = l.conn.Write(l.wbuf)
	} else {
		l.whdr = j.hdr
		bufs := net.Buffers{l.whdr[:], j.payload}
		_, err = bufs.WriteTo(l.conn)
	}
	if err != nil {
		if l.ctl.Stopped.Load() {
			return ErrStopped
		}
		werr := fmt.Errorf("writing to rank %d: %w", l.peer, err)
		l.werr.CompareAndSwap(nil, &werr)
		return werr
	}
	return nil
}

func (l *TCPLink) writeLoop() {
	for {
		select {
		case <-l.wake:
		case <-l.ctl.Stop:
			return
		}
		for {
			l.mu.Lock()
			if l.busy || len(l.q) == 0 {
				l.mu.Unlock()
				break
			}
			j := l.q[0]
			l.q[0] = nil
			l.q = l.q[1:]
			l.busy = true
			l.mu.Unlock()
			if l.werr.Load() == nil {
				_ = l.write(j)
			}
			if j.written != nil {
				close(j.written)
			}
			l.mu.Lock()
			l.busy = false
			l.mu.Unlock()
			l.pending.Add(-1)
			select {
			case l.sent <- struct{}{}:
			default:
			}
		}
	}
}

func (l *TCPLink) flush() error {
	for l.pending.Load() > 0 {
		select {
		case <-l.sent:
		case <-l.ctl.Stop:
			return ErrStopped
		}
	}
	if p := l.werr.Load(); p != nil {
		return *p
	}
	return nil
}

// Notice queues a kindNotice carrying payload (comm/cpu/failure.go) for the
// writer goroutine, so that the caller never blocks on the socket; it
// returns a channel closed once the notice is written, or nil if the
// connection is down.
func (l *TCPLink) Notice(payload []byte) <-chan struct{} {
	return l.enqueue(&Header{Kind: kindNotice, FP: comm.Fingerprint{Op: comm.OpBarrier}, Len: uint64(len(payload))}, payload)
}

// ack queues a kindAck (the reader goroutine acknowledges a notice).
func (l *TCPLink) ack() {
	l.enqueue(&Header{Kind: kindAck, FP: comm.Fingerprint{Op: comm.OpBarrier}}, nil)
}

// Up reports whether neither direction of the connection has failed.
func (l *TCPLink) Up() bool {
	return l.readErr() == nil && l.werr.Load() == nil && !l.ctl.Stopped.Load()
}

// enqueue hands one message to the writer goroutine and returns a channel
// closed once it is written; nil if the connection is down or the engine
// stopped.
func (l *TCPLink) enqueue(h *Header, payload []byte) <-chan struct{} {
	if !l.Up() {
		return nil
	}
	j := &tcpJob{payload: payload, written: make(chan struct{})}
	h.encode(j.hdr[:])
	l.mu.Lock()
	l.q = append(l.q, j)
	l.pending.Add(1)
	l.mu.Unlock()
	l.kick()
	return j.written
}

// wakePeer asks the peer's progress goroutine, asleep on its shm rings, to
// re-check them (a header-only kindWake message).
func (l *TCPLink) wakePeer() {
	h := Header{Kind: kindWake, FP: comm.Fingerprint{Op: comm.OpBarrier}}
	_ = l.send(&h, nil)
}

// Close closes the connection; blocked calls return ErrStopped or a read
// error. Idempotent.
func (l *TCPLink) Close() {
	l.closeOnce.Do(func() { _ = l.conn.Close() })
}
