package transport

import "github.com/ranktree/ranktree/comm"

// Point-to-point messages (c10d send/recv/isend/irecv, NCCL's ncclSend and
// ncclRecv). A Send's payload travels as one kindP2P message carrying its
// tag; the receiver matches on (peer, tag), in send order per peer, and
// stashes messages it is not yet asking for (another tag, or a Send that
// arrives while a collective runs), as Gloo matches unbound buffers by
// slot. A Send completes once its payload left the caller's buffer (into
// the shm ring or the socket); large Sends therefore wait for the receiver
// to drain the transport (rendezvous semantics, as NCCL).

// SendP2P queues a Send's payload with its tag.
func (m *Mesh) SendP2P(peer int, buf []byte) error {
	h := Header{Kind: kindP2P, Sender: m.rank, FP: m.Cur.FP, Tag: m.Cur.Tag, Len: uint64(len(buf))}
	m.dirty[peer] = true
	if err := m.links[peer].send(&h, buf); err != nil {
		return m.transportErr(peer, err)
	}
	return nil
}

// RecvP2P receives a Send with the current op's tag from peer (or from
// any peer with comm.AnySource) into dst and returns the sender.
func (m *Mesh) RecvP2P(peer int, dst []byte) (int, error) {
	match := func(p int, h Header) (bool, error) {
		if h.Kind != kindP2P || h.Tag != m.Cur.Tag {
			return false, nil
		}
		if h.Len != uint64(len(dst)) || h.FP.DType != m.Cur.FP.DType {
			return false, m.Mismatch(p, h, "")
		}
		return true, nil
	}
	peers := []int{peer}
	if peer == comm.AnySource {
		peers = peers[:0]
		for i := range m.size {
			if p := (m.anyNext + i) % m.size; p != m.rank {
				peers = append(peers, p)
			}
		}
		m.anyNext = (m.anyNext + 1) % m.size
	}
	for _, p := range peers {
		for i, st := range m.stash[p] {
			ok, err := match(p, st.h)
			if err != nil {
				return -1, err
			}
			if ok {
				m.stash[p] = append(m.stash[p][:i:i], m.stash[p][i+1:]...)
				copy(dst, st.data)
				return p, nil
			}
		}
	}
	var b backoff
	for {
		progressed := false
		for _, p := range peers {
			h, ok, err := m.links[p].poll()
			if err != nil {
				return -1, m.transportErr(p, err)
			}
			if !ok {
				continue
			}
			hit, err := match(p, h)
			if err != nil {
				return -1, err
			}
			if hit {
				if err := m.links[p].read(&h, sink{dst: dst}); err != nil {
					return -1, m.transportErr(p, err)
				}
				return p, nil
			}
			if err := m.stashMsg(p, h); err != nil {
				return -1, err
			}
			progressed = true
		}
		if progressed {
			b.reset()
			continue
		}
		if err := m.wait(&b); err != nil {
			return -1, err
		}
	}
}
