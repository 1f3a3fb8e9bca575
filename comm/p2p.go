package comm

import (
	"context"
	"slices"
)

// Point-to-point operations. They use the group's P2P sequence counter,
// separate from the collective one (c10d's seqP2P), so P2P traffic between
// two ranks does not shift the collective seqs every rank must agree on.
// Peers are group ranks; tags are non-negative and matched exactly.

// P2POp is one send or receive of a BatchP2P call (torch
// distributed.P2POp). Op is OpSend or OpRecv; Peer is the group rank to
// send to or receive from (AnySource is not allowed in a batch).
type P2POp struct {
	Op   OpType
	Buf  Buffer
	Peer int
	Tag  int
}

// lowerP2P lowers one Send or Recv. anyOK is false inside a batch
// (BatchP2P, Coalesce), where AnySource is refused.
func (pg *ProcessGroup) lowerP2P(b *opBlock, t OpType, buf Buffer, peer, tag int, anyOK bool) (*Op, error) {
	if t != OpSend && t != OpRecv {
		return nil, pg.argErr(t, "invalid P2P op type %v: expected SEND or RECV", t)
	}
	if err := pg.checkPeer(t, peer, anyOK); err != nil {
		return nil, err
	}
	if err := pg.checkTag(t, tag); err != nil {
		return nil, err
	}
	if err := pg.checkBuf(t, "buffer", buf); err != nil {
		return nil, err
	}
	op := newOp(b, t, buf.DType(), 0, buf.Len(), peer)
	op.Root, op.Peer, op.Tag = -1, peer, tag
	if t == OpSend {
		op.setIn(buf)
	} else {
		op.setOut(buf)
	}
	return op, nil
}

// ISend sends buf to group rank dst with tag, asynchronously (torch isend).
// The Work completes when buf may be reused.
func (pg *ProcessGroup) ISend(ctx context.Context, buf Buffer, dst, tag int, opts ...OpOption) *Work {
	if w := pg.precheck(ctx, OpSend); w != nil {
		return w
	}
	cfg, b := opSetup(opts)
	op, err := pg.lowerP2P(b, OpSend, buf, dst, tag, false)
	return pg.run(ctx, OpSend, op, err, cfg, b)
}

// IRecv receives into buf from group rank src (or AnySource) with tag,
// asynchronously (torch irecv). After completion Work.Source is the sender.
// The incoming message must have exactly buf's dtype and length.
func (pg *ProcessGroup) IRecv(ctx context.Context, buf Buffer, src, tag int, opts ...OpOption) *Work {
	if w := pg.precheck(ctx, OpRecv); w != nil {
		return w
	}
	cfg, b := opSetup(opts)
	op, err := pg.lowerP2P(b, OpRecv, buf, src, tag, true)
	return pg.run(ctx, OpRecv, op, err, cfg, b)
}

// Send sends buf to dst with tag and waits for completion (torch send).
// It returns the Work's error or ctx's.
func (pg *ProcessGroup) Send(ctx context.Context, buf Buffer, dst, tag int) error {
	return pg.ISend(ctx, buf, dst, tag).Wait(ctx)
}

// Recv receives into buf from src (or AnySource) with tag and waits (torch
// recv). It returns the sender's group rank (-1 for a non-member).
func (pg *ProcessGroup) Recv(ctx context.Context, buf Buffer, src, tag int) (int, error) {
	w := pg.IRecv(ctx, buf, src, tag)
	if err := w.Wait(ctx); err != nil {
		return -1, err
	}
	if s := w.Source(); s >= 0 {
		return s, nil
	}
	if src == AnySource || pg.rank < 0 {
		return -1, nil
	}
	return src, nil
}

