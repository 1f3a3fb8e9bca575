package comm

import "context"

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
func (pg *ProcessGroup) lowerP2P(t OpType, buf Buffer, peer, tag int, anyOK bool) (*Op, error) {
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
	op := newOp(t, buf.DType(), 0, buf.Len(), peer)
	op.Root, op.Peer, op.Tag = -1, peer, tag
	if t == OpSend {
		op.In = []Buffer{buf}
	} else {
		op.Out = []Buffer{buf}
	}
	return op, nil
}

// ISend sends buf to group rank dst with tag, asynchronously (torch isend).
// The Work completes when buf may be reused.
func (pg *ProcessGroup) ISend(ctx context.Context, buf Buffer, dst, tag int, opts ...OpOption) *Work {
	if w := pg.precheck(ctx, OpSend); w != nil {
		return w
	}
	op, err := pg.lowerP2P(OpSend, buf, dst, tag, false)
	return pg.run(ctx, OpSend, op, err, opts)
}

// IRecv receives into buf from group rank src (or AnySource) with tag,
// asynchronously (torch irecv). After completion Work.Source is the sender.
// The incoming message must have exactly buf's dtype and length.
func (pg *ProcessGroup) IRecv(ctx context.Context, buf Buffer, src, tag int, opts ...OpOption) *Work {
	if w := pg.precheck(ctx, OpRecv); w != nil {
		return w
	}
	op, err := pg.lowerP2P(OpRecv, buf, src, tag, true)
	return pg.run(ctx, OpRecv, op, err, opts)
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

// BatchP2P launches ops together as one unit and one Work (torch
// batch_isend_irecv; NCCL group calls), so that matching sends and receives
// between ranks cannot deadlock on ordering. It lowers to one OpCoalesced
// of Send/Recv children and uses one P2P sequence number. Bad input (an
// empty list, an entry that is not OpSend/OpRecv, AnySource, a bad peer,
// tag or buffer) fails the Work at once with an *ArgError wrapping
// ErrInvalidArgument, headed "BatchP2P" and naming the entry ("ops[i]").
func (pg *ProcessGroup) BatchP2P(ctx context.Context, ops []P2POp) *Work {
	if w := pg.precheck(ctx, OpCoalesced); w != nil {
		return w
	}
	if len(ops) == 0 {
		ae := pg.argErr(OpCoalesced, "batch_isend_irecv needs a non-empty list of P2POp")
		ae.Call = "BatchP2P"
		return FailedWork(OpCoalesced, ae)
	}
	children := make([]*Op, len(ops))
	for i, p := range ops {
		var op *Op
		var err error
		if p.Op != OpSend && p.Op != OpRecv {
			err = pg.argErr(OpCoalesced, "op type is %v, expected SEND or RECV (a P2POp is one send or receive)", p.Op)
		} else {
			op, err = pg.lowerP2P(p.Op, p.Buf, p.Peer, p.Tag, false)
		}
		if err != nil {
			// Head the message with the call and name the entry: the
			// caller called BatchP2P, not the entry's op.
			if ae, ok := err.(*ArgError); ok {
				ae.Msg = "ops[" + itoa(i) + "] (" + p.Op.String() + "): " + ae.Msg
				ae.Op, ae.Call = OpCoalesced, "BatchP2P"
			}
			return FailedWork(OpCoalesced, err)
		}
		children[i] = op
	}
	return pg.submit(ctx, coalesced(children), nil)
}
