package transport

import (
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu/kernel"
)

// Forwarding: a message that a rank receives, reduces (or copies) into its
// buffer and then sends on, as each ring step of comm/cpu/allreduce_ring.go
// does after the first. Received and sent one after the other, the send
// reads the buffer a second time, from memory once the message is larger
// than the caches. RecvReduceSend and RecvSend queue the send before the
// receive starts, held (ShmLink.hold): the sink reduces (or copies) each
// received piece and then lets the send copy that piece into its ring at
// once, while it is still in this core's cache (NCCL's recvReduceSend and
// recvCopySend primitives). One pass over the buffer instead of two.
//
// Only a send over an shm link is held; to any other link the two happen
// one after the other (the receive, then the send).

// fwdPiece is the most a forward reduces or copies before it lets the send
// copy the result into its ring: small enough to be still in this core's
// L2 cache (1 MiB on the development machine) beside the piece of the
// received ring the reduce read, large enough that the pump between pieces
// costs nothing. A multiple of every element size.
const fwdPiece = 256 << 10

// forward is the sink of a held send: the job that sends dst on and the
// link it goes out on.
type forward struct {
	job    *shmJob
	link   *ShmLink
	reduce bool
	dt     comm.DType
	red    comm.ReduceOp
}

// deliver reduces (or copies) seg, the message's bytes from offset off,
// into the held job's payload, and after each fwdPiece lets the link copy
// what is done into its ring.
func (f *forward) deliver(off int, seg []byte) error {
	dst := f.job.payload
	for len(seg) > 0 {
		k := min(len(seg), fwdPiece)
		if f.reduce {
			if err := kernel.Reduce(dst[off:off+k], seg[:k], f.dt, f.red); err != nil {
				return err
			}
		} else {
			copy(dst[off:off+k], seg[:k])
		}
		off += k
		seg = seg[k:]
		f.job.ready = uint64(off)
		f.link.pump()
	}
	return nil
}

// RecvReduceSend is RecvReduce(from, step, dst) followed by Send(to,
// sendStep, dst), with each piece of dst sent as soon as it is reduced (see
// above). dst must not change until Flush returns. If the receive fails,
// the send stays held, incomplete: the error breaks the communicator (the
// peers are told), so no peer takes a partly reduced buffer for a result.
func (m *Mesh) RecvReduceSend(from, step int, dst []byte, to, sendStep int) error {
	return m.recvForward(from, step, dst, to, sendStep, true)
}

// RecvSend is Recv(from, step, dst) followed by Send(to, sendStep, dst),
// with each piece of dst sent as soon as it arrived (see above). dst must
// not change until Flush returns.
func (m *Mesh) RecvSend(from, step int, dst []byte, to, sendStep int) error {
	return m.recvForward(from, step, dst, to, sendStep, false)
}

func (m *Mesh) recvForward(from, step int, dst []byte, to, sendStep int, reduce bool) error {
	sl, ok := m.links[to].(*ShmLink)
	if !ok || len(dst) == 0 {
		var err error
		if reduce {
			err = m.RecvReduce(from, step, dst)
		} else {
			err = m.Recv(from, step, dst)
		}
		if err != nil {
			return err
		}
		return m.Send(to, sendStep, dst)
	}
	m.sh = Header{Kind: kindColl, Sender: m.rank, FP: m.Cur.FP, Step: uint32(sendStep), Len: uint64(len(dst))}
	m.dirty[to] = true
	j, err := sl.hold(&m.sh, dst)
	if err != nil {
		return m.transportErr(to, err)
	}
	m.fw = forward{job: j, link: sl, reduce: reduce, dt: m.Cur.DType, red: m.Cur.Red}
	if m.fwFn == nil {
		m.fwFn = m.fw.deliver // m.fw lives as long as m: bound once, no allocation per call
	}
	err = m.recvColl(from, step, len(dst), sink{fn: m.fwFn})
	m.fw = forward{}
	if err != nil {
		return err
	}
	j.held = false
	sl.pump()
	return nil
}

// RecvStreaming is Recv that writes the pieces of dst of at least
// streamMin bytes with non-temporal stores (streamCopy): no read for
// ownership of dst's cache lines, which go to memory instead of this
// core's cache. For a result larger than the caches, which would have
// left them before anyone read it; below that, ordinary stores leave it
// in cache for the caller and are faster (docs/algorithms.md). From a
// link that is not shm it is Recv (a TCP link reads straight into dst).
func (m *Mesh) RecvStreaming(from, step int, dst []byte) error {
	if _, ok := m.links[from].(*ShmLink); !ok {
		return m.Recv(from, step, dst)
	}
	m.so.dst = dst
	if m.soFn == nil {
		m.soFn = m.so.deliver
	}
	err := m.recvColl(from, step, len(dst), sink{fn: m.soFn})
	m.so.dst = nil
	return err
}

// streamOut is the sink of RecvStreaming.
type streamOut struct{ dst []byte }

func (s *streamOut) deliver(off int, seg []byte) error {
	if len(seg) >= streamMin {
		streamCopy(s.dst[off:off+len(seg)], seg)
	} else {
		copy(s.dst[off:], seg)
	}
	return nil
}
