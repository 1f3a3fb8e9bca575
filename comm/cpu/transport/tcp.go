package transport

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ranktree/ranktree/comm"
)

// TCP link tuning.
const (
	// tcpSmallMax: payloads up to this size are taken off the socket into
	// a buffer of their own as soon as they arrive (by whichever goroutine
	// reads the socket) and written inline by the caller; larger ones
	// stay in the kernel until the progress goroutine reads them into the
	// sink.
	tcpSmallMax = 64 << 10
	// tcpFreeMin is the smallest payload buffer a link allocates, so that
	// a recycled one (rxState.free) fits most small messages.
	tcpFreeMin = 4 << 10
	// tcpSegment is the segment size in which large payloads are handed to
	// a reducing sink, so that reduction overlaps the transfer.
	tcpSegment = 256 << 10
	// tcpInbox is how many parsed messages a link holds for the progress
	// goroutine before it stops taking bytes off the socket (the peer's
	// writes then wait on TCP flow control).
	tcpInbox = 64
	// tcpRecvBuf is the size of a link's receive buffer: one read takes
	// the headers and small payloads of every message the kernel holds,
	// up to this many bytes.
	tcpRecvBuf = 256 << 10
	// tcpDirectMin: a small payload of which at least this many bytes are
	// still to come is read straight into its own buffer, not through the
	// receive buffer (one copy fewer).
	tcpDirectMin = 4 << 10
	// tcpSockBuf is the kernel socket buffer size asked for data links.
	tcpSockBuf = 4 << 20
)

// TCPWait is how a rank waits for a message on its TCP data links
// (Mesh.wait): it polls them, which reads their sockets without blocking,
// for up to Spin, letting the Go scheduler run other goroutines between
// polls, and with Yield also other processes (sched_yield), then parks
// until a link's reader goroutine, woken by the network poller, pokes it.
//
// Yield is for a host whose ranks outnumber the CPUs they may run on (as
// the shm waits, transport/shm_group.go): the peer a rank waits for may
// then be queued on the waiting rank's very CPU, and polling without
// yielding would hold it. Parking instead costs every message a sleep and
// a wake-up through the kernel scheduler.
type TCPWait struct {
	Spin  time.Duration
	Yield bool
}

// DefaultTCPWait is a TCP link's wait policy until SetWait: poll for
// SpinFor, as the shm waits spin.
var DefaultTCPWait = TCPWait{Spin: SpinFor}

// poll reports whether a wait that began at since should poll again
// (having let others run), or park.
func (w TCPWait) poll(since time.Time) bool {
	if time.Since(since) >= w.Spin {
		return false
	}
	runtime.Gosched()
	if w.Yield {
		osYield()
	}
	return true
}

// SetWait sets how the waits of a mesh over this link pace themselves;
// call it before the link's mesh is made (NewMesh takes it from its TCP
// data links, which should agree).
func (l *TCPLink) SetWait(w TCPWait) { l.wait = w }

// TCPLink is a link over one TCP connection (TCP_NODELAY), authenticated at
// setup (see comm/cpu/rendezvous.go).
//
// Receiving: the bytes of the connection are taken off the socket by
// whichever of two goroutines holds the link's receive lock (rmu): the
// progress goroutine, whose poll reads the socket itself without blocking
// while it waits for a message (no goroutine hand-off on the latency path:
// with GOMAXPROCS=1, as rankrunner runs each rank, a hand-off costs a trip
// through the scheduler and its network poller), and a reader goroutine,
// which blocks on the socket while the progress goroutine does not poll
// (between ops, or parked in a long wait), so that notices, wake-ups and a
// dead peer are seen at any time and messages are taken off the socket
// eagerly. Both parse the same stream in order with the same code (pump).
// A large payload (over tcpSmallMax) is left in the kernel for the
// progress goroutine to read straight into its sink; meanwhile neither
// pumps.
//
// Sending: the caller writes a small message inline when nothing is
// queued; otherwise a writer goroutine drains the queue, so that a rank
// can send a large chunk while it receives one (as Gloo's tcp::Pair does
// with its event loop). With data false the link only carries control
// messages (notices) and watches the peer's liveness for an shm link.
type TCPLink struct {
	peer int
	conn net.Conn
	ctl  *Ctl
	data bool
	// rc reads the socket without blocking (nil if conn is not a
	// syscall.Conn: then only the reader goroutine reads it, blocking).
	rc syscall.RawConn

	// read side
	rmu    sync.Mutex
	rx     rxState       // guarded by rmu
	queued atomic.Int32  // rx.qn, for poll's check without the lock
	resume chan struct{} // cap 1: the reader may pump again (a big payload consumed, the queue drained)
	rerr   atomic.Pointer[error]
	dead   chan struct{} // closed when the reader stops
	// progress goroutine only:
	cur    inMsg // polled, not yet read, when hasCur
	hasCur bool
	seg    []byte           // scratch for segmented reads
	direct func(fd uintptr) // pumps under rc.Control (made once: no allocation per poll)
	wait   TCPWait

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
}

