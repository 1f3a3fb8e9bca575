package transport

import (
	"errors"
	"fmt"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu/kernel"
)

// OpCtx is the op a mesh is executing.
type OpCtx struct {
	FP    comm.Fingerprint // carried by every message, checked on arrival
	DType comm.DType       // element type Reduce and RecvReduce combine
	Red   comm.ReduceOp    // the reduction (already ForDType)
	Tag   int64            // a Send's or Recv's tag (point-to-point ops)
}

// stashed is a message that arrived before the op that wants it (a Send's
// payload while a collective runs, a tag not yet asked for, or a
// collective message seen by an any-source Recv).
type stashed struct {
	h    Header
	data []byte
}

// Mesh implements Mesh over one link per peer for the progress goroutine.
type Mesh struct {
	rank, size int
	links      []Link // nil at rank
	ctl        *Ctl
	Spin       bool // some link is polled by spinning
	// tcpWait is how a wait on TCP data links polls before it parks
	// (TCPLink.SetWait), and tcpSince when the current wait began.
	tcpWait  TCPWait
	tcpSince time.Time
	stash    [][]stashed
	dirty    []bool // links sent to since the last Flush
	Cur      OpCtx  // the op being executed (Begin)
	anyNext  int    // rotates the first peer an any-source Recv polls
	// Grp is the group segment (shm_group.go) or nil; with it the mesh
	// also offers the slots of the one-step algorithms (mesh_flat.go).
	Grp *ShmGroup
	fh  Header // the header of a slot being written or checked
	fph uint64 // fpHash of Cur.FP, set by Publish for the op's boxes
	// fall is the last one-step op for which every rank's slot was
	// awaited (mesh_flat.go).
	fall uint64
	// early is the one-step op number PublishEarly published ahead of
	// the op's run, and earlyData the payload it published (its start and
	// length), until the op's own Publish takes it; 0 when none.
	early     uint64
	earlyData []byte

	// sh and rh are the headers of the message being sent and received.
	// They live here, not on the stack, because links take them by pointer
	// through an interface, which would move a local to the heap on every
	// message (and, in recvColl, on every poll while waiting).
	sh, rh Header
	// fw is the forward of the RecvReduceSend or RecvSend in progress,
	// so is the sink of the RecvStreaming in progress (mesh_forward.go);
	// fwFn and soFn are their deliver methods, bound once.
	fw         forward
	so         streamOut
	fwFn, soFn func(off int, seg []byte) error

	// Fatal returns the engine's recorded error (a notice from a peer, a
	// dead connection) if it concerns the running op, so that waits end
	// promptly; Cause returns it whatever op it struck, to name the cause
	// of a broken read.
	Fatal, Cause func() error
	// Closed returns the error recorded when peer told us it destroyed
	// the group (comm/cpu/failure.go), or nil.
	Closed func(peer int) error
	// Late looks for the notice a peer whose connection broke may have
	// left in the store (comm/cpu/failure.go), or returns nil.
	Late func(peer int) error
	// Mismatch records a mismatch (detail: what differs beyond the
	// fingerprints) and notifies every peer.
	Mismatch func(peer int, got Header, detail string) error
}

// NewMesh returns rank's mesh of a group of size over links (one per
// peer, nil at rank), driven by c. Its hooks (Fatal, Cause, Closed, Late,
// Mismatch) start as a standalone mesh's: no recorded failure, and a
// mismatch returned as a *comm.MismatchError without telling anyone; an
// engine replaces them before the first op.
func NewMesh(rank, size int, links []Link, c *Ctl) *Mesh {
	m := &Mesh{rank: rank, size: size, links: links, ctl: c,
		stash: make([][]stashed, size), dirty: make([]bool, size)}
	for _, l := range links {
		if l != nil && l.spins() {
			m.Spin = true
		}
		if tl, ok := l.(*TCPLink); ok && tl.data {
			m.tcpWait = tl.wait
		}
	}
	m.Fatal = func() error { return nil }
	m.Cause = m.Fatal
	m.Closed = func(int) error { return nil }
	m.Late = func(int) error { return nil }
	m.Mismatch = func(peer int, got Header, detail string) error {
		return &comm.MismatchError{LocalRank: m.rank, RemoteRank: peer, Local: m.Cur.FP, Remote: got.FP, Detail: detail}
	}
	return m
}

// Rank is this member's group rank.
func (m *Mesh) Rank() int { return m.rank }

// Size is the group size.
func (m *Mesh) Size() int { return m.size }

// Begin sets the op whose messages Send and Recv exchange (and whose
// waits the group segment's forecast keys, shm_forecast.go).
func (m *Mesh) Begin(o OpCtx) {
	if m.early != 0 && o.FP != m.Cur.FP {
		// The op published early never ran (its engine failed it before
		// it started): its slot stays counted, and the group is broken.
		m.early, m.earlyData = 0, nil
	}
	m.Cur = o
	if m.Grp != nil {
		m.Grp.beginOp(&o.FP)
	}
}

