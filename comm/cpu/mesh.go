package cpu

import (
	"sync/atomic"
)

// Mesh is everything an algorithm sees of the group: ranks, and ordered
// messages to and from peers, all belonging to the op being executed (the
// Gloo pattern of algorithms written against getPair(i) and
// send/recv/wait). Implementations carry the op's fingerprint on every
// message and check it on arrival. Methods are called from one goroutine.
type Mesh interface {
	// Rank and Size are this member's group rank and the group size.
	Rank() int
	Size() int
	// Send queues buf for peer as message step of the current op. buf must
	// not change until Flush returns.
	Send(peer, step int, buf []byte) error
	// Recv blocks until message step of the current op arrives from peer
	// and copies it into dst; its length must be len(dst).
	Recv(peer, step int, dst []byte) error
	// RecvReduce is Recv that combines the message into dst with the op's
	// reduction (dst = op(dst, msg)) as it streams in.
	RecvReduce(peer, step int, dst []byte) error
	// RecvReduceSend is RecvReduce(from, step, dst) followed by
	// Send(to, sendStep, dst); RecvSend is Recv followed by Send. A
	// transport may send each piece of dst as soon as it is reduced or
	// copied, while it is in cache (transport/mesh_forward.go).
	RecvReduceSend(from, step int, dst []byte, to, sendStep int) error
	RecvSend(from, step int, dst []byte, to, sendStep int) error
	// RecvStreaming is Recv for a result larger than the caches: a
	// transport may write dst around the caches (non-temporal stores).
	RecvStreaming(from, step int, dst []byte) error
	// Flush blocks until every queued send has left its buffer.
	Flush() error
	// Reduce combines src into dst with the op's reduction (dst = op(dst, src)).
	Reduce(dst, src []byte) error
}

// fatalBox holds an engine's first fatal error and the collective seq it
// struck at.
type fatalBox struct{ p atomic.Pointer[fatalRec] }

type fatalRec struct {
	err error
	seq uint64 // the collective seq where the failure started (0: every op)
}

// set records err, which struck at collective seq; false if an earlier
// error is recorded.
func (f *fatalBox) set(err error, seq uint64) bool {
	return f.p.CompareAndSwap(nil, &fatalRec{err: err, seq: seq})
}

// get returns the recorded error, or nil.
func (f *fatalBox) get() error {
	if p := f.p.Load(); p != nil {
		return p.err
	}
	return nil
}

// forSeq returns the recorded error if it concerns the op at collective
// seq (opP2P: a point-to-point op, which every failure concerns), or nil:
// a failure that started at seq S does not fail an op of a seq before S on
// its own, since every member that reached S had finished that op's part
// (docs/semantics.md, "An abort is final"). Such an op still fails if its
// own reads break.
func (f *fatalBox) forSeq(seq uint64) error {
	if p := f.p.Load(); p != nil && (seq >= p.seq || seq == opP2P) {
		return p.err
	}
	return nil
}

// opP2P is Engine.opSeq while a point-to-point op (or nothing) runs.
const opP2P = ^uint64(0)