type inMsg struct {
	h    Header
	data []byte // payload, for small messages
	big  bool   // payload still on the connection
}

// rxState is a link's receive side: bytes taken off the socket but not
// yet parsed (buf[r:w]), the message whose payload is being assembled, and
// the parsed messages waiting for the progress goroutine. Guarded by
// TCPLink.rmu, except that while stalled the progress goroutine alone
// reads the big payload's bytes in buf.
type rxState struct {
	buf  []byte
	r, w int
	// asm: the payload of m is being assembled, got bytes of it so far.
	asm bool
	m   inMsg
	got int
	// q is a ring of qn parsed messages from qh.
	q      [tcpInbox]inMsg
	qh, qn int
	// stalled: a big message heads the queue or is being read; its
	// payload is next on the connection, so nothing may pump until the
	// progress goroutine has read it (TCPLink.read).
	stalled bool
	free    [][]byte // payload buffers read has finished with
	err     error    // the stream's terminal error, once seen
}

// pumpState says why pump returned.
type pumpState uint8

const (
	pumpMore    pumpState = iota // it took bytes off the socket: call again
	pumpEmpty                    // the socket had nothing (EAGAIN): wait for it to be readable
	pumpBlocked                  // it may not read on (stalled, or the queue full) until read makes room
	pumpFailed                   // rx.err is set
)

type tcpJob struct {
	hdr     [HeaderSize]byte
	payload []byte
	written chan struct{} // if not nil, closed once the writer has written it
}

// NewTCPLink wraps an authenticated connection to peer and starts its
// reader and writer goroutines; with data false it carries notices and
// liveness only. br, if not nil, is a reader the handshake read conn
// through: what it buffered is the start of the stream.
func NewTCPLink(peer int, conn net.Conn, br *bufio.Reader, c *Ctl, data bool) *TCPLink {
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
		if data {
			_ = tc.SetReadBuffer(tcpSockBuf)
			_ = tc.SetWriteBuffer(tcpSockBuf)
		}
	}
	l := &TCPLink{
		peer: peer, conn: conn, ctl: c, data: data,
		resume: make(chan struct{}, 1), dead: make(chan struct{}),
		wake: make(chan struct{}, 1), sent: make(chan struct{}, 1),
		wait: DefaultTCPWait,
	}
	bufSize := tcpRecvBuf
	if !data {
		bufSize = 2 * HeaderSize
	}
	l.rx.buf = make([]byte, bufSize)
	if br != nil {
		// What the handshake's reader took off the socket beyond the
		// handshake is the start of the stream.
		b, _ := br.Peek(br.Buffered())
		if len(b) > len(l.rx.buf) {
			l.rx.buf = make([]byte, len(b))
		}
		l.rx.w = copy(l.rx.buf, b)
	}
	if sc, ok := conn.(syscall.Conn); ok {
		l.rc, _ = sc.SyscallConn()
	}
	l.direct = func(fd uintptr) {
		for l.pump(int(fd)) == pumpMore {
		}
	}
	go l.readLoop()
	go l.writeLoop()
	return l
}

func (l *TCPLink) spins() bool { return false }

func (l *TCPLink) fail(err error) {
	if l.ctl.Stopped.Load() {
		err = ErrStopped
	}
	l.rerr.CompareAndSwap(nil, &err)
	l.ctl.Poke()
}

// readErr is the read side's terminal error, or nil while it runs.
func (l *TCPLink) readErr() error {
	if p := l.rerr.Load(); p != nil {
		return *p
	}
	return nil
}

// errAgain: a non-blocking read found nothing.
var errAgain = errors.New("no data")

