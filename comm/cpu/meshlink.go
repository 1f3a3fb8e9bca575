package cpu

import (
	"errors"
	"fmt"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu/kernel"
)

// opCtx is the op a mesh is executing.
type opCtx struct {
	fp  comm.Fingerprint
	dt  comm.DType
	red comm.ReduceOp
	tag int64
}

// stashed is a message that arrived before the op that wants it (a Send's
// payload while a collective runs, a tag not yet asked for, or a
// collective message seen by an any-source Recv).
type stashed struct {
	h    header
	data []byte
}

// mesh implements Mesh over one link per peer for the progress goroutine.
type mesh struct {
	rank, size int
	links      []link // nil at rank
	ctl        *ctl
	spin       bool       // some link is polled by spinning
	tcps       []*tcpLink // the TCP data links (see wait)
	stash      [][]stashed
	dirty      []bool // links sent to since the last Flush
	cur        opCtx
	anyNext    int // rotates the first peer an any-source Recv polls
	// grp is the group segment (shm_group.go) or nil; with it the mesh
	// also offers the slots of the one-step algorithms (mesh_flat.go).
	grp *shmGroup
	fh  header // the header of a slot being written or checked
	// fall is the last one-step op for which every rank's slot was
	// awaited (mesh_flat.go).
	fall uint64

	// sh and rh are the headers of the message being sent and received.
	// They live here, not on the stack, because links take them by pointer
	// through an interface, which would move a local to the heap on every
	// message (and, in recvColl, on every poll while waiting).
	sh, rh header

	// fatal returns the engine's recorded error (a notice from a peer, a
	// dead connection) if it concerns the running op, so that waits end
	// promptly; cause returns it whatever op it struck, to name the cause
	// of a broken read.
	fatal, cause func() error
	// closed returns the error recorded when peer told us it destroyed
	// the group (failure.go), or nil.
	closed func(peer int) error
	// late looks for the notice a peer whose connection broke may have
	// left in the store (failure.go), or returns nil.
	late func(peer int) error
	// mismatch records a mismatch (detail: what differs beyond the
	// fingerprints) and notifies every peer.
	mismatch func(peer int, got header, detail string) error
}

func newMesh(rank, size int, links []link, c *ctl) *mesh {
	m := &mesh{rank: rank, size: size, links: links, ctl: c,
		stash: make([][]stashed, size), dirty: make([]bool, size)}
	for _, l := range links {
		if l != nil && l.spins() {
			m.spin = true
		}
		if tl, ok := l.(*tcpLink); ok && tl.data {
			m.tcps = append(m.tcps, tl)
		}
	}
	m.fatal = func() error { return nil }
	m.cause = m.fatal
	m.closed = func(int) error { return nil }
	m.late = func(int) error { return nil }
	return m
}

func (m *mesh) Rank() int { return m.rank }
func (m *mesh) Size() int { return m.size }

// begin sets the op whose messages Send and Recv exchange.
func (m *mesh) begin(o opCtx) { m.cur = o }

func (m *mesh) transportErr(peer int, err error) error {
	if errors.Is(err, errStopped) {
		return errStopped
	}
	if m.ctl.aborting.Load() {
		// This rank is aborting and peers, told so, may already be gone:
		// the op fails with the abort once Abort has finished telling
		// them, not with their EOF.
		<-m.ctl.stop
		return errStopped
	}
	if f := m.cause(); f != nil {
		return f // the failure recorded first (a peer's notice) is the cause
	}
	if errors.Is(err, comm.ErrMismatch) || errors.Is(err, comm.ErrEngine) || errors.Is(err, comm.ErrRemoteAbort) {
		return err
	}
	if c := m.closed(peer); c != nil {
		return c // the peer destroyed the group: not an anonymous EOF
	}
	if l := m.late(peer); l != nil {
		return l // the peer aborted while a large message held the connection
	}
	var te *comm.TransportError
	if errors.As(err, &te) {
		return err
	}
	return &comm.TransportError{Rank: m.rank, Peer: peer, FP: m.cur.fp, Err: err}
}

func (m *mesh) Send(peer, step int, buf []byte) error {
	m.sh = header{Kind: kindColl, Sender: m.rank, FP: m.cur.fp, Step: uint32(step), Len: uint64(len(buf))}
	m.dirty[peer] = true
	if err := m.links[peer].send(&m.sh, buf); err != nil {
		return m.transportErr(peer, err)
	}
	return nil
}

func (m *mesh) Flush() error {
	for p, d := range m.dirty {
		if !d {
			continue
		}
		m.dirty[p] = false
		if err := m.links[p].flush(); err != nil {
			return m.transportErr(p, err)
		}
	}
	return nil
}

func (m *mesh) Recv(peer, step int, dst []byte) error {
	return m.recvColl(peer, step, len(dst), sink{dst: dst})
}

func (m *mesh) Reduce(dst, src []byte) error {
	return kernel.Reduce(dst, src, m.cur.dt, m.cur.red)
}

func (m *mesh) RecvReduce(peer, step int, dst []byte) error {
	return m.recvColl(peer, step, len(dst), sink{dst: dst, reduce: true, dt: m.cur.dt, red: m.cur.red})
}

