package transport

import (
	"errors"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu/kernel"
)

// Link is the connection to one peer as the progress goroutine sees it: the
// transport interface the mesh (and through it every algorithm) is written
// against, in the manner of Gloo's transport::Pair. tcp.go and shm.go
// implement it; each may run helper goroutines, the algorithms never do.
//
// Only the progress goroutine calls poll, read, send and flush.
type Link interface {
	// poll returns the header of the next incoming message without blocking;
	// ok is false when none has arrived. Repeated polls return the same
	// message until read consumes it. A dead connection gives an error.
	poll() (h Header, ok bool, err error)
	// read consumes the payload (h.Len bytes) of the message poll returned,
	// delivering it to s.
	read(h *Header, s sink) error
	// send queues one message. payload must stay unchanged until flush.
	send(h *Header, payload []byte) error
	// flush blocks until every queued message has left its payload buffer.
	flush() error
	// shared reports whether polling this link needs spinning (shm) rather
	// than waiting on the control notify channel (tcp).
	spins() bool
	// close releases the link; blocked calls return errStopped.
	Close()
}

// sink is where read puts a payload: copied into dst (len(dst) == h.Len),
// reduced into dst with (dt, red) when reduce is set, or handed to fn in
// consecutive whole-element segments (off is the byte offset of seg in the
// payload). The reduce form exists so that RecvReduce needs no closure,
// which would be allocated per message.
type sink struct {
	dst    []byte
	fn     func(off int, seg []byte) error
	reduce bool
	dt     comm.DType
	red    comm.ReduceOp
}

// copies reports whether the sink just copies into dst (so a link may read
// straight into it).
func (s sink) copies() bool { return s.fn == nil && !s.reduce }

// deliver hands seg (at payload offset off) to the sink.
func (s sink) deliver(off int, seg []byte) error {
	if s.fn != nil {
		return s.fn(off, seg)
	}
	if s.reduce {
		return kernel.Reduce(s.dst[off:off+len(seg)], seg, s.dt, s.red)
	}
	copy(s.dst[off:], seg)
	return nil
}

// errStopped is returned by links once the engine was aborted or closed; the
// engine replaces it with the AbortedError or ErrClosed it recorded.
var ErrStopped = errors.New("cpu: engine stopped")

// Ctl is the state every link of one engine shares: the stop signal (Abort
// or Close), the wake-up channel that tcp readers poke when a message
// arrives, and the handler for mismatch notices from peers.
type Ctl struct {
	Stop    chan struct{} // closed by Abort/Close
	Stopped atomic.Bool   // set with Stop; polled by spinning waits
	// Aborting is set when Abort begins, before it tells the peers and
	// stops the engine: a connection a peer closes meanwhile is a
	// consequence of this abort, not its cause (mesh.transportErr).
	Aborting atomic.Bool
	notify   chan struct{} // cap 1: something arrived on some tcp link
	// OnNotice is called from tcp reader goroutines when peer sends a
	// notice (the engine's failure.go) with its payload; OnAck when peer
	// acknowledges one of ours. Either may be nil.
	OnNotice func(peer int, payload []byte, ack func())
	OnAck    func(peer int) // see OnNotice
	// Fatal is the engine's recorded fatal error (a peer's notice), checked
	// by waits that could otherwise outlive a broken op.
	Fatal func() error
	// YieldOS is set when some shm peer is another process: waits then
	// also yield the OS thread, so that the peer can run on an
	// oversubscribed machine.
	YieldOS bool
	// Pumps are the shm links with a send queue; pumpAll drives them
	// (progress goroutine only).
	Pumps []*ShmLink
	// Grp is the group segment, or nil: with it, waits follow its wait
	// policy (spin a bounded time, then sleep on this rank's bell) instead
	// of the backoff's yields and timers.
	// Set once at connect, read by tcp reader goroutines (poke).
	Grp atomic.Pointer[ShmGroup]
	// copyNs adds up the time of the shm copies the copiers chose a way
	// for (progress goroutine only): a reader timing its own copy out of
	// a ring takes out what a forward's sends copied meanwhile (a
	// forward's sink lets its link copy each piece it reduced,
	// mesh_forward.go; shm_copy.go).
	copyNs int64
}