// recv reads what the socket holds into p: without blocking on fd if fd
// >= 0 (errAgain if it holds nothing), else blocking on the connection.
// Called with rmu held; the blocking form releases it while it blocks.
func (l *TCPLink) recv(fd int, p []byte) (int, error) {
	if fd < 0 {
		l.rmu.Unlock()
		n, err := l.conn.Read(p)
		l.rmu.Lock()
		if n > 0 {
			return n, nil
		}
		if err == nil {
			err = io.ErrNoProgress
		}
		return 0, err
	}
	for {
		n, err := syscall.Read(fd, p)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			return 0, errAgain
		case err != nil:
			return 0, err
		case n == 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

// pump parses the bytes already taken off the socket, then reads the
// socket once (fd as for recv) and parses what came; it returns why it
// stopped. Parsed data messages join the queue; wake-ups, acks and
// notices are handled at once. Called with rmu held.
func (l *TCPLink) pump(fd int) pumpState {
	x := &l.rx
	if x.err != nil {
		return pumpFailed
	}
	if st := l.parse(); st != pumpMore {
		return st
	}
	// Read: straight into the payload being assembled when much of it is
	// still to come, else into the receive buffer.
	var p []byte
	direct := x.asm && len(x.m.data)-x.got >= tcpDirectMin
	if direct {
		p = x.m.data[x.got:]
	} else {
		if x.r == x.w {
			x.r, x.w = 0, 0
		} else if len(x.buf)-x.w < HeaderSize {
			x.w = copy(x.buf, x.buf[x.r:x.w])
			x.r = 0
		}
		p = x.buf[x.w:]
	}
	n, err := l.recv(fd, p)
	if err == errAgain {
		return pumpEmpty
	}
	if err != nil {
		x.err = fmt.Errorf("reading from rank %d: %w", l.peer, err)
		return pumpFailed
	}
	if direct {
		x.got += n
	} else {
		x.w += n
	}
	if st := l.parse(); st != pumpMore {
		return st
	}
	return pumpMore
}

// parse consumes whole messages from buf[r:w] (and the rest of the
// payload being assembled); it returns pumpMore when it needs more bytes.
func (l *TCPLink) parse() pumpState {
	x := &l.rx
	for {
		if x.stalled || x.qn == tcpInbox {
			return pumpBlocked
		}
		if x.asm {
			k := copy(x.m.data[x.got:], x.buf[x.r:x.w])
			x.r += k
			x.got += k
			if x.got < len(x.m.data) {
				return pumpMore
			}
			x.asm = false
			if st := l.arrived(x.m); st != pumpMore {
				return st
			}
			x.m = inMsg{}
			continue
		}
		if x.w-x.r < HeaderSize {
			return pumpMore
		}
		h, err := decodeHeader(x.buf[x.r : x.r+HeaderSize])
		if err != nil {
			x.err = fmt.Errorf("from rank %d: %w", l.peer, err)
			return pumpFailed
		}
		x.r += HeaderSize
		m := inMsg{h: h}
		switch {
		case h.Kind == kindWake || h.Kind == kindAck || h.Len == 0:
		case h.Kind == kindNotice || h.Len <= tcpSmallMax:
			m.data = x.buffer(int(h.Len))
			x.m, x.asm, x.got = m, true, 0
			continue
		default:
			// The payload stays in the kernel (and what of it is in buf)
			// until the progress goroutine reads it into its sink.
			m.big = true
		}
		if st := l.arrived(m); st != pumpMore {
			return st
		}
	}
}

// arrived handles one whole message (a big one: its header): control
// messages at once, data messages join the queue.
func (l *TCPLink) arrived(m inMsg) pumpState {
	x := &l.rx
	switch m.h.Kind {
	case kindWake:
		l.ctl.Poke()
		return pumpMore
	case kindAck:
		if l.ctl.OnAck != nil {
			l.ctl.OnAck(l.peer)
		}
		return pumpMore
	case kindNotice:
		if l.ctl.OnNotice != nil {
			l.ctl.OnNotice(l.peer, m.data, l.ack)
		}
		l.ctl.Poke()
		return pumpMore
	}
	if !l.data {
		x.err = fmt.Errorf("rank %d sent data on a control-only connection", l.peer)
		return pumpFailed
	}
	x.q[(x.qh+x.qn)%tcpInbox] = m
	x.qn++
	l.queued.Store(int32(x.qn))
	if m.big {
		x.stalled = true
	}
	return pumpMore
}

// buffer returns a payload buffer of n bytes, recycled if one fits.
func (x *rxState) buffer(n int) []byte {
	if k := len(x.free); k > 0 && cap(x.free[k-1]) >= n {
		d := x.free[k-1]
		x.free = x.free[:k-1]
		return d[:n]
	}
	return make([]byte, n, max(n, tcpFreeMin))
}

func (l *TCPLink) readLoop() {
	defer close(l.dead)
	var st pumpState
	pumped := func(fd uintptr) bool {
		l.rmu.Lock()
		for {
			before := l.rx.qn
			st = l.pump(int(fd))
			if l.rx.qn != before {
				l.ctl.Poke()
			}
			if st != pumpMore {
				break
			}
		}
		l.rmu.Unlock()
		return st != pumpEmpty
	}
	for {
		if l.rc != nil {
			if err := l.rc.Read(pumped); err != nil {
				l.fail(fmt.Errorf("reading from rank %d: %w", l.peer, err))
				return
			}
		} else {
			pumped(^uintptr(0)) // fd -1: blocking reads
		}
		switch st {
		case pumpFailed:
			l.rmu.Lock()
			err := l.rx.err
			l.rmu.Unlock()
			l.fail(err)
			return
		case pumpBlocked:
			select {
			case <-l.resume:
			case <-l.ctl.Stop:
				return
			}
		}
	}
}

// poll returns the next message's header: a parsed one if the link holds
// one, else whatever a non-blocking read of the socket brings now.
func (l *TCPLink) poll() (Header, bool, error) {
	if l.hasCur {
		return l.cur.h, true, nil
	}
	if l.queued.Load() == 0 && l.rc != nil && l.data && l.rmu.TryLock() {
		// Read the socket here rather than wait for the reader goroutine
		// (if it holds the lock, it is parsing and will poke).
		var err error
		if l.rx.err == nil {
			if err = l.rc.Control(l.direct); err != nil {
				l.rx.err = fmt.Errorf("reading from rank %d: %w", l.peer, err)
			}
		}
		err = l.rx.err
		l.rmu.Unlock()
		if err != nil {
			l.fail(err)
		}
	}
	if l.queued.Load() > 0 {
		return l.take(), true, nil
	}
	if err := l.readErr(); err != nil {
		// The reader goroutine queues what came before the connection's
		// end and only then records the end: a message queued since the
		// check above is delivered before the error (data before
		// departure, as ShmLink.poll).
		if l.queued.Load() > 0 {
			return l.take(), true, nil
		}
		return Header{}, false, err
	}
	return Header{}, false, nil
}

// take dequeues the next message the reader goroutine queued (there is
// one) as the current one and returns its header.
func (l *TCPLink) take() Header {
	l.rmu.Lock()
	x := &l.rx
	full := x.qn == tcpInbox
	l.cur = x.q[x.qh]
	x.q[x.qh] = inMsg{}
	x.qh = (x.qh + 1) % tcpInbox
	x.qn--
	l.queued.Store(int32(x.qn))
	l.rmu.Unlock()
	l.hasCur = true
	if full {
		l.kickReader()
	}
	return l.cur.h
}

// kickReader tells a reader goroutine waiting for room that it may pump.
func (l *TCPLink) kickReader() {
	select {
	case l.resume <- struct{}{}:
	default:
	}
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
		l.rmu.Lock()
		if len(l.rx.free) < tcpInbox {
			l.rx.free = append(l.rx.free, m.data) // pump may reuse it
		}
		l.rmu.Unlock()
		m.data = nil
		return err
	}
	err := l.readBig(int(m.h.Len), s)
	if err != nil {
		if l.ctl.Stopped.Load() {
			return ErrStopped
		}
		return fmt.Errorf("reading from rank %d: %w", l.peer, err)
	}
	l.rmu.Lock()
	l.rx.stalled = false
	l.rmu.Unlock()
	l.kickReader()
	return nil
}

// readBig reads a big payload of n bytes into s: first what of it the
// receive buffer holds, then from the connection. The link is stalled, so
// nothing else reads either.
func (l *TCPLink) readBig(n int, s sink) error {
	x := &l.rx
	l.rmu.Lock()
	k := min(n, x.w-x.r)
	pre := x.buf[x.r : x.r+k]
	x.r += k
	l.rmu.Unlock()
	if s.copies() {
		copy(s.dst, pre)
		_, err := io.ReadFull(l.conn, s.dst[k:n])
		return err
	}
	if l.seg == nil {
		l.seg = make([]byte, tcpSegment)
	}
	for off := 0; off < n; {
		k := min(n-off, len(l.seg))
		c := copy(l.seg[:k], pre)
		pre = pre[c:]
		if _, err := io.ReadFull(l.conn, l.seg[c:k]); err != nil {
			return err
		}
		if err := s.deliver(off, l.seg[:k]); err != nil {
			return err
		}
		off += k
	}
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