// BatchP2P launches ops together as one unit and returns one Work per op,
// ops[i]'s at index i (semantics of torch.distributed.batch_isend_irecv,
// which returns a list of requests; NCCL group calls), so that matching
// sends and receives between ranks cannot deadlock on ordering. It lowers
// to one OpCoalesced of Send/Recv children and uses one P2P sequence
// number: every returned Work completes when the whole batch does, with
// the batch's error (as NCCL completes a group at ncclGroupEnd), carries
// the batch's Seq, and a receive's Work has Source equal to its Peer.
// Under blocking wait (RANKTREE_BLOCKING_WAIT) their Wait returns when the
// watchdog fails the batch at its timeout; Coalesce gives the batch as one
// Work, with blocking wait's own deadline.
//
// A batch may send to and receive from the calling rank itself, as NCCL
// allows inside a group: each send to self pairs with the receive from
// self of the same tag, in list order, which gets a copy of its data; the
// pair must have equal dtype and length. Self pairs move no message.
//
// Bad input returns an *ArgError wrapping ErrInvalidArgument, headed
// "BatchP2P" and naming the entry ("ops[i]"), and launches nothing: an
// empty list, an entry that is not OpSend/OpRecv, AnySource, a bad peer,
// tag or buffer, or a send to self without its receive (or the reverse, or
// different dtype or length). A destroyed group returns ErrClosed, an
// ended ctx its error. On a non-member every Work is already complete with
// no error. (Before issue 19 BatchP2P returned one Work for the batch;
// comm.WaitAll waits for the list.)
func (pg *ProcessGroup) BatchP2P(ctx context.Context, ops []P2POp, opts ...OpOption) ([]*Work, error) {
	if w := pg.precheck(ctx, OpCoalesced); w != nil {
		if err := w.Err(); err != nil {
			return nil, err
		}
		works := make([]*Work, len(ops))
		for i, p := range ops {
			works[i] = FailedWork(p.Op, nil)
		}
		return works, nil
	}
	if len(ops) == 0 {
		ae := pg.argErr(OpCoalesced, "batch_isend_irecv needs a non-empty list of P2POp")
		ae.Call = "BatchP2P"
		return nil, ae
	}
	children := make([]*Op, len(ops))
	for i, p := range ops {
		var op *Op
		var err error
		switch {
		case p.Op != OpSend && p.Op != OpRecv:
			err = pg.argErr(OpCoalesced, "op type is %v, expected SEND or RECV (a P2POp is one send or receive)", p.Op)
		case p.Peer == pg.rank:
			op, err = pg.lowerSelfP2P(nil, p.Op, p.Buf, p.Tag)
		default:
			op, err = pg.lowerP2P(nil, p.Op, p.Buf, p.Peer, p.Tag, false)
		}
		if err != nil {
			// Head the message with the call and name the entry: the
			// caller called BatchP2P, not the entry's op.
			if ae, ok := err.(*ArgError); ok {
				ae.Msg = "ops[" + itoa(i) + "] (" + p.Op.String() + "): " + ae.Msg
				ae.Op, ae.Call = OpCoalesced, "BatchP2P"
			}
			return nil, err
		}
		children[i] = op
	}
	if err := pg.checkSelfPairs(ops); err != nil {
		return nil, err
	}
	works := make([]*Work, len(ops))
	promises := make([]*Promise, len(ops))
	for i, p := range ops {
		promises[i] = NewPromise(p.Op)
		works[i] = promises[i].Work()
	}
	cfg, blk := opSetup(opts)
	pg.submitThen(ctx, coalesced(blk, children), cfg, func(b *Work) {
		for i, p := range promises {
			p.SetSeq(b.Seq())
			if ops[i].Op == OpRecv && b.err == nil {
				p.SetSource(ops[i].Peer)
			}
			p.Complete(b.err)
		}
	})
	return works, nil
}

// lowerSelfP2P lowers a send to or receive from the calling rank inside a
// batch (checkSelfPairs then pairs them).
func (pg *ProcessGroup) lowerSelfP2P(b *opBlock, t OpType, buf Buffer, tag int) (*Op, error) {
	if err := pg.checkTag(t, tag); err != nil {
		return nil, err
	}
	if err := pg.checkBuf(t, "buffer", buf); err != nil {
		return nil, err
	}
	op := newOp(b, t, buf.DType(), 0, buf.Len(), pg.rank)
	op.Root, op.Peer, op.Tag = -1, pg.rank, tag
	if t == OpSend {
		op.setIn(buf)
	} else {
		op.setOut(buf)
	}
	return op, nil
}