func (m *Mesh) transportErr(peer int, err error) error {
	if errors.Is(err, ErrStopped) {
		return ErrStopped
	}
	if m.ctl.Aborting.Load() {
		// This rank is aborting and peers, told so, may already be gone:
		// the op fails with the abort once Abort has finished telling
		// them, not with their EOF.
		<-m.ctl.Stop
		return ErrStopped
	}
	if f := m.Cause(); f != nil {
		return f // the failure recorded first (a peer's notice) is the cause
	}
	if errors.Is(err, comm.ErrMismatch) || errors.Is(err, comm.ErrEngine) || errors.Is(err, comm.ErrRemoteAbort) {
		return err
	}
	if c := m.Closed(peer); c != nil {
		return c // the peer destroyed the group: not an anonymous EOF
	}
	if l := m.Late(peer); l != nil {
		return l // the peer aborted while a large message held the connection
	}
	var te *comm.TransportError
	if errors.As(err, &te) {
		return err
	}
	return &comm.TransportError{Rank: m.rank, Peer: peer, FP: m.Cur.FP, Err: err}
}

// Send queues buf for peer as message step of the current op; buf must
// not change until Flush returns.
func (m *Mesh) Send(peer, step int, buf []byte) error {
	m.sh = Header{Kind: kindColl, Sender: m.rank, FP: m.Cur.FP, Step: uint32(step), Len: uint64(len(buf))}
	m.dirty[peer] = true
	if err := m.links[peer].send(&m.sh, buf); err != nil {
		return m.transportErr(peer, err)
	}
	return nil
}

// Flush blocks until every queued send has left its buffer.
func (m *Mesh) Flush() error {
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

// Recv blocks until message step of the current op arrives from peer and
// copies it into dst; a message of another op or length is a mismatch.
func (m *Mesh) Recv(peer, step int, dst []byte) error {
	return m.recvColl(peer, step, len(dst), sink{dst: dst})
}

// Reduce combines src into dst with the current op's reduction.
func (m *Mesh) Reduce(dst, src []byte) error {
	return kernel.Reduce(dst, src, m.Cur.DType, m.Cur.Red)
}

// RecvReduce is Recv that reduces the message into dst as it streams in.
func (m *Mesh) RecvReduce(peer, step int, dst []byte) error {
	return m.recvColl(peer, step, len(dst), sink{dst: dst, reduce: true, dt: m.Cur.DType, red: m.Cur.Red})
}

// wait pauses until something may have arrived; it returns an error if the
// engine stopped or recorded a fatal error.
//
// A TCP link's poll reads its socket itself, without blocking, so a wait
// that returns at once, for the caller to poll again, picks a message up
// with no hand-off: not through the link's reader goroutine, which runs
// only once the Go scheduler polls the network (with GOMAXPROCS=1, as
// rankrunner runs each rank, not while this goroutine keeps the P). So
// the TCP waits below poll for a bounded time (TCPWait), then park until a
// reader goroutine pokes ctl.notify.
func (m *Mesh) wait(b *backoff) error {
	if err := m.Fatal(); err != nil {
		return err
	}
	if m.Spin {
		if m.ctl.pumpAll() {
			b.reset()
			return nil
		}
		return b.pause(m.ctl)
	}
	if b.n == 0 {
		m.tcpSince = time.Now()
	}
	b.n++
	if m.tcpWait.poll(m.tcpSince) {
		return nil
	}
	return m.park(0)
}

// park blocks until a reader goroutine pokes ctl.notify or the engine
// stops; with max > 0, at most max (shm links are polled, not poked).
func (m *Mesh) park(max time.Duration) error {
	var timeout <-chan time.Time
	if max > 0 {
		t := time.NewTimer(max)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-m.ctl.notify:
	case <-timeout:
	case <-m.ctl.Stop:
		return ErrStopped
	}
	return nil
}

// stashMsg reads the polled message h from peer into the stash.
func (m *Mesh) stashMsg(peer int, h Header) error {
	data := make([]byte, h.Len)
	if err := m.links[peer].read(&h, sink{dst: data}); err != nil {
		return m.transportErr(peer, err)
	}
	m.stash[peer] = append(m.stash[peer], stashed{h: h, data: data})
	return nil
}

// checkColl matches a collective message against the current op.
func (m *Mesh) checkColl(peer, step, n int, h Header) error {
	if h.FP != m.Cur.FP {
		return m.Mismatch(peer, h, "")
	}
	if h.Sender != peer {
		return &comm.EngineError{Engine: "cpu", Rank: m.rank, FP: m.Cur.FP,
			Msg: fmt.Sprintf("protocol error: message on the link to rank %d claims sender %d", peer, h.Sender)}
	}
	if int(h.Step) != step || h.Len != uint64(n) {
		// Same op, but the two ranks disagree on what this message holds:
		// split sizes or V-variant counts that do not fit together.
		return m.Mismatch(peer, h, fmt.Sprintf("rank %d sent %s of %d bytes, rank %d expected %s of %d bytes (the ranks' split sizes or counts do not fit together)",
			peer, stepName(int(h.Step)), h.Len, m.rank, stepName(step), n))
	}
	return nil
}

func (m *Mesh) recvColl(peer, step, n int, s sink) error {
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
			if m.Grp != nil {
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
const AgreeStep0 = 1 << 24

// stepName names an algorithm step for mismatch messages.
func stepName(step int) string {
	if step >= AgreeStep0 {
		return fmt.Sprintf("agreement round %d", step-AgreeStep0)
	}
	return fmt.Sprintf("step %d", step)
}