// wait pauses until something may have arrived; it returns an error if the
// engine stopped or recorded a fatal error.
//
// A message on a TCP link is read by the link's reader goroutine, which
// runs once the Go scheduler has polled the network. The scheduler does
// not poll it while this goroutine spins (with GOMAXPROCS=1, as rankrunner
// gives two ranks on two cores, only sysmon would, every 10 ms), so both
// waits below peek at the TCP sockets and, when bytes are there, park until
// the reader pokes ctl.notify.
func (m *mesh) wait(b *backoff) error {
	if err := m.fatal(); err != nil {
		return err
	}
	if m.spin {
		if m.ctl.pumpAll() {
			b.reset()
			return nil
		}
		if m.tcpReadable() {
			return m.park(tcpParkMax)
		}
		return b.pause(m.ctl)
	}
	// TCP links only: before sleeping, peek at the sockets for a while, so
	// that a message microseconds away is picked up without this thread
	// sleeping (and, on a VM, its vCPU halting and waiting for an
	// interrupt).
	if b.n < tcpPeekIters {
		b.n++
		if m.tcpReadable() {
			b.n = tcpPeekIters
		} else {
			select {
			case <-m.ctl.notify:
			case <-m.ctl.stop:
				return errStopped
			default:
			}
			return nil
		}
	}
	return m.park(0)
}

// tcpReadable reports whether a TCP data link has unread bytes in the
// kernel that its reader goroutine is ready to take.
func (m *mesh) tcpReadable() bool {
	for _, l := range m.tcps {
		if l.readable() {
			return true
		}
	}
	return false
}

// park blocks until a reader goroutine pokes ctl.notify or the engine
// stops; with max > 0, at most max (shm links are polled, not poked).
func (m *mesh) park(max time.Duration) error {
	var timeout <-chan time.Time
	if max > 0 {
		t := time.NewTimer(max)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-m.ctl.notify:
	case <-timeout:
	case <-m.ctl.stop:
		return errStopped
	}
	return nil
}

// stashMsg reads the polled message h from peer into the stash.
func (m *mesh) stashMsg(peer int, h header) error {
	data := make([]byte, h.Len)
	if err := m.links[peer].read(&h, sink{dst: data}); err != nil {
		return m.transportErr(peer, err)
	}
	m.stash[peer] = append(m.stash[peer], stashed{h: h, data: data})
	return nil
}

// checkColl matches a collective message against the current op.
func (m *mesh) checkColl(peer, step, n int, h header) error {
	if h.FP != m.cur.fp {
		return m.mismatch(peer, h, "")
	}
	if h.Sender != peer {
		return &comm.EngineError{Engine: "cpu", Rank: m.rank, FP: m.cur.fp,
			Msg: fmt.Sprintf("protocol error: message on the link to rank %d claims sender %d", peer, h.Sender)}
	}
	if int(h.Step) != step || h.Len != uint64(n) {
		// Same op, but the two ranks disagree on what this message holds:
		// split sizes or V-variant counts that do not fit together.
		return m.mismatch(peer, h, fmt.Sprintf("rank %d sent %s of %d bytes, rank %d expected %s of %d bytes (the ranks' split sizes or counts do not fit together)",
			peer, stepName(int(h.Step)), h.Len, m.rank, stepName(step), n))
	}
	return nil
}

func (m *mesh) recvColl(peer, step, n int, s sink) error {
	for i, st := range m.stash[peer] {
		if st.h.Kind != kindColl {
			continue
		}
		m.stash[peer] = append(m.stash[peer][:i:i], m.stash[peer][i+1:]...)
		if err := m.checkColl(peer, step, n, st.h); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		return s.deliver(0, st.data)
	}
	l := m.links[peer]
	var b backoff
	for {
		var ok bool
		var err error
		m.rh, ok, err = l.poll()
		h := &m.rh
		if err != nil {
			return m.transportErr(peer, err)
		}
		if !ok {
			if m.grp != nil {
				// A peer that published a slot of a one-step op this
				// rank has not run launched something else: this wait
				// would never end (mesh_flat.go).
				if err := m.checkPeerSlots(); err != nil {
					b.reset()
					return err
				}
			}
			if err := m.wait(&b); err != nil {
				b.reset()
				return err
			}
			continue
		}
		b.reset()
		if h.Kind == kindP2P {
			if err := m.stashMsg(peer, *h); err != nil {
				return err
			}
			b.reset()
			continue
		}
		if err := m.checkColl(peer, step, n, *h); err != nil {
			return err
		}
		if err := l.read(h, s); err != nil {
			return m.transportErr(peer, err)
		}
		return nil
	}
}

// agreeStep0 is the step number of the first agreement round; algorithm
// steps stay far below it.
const agreeStep0 = 1 << 24

// stepName names an algorithm step for mismatch messages.
func stepName(step int) string {
	if step >= agreeStep0 {
		return fmt.Sprintf("agreement round %d", step-agreeStep0)
	}
	return fmt.Sprintf("step %d", step)
}