// checkSelfPairs pairs every send to self in ops with the receive from
// self of the same tag, in list order (SelfPairs), and checks that each
// pair has one dtype and length.
func (pg *ProcessGroup) checkSelfPairs(ops []P2POp) error {
	bad := func(format string, args ...any) error {
		ae := pg.argErr(OpCoalesced, format, args...)
		ae.Call = "BatchP2P"
		return ae
	}
	peers, types, tags := make([]int, len(ops)), make([]OpType, len(ops)), make([]int, len(ops))
	for i, p := range ops {
		peers[i], types[i], tags[i] = p.Peer, p.Op, p.Tag
	}
	pairs, unpaired := SelfPairs(pg.rank, peers, types, tags)
	if unpaired >= 0 {
		p := ops[unpaired]
		if p.Op == OpSend {
			return bad("ops[%d] (SEND) sends to rank %d itself with tag %d, but the batch has no matching receive from self with that tag (a self send pairs with a self receive of the same tag, in list order)", unpaired, pg.rank, p.Tag)
		}
		return bad("ops[%d] (RECV) receives from rank %d itself with tag %d, but the batch has no matching send to self with that tag (a self receive pairs with a self send of the same tag, in list order)", unpaired, pg.rank, p.Tag)
	}
	if pg.device && len(pairs) > 1 {
		// NCCL pairs a group's sends to and receives from one peer in
		// order, tags aside: the tag pairing must agree with it.
		for i := 1; i < len(pairs); i++ {
			if pairs[i][1] < pairs[i-1][1] {
				return bad("ops[%d] and ops[%d] (RECV from self) are listed in another order than the sends to self they pair with by tag (ops[%d], ops[%d]); engine %q pairs them in list order: list them alike",
					pairs[i][1], pairs[i-1][1], pairs[i][0], pairs[i-1][0], pg.engine)
			}
		}
	}
	for _, pr := range pairs {
		s, r := ops[pr[0]].Buf, ops[pr[1]].Buf
		if s.DType() != r.DType() || s.Len() != r.Len() {
			return bad("ops[%d] (SEND to self) has %v×%d but its receive ops[%d] (RECV from self) has %v×%d: a self pair needs one dtype and length",
				pr[0], s.DType(), s.Len(), pr[1], r.DType(), r.Len())
		}
	}
	return nil
}

// SelfPairs pairs the sends to self (peers[i] == self, types[i] == OpSend)
// of one batch with its receives from self by tag, in list order: the k-th
// self send with tag t pairs with the k-th self receive with tag t. It
// returns the pairs as [send index, recv index] and the index of the first
// entry left unpaired, or -1. BatchP2P and the engines use it.
func SelfPairs(self int, peers []int, types []OpType, tags []int) (pairs [][2]int, unpaired int) {
	sends, recvs := map[int][]int{}, map[int][]int{}
	for i, p := range peers {
		if p != self {
			continue
		}
		if types[i] == OpSend {
			sends[tags[i]] = append(sends[tags[i]], i)
		} else {
			recvs[tags[i]] = append(recvs[tags[i]], i)
		}
	}
	unpaired = -1
	note := func(i int) {
		if unpaired < 0 || i < unpaired {
			unpaired = i
		}
	}
	for tag, ss := range sends {
		rs := recvs[tag]
		for k, s := range ss {
			if k < len(rs) {
				pairs = append(pairs, [2]int{s, rs[k]})
			} else {
				note(s)
			}
		}
		for _, r := range rs[min(len(ss), len(rs)):] {
			note(r)
		}
	}
	for tag, rs := range recvs {
		if _, ok := sends[tag]; !ok {
			note(rs[0])
		}
	}
	slices.SortFunc(pairs, func(a, b [2]int) int { return a[0] - b[0] })
	return pairs, unpaired
}

// WaitAll waits for every Work of works (e.g. BatchP2P's) and returns the
// first error in list order, or ctx's error (torch: waiting on each
// request of batch_isend_irecv). nil Works are skipped.
func WaitAll(ctx context.Context, works []*Work) error {
	var first error
	for _, w := range works {
		if w == nil {
			continue
		}
		if err := w.Wait(ctx); err != nil && first == nil {
			first = err
			if ctx.Err() != nil {
				return first
			}
		}
	}
	return first
}