// pumpAll moves queued shm sends into their rings; it reports progress.
func (c *Ctl) pumpAll() bool {
	p := false
	for _, s := range c.Pumps {
		if len(s.q) > 0 && s.pump() {
			p = true
		}
	}
	return p
}

// NewCtl returns the shared state for the links of one engine (or one
// rank of an InmemMesh): not stopped, Fatal reporting nothing.
func NewCtl() *Ctl {
	return &Ctl{Stop: make(chan struct{}), notify: make(chan struct{}, 1), Fatal: func() error { return nil }}
}

// Halt stops c: every wait of its links and meshes returns ErrStopped
// within one pause (Stopped, Stop closed, a sleeping rank woken). It
// reports whether this call stopped it. Safe from any goroutine.
func (c *Ctl) Halt() bool {
	if c.Stopped.Swap(true) {
		return false
	}
	close(c.Stop)
	c.Poke() // rings this rank's bell if it sleeps on it
	return true
}

// Poke wakes the progress goroutine if it waits on notify.
func (c *Ctl) Poke() {
	select {
	case c.notify <- struct{}{}:
	default:
	}
	if g := c.Grp.Load(); g != nil {
		g.wakeSelf()
	}
}

// backoff paces a polling loop: a short busy spin (the latency path for
// shm), then yielding the processor, then sleeping with growing pauses up
// to 1 ms so that a long wait does not burn a core. Abort is noticed within
// one pause.
type backoff struct {
	n     int
	sleep time.Duration
	armed bool // asleep flags raised, next pause blocks
	pc    pace // with a group segment (ctl.grp)
}

const (
	spinIters  = 64
	yieldIters = 4000
	maxSleep   = time.Millisecond
)

// pause waits a little; it returns errStopped if c is stopped.
func (b *backoff) pause(c *Ctl) error {
	if c.Stopped.Load() {
		return ErrStopped
	}
	if g := c.Grp.Load(); g != nil {
		return g.pause(&b.pc, c)
	}
	b.n++
	switch {
	case b.n < spinIters:
		// busy spin: re-check immediately
	case b.n < spinIters+yieldIters:
		// Let other goroutines of this process run, then other processes
		// (the peer rank, on an oversubscribed machine): spinning alone
		// would hold the core the peer needs to make progress.
		runtime.Gosched()
		if c.YieldOS {
			osYield()
		}
	default:
		// Sleep in two calls: first raise the asleep flags and return, so
		// that the caller polls once more (a peer that moved a ring
		// counter before seeing the flag is not missed); then block until
		// a peer wakes us (ctl.notify), a timer fires or the engine stops.
		if !b.armed {
			c.setAsleep(1)
			b.armed = true
			return nil
		}
		if b.sleep == 0 {
			b.sleep = 20 * time.Microsecond
		} else if b.sleep < maxSleep {
			b.sleep *= 2
		}
		t := time.NewTimer(b.sleep)
		select {
		case <-t.C:
		case <-c.notify:
			t.Stop()
		case <-c.Stop:
			t.Stop()
			return ErrStopped
		}
		c.setAsleep(0)
		b.armed = false
	}
	return nil
}

// setAsleep raises or clears this rank's asleep flag on every shm link.
func (c *Ctl) setAsleep(v uint32) {
	for _, s := range c.Pumps {
		s.mySleep.Store(v)
	}
}

// osYield gives up the processor to other threads and processes
// (sched_yield(2)).
func osYield() { syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }

// reset restarts the spin phase after progress was made.
func (b *backoff) reset() {
	b.n, b.sleep, b.armed = 0, 0, false
	b.pc.settle()
}

// NoticeLink is a link that can carry notices (every link but the nil one
// at this rank's own index).
type NoticeLink interface {
	// notice queues a kindNotice with payload; it returns a channel
	// closed once the notice is on the wire, or nil if the connection is
	// down.
	Notice(payload []byte) <-chan struct{}
	// ack queues a kindAck.
	ack()
	// up reports whether the connection to the peer is alive.
	Up() bool
}
