package comm

import (
	"context"
	"fmt"
)

// Coalescer collects ops inside ProcessGroup.Coalesce; they are launched
// together as one OpCoalesced with one Work (torch _coalescing_manager,
// NCCL group calls). Each method validates like the ProcessGroup method of
// the same name and returns the *ArgError (also remembered: Coalesce then
// fails as a whole and launches nothing). A Coalescer is not safe for
// concurrent use and is dead once fn returns.
type Coalescer struct {
	pg   *ProcessGroup
	ops  []*Op
	err  error
	done bool
}

func (c *Coalescer) add(op *Op, err error) error {
	if c.done {
		return fmt.Errorf("%w: Coalescer used after Coalesce returned", ErrInvalidArgument)
	}
	if err != nil {
		if c.err == nil {
			c.err = err
		}
		return err
	}
	c.ops = append(c.ops, op)
	return nil
}

// Len is the number of ops collected so far.
func (c *Coalescer) Len() int { return len(c.ops) }

// AllReduce adds an in-place all-reduce of buf (see ProcessGroup.AllReduce).
func (c *Coalescer) AllReduce(buf Buffer, red ReduceOp) error {
	return c.add(c.pg.lowerAllReduce(nil, buf, red))
}

// Broadcast adds a broadcast of buf from root (see ProcessGroup.Broadcast).
func (c *Coalescer) Broadcast(buf Buffer, root int) error {
	return c.add(c.pg.lowerBroadcast(nil, buf, root))
}

// Reduce adds a reduce of buf to root (see ProcessGroup.Reduce).
func (c *Coalescer) Reduce(buf Buffer, root int, red ReduceOp) error {
	return c.add(c.pg.lowerReduce(nil, buf, root, red))
}

// AllGather adds a list-form all-gather (see ProcessGroup.AllGather).
func (c *Coalescer) AllGather(out []Buffer, in Buffer) error {
	return c.add(c.pg.lowerAllGather(nil, out, in))
}

// AllGatherInto adds a flat all-gather (see ProcessGroup.AllGatherInto).
func (c *Coalescer) AllGatherInto(out, in Buffer) error {
	return c.add(c.pg.lowerAllGatherInto(nil, out, in))
}

// ReduceScatter adds a list-form reduce-scatter (see ProcessGroup.ReduceScatter).
func (c *Coalescer) ReduceScatter(out Buffer, in []Buffer, red ReduceOp) error {
	return c.add(c.pg.lowerReduceScatter(nil, out, in, red))
}

// ReduceScatterTensor adds a flat reduce-scatter (see ProcessGroup.ReduceScatterTensor).
func (c *Coalescer) ReduceScatterTensor(out, in Buffer, red ReduceOp) error {
	return c.add(c.pg.lowerReduceScatterTensor(nil, out, in, red))
}

// AllToAllSingle adds an all-to-all (see ProcessGroup.AllToAllSingle).
func (c *Coalescer) AllToAllSingle(out, in Buffer, outSplits, inSplits []int) error {
	return c.add(c.pg.lowerAllToAllSingle(nil, out, in, outSplits, inSplits))
}

// Send adds a send of buf to dst (see ProcessGroup.ISend).
func (c *Coalescer) Send(buf Buffer, dst, tag int) error {
	return c.add(c.pg.lowerP2P(nil, OpSend, buf, dst, tag, false))
}

// Recv adds a receive into buf from src; AnySource is not allowed in a
// coalesced block (see ProcessGroup.IRecv).
func (c *Coalescer) Recv(buf Buffer, src, tag int) error {
	return c.add(c.pg.lowerP2P(nil, OpRecv, buf, src, tag, false))
}

// Coalesce runs fn, which issues ops on c, and launches them as one
// OpCoalesced with one Work and one sequence number: the P2P seq if every
// op is a Send or Recv, else the collective seq. If fn returns an error or
// an op was rejected, nothing is launched and the Work fails with that
// error. An empty block launches nothing and returns a completed Work.
// Every rank must coalesce the same collectives in the same order.
func (pg *ProcessGroup) Coalesce(ctx context.Context, fn func(c *Coalescer) error, opts ...OpOption) *Work {
	if w := pg.precheck(ctx, OpCoalesced); w != nil {
		return w
	}
	cfg := ApplyOpOptions(opts)
	c := &Coalescer{pg: pg}
	err := fn(c)
	c.done = true
	if err == nil {
		err = c.err
	}
	if err != nil {
		return FailedWork(OpCoalesced, err)
	}
	if len(c.ops) == 0 {
		return FailedWork(OpCoalesced, nil)
	}
	var b *opBlock
	if cfg.Blocking {
		b = getBlock()
	}
	return pg.submit(ctx, coalesced(b, c.ops), cfg)
}

// UsesP2PSeq reports whether op takes the group's P2P sequence number
// rather than the collective one: Send, Recv, and an OpCoalesced whose
// children are all Send or Recv (a BatchP2P). The communicator actor uses it.
func UsesP2PSeq(op *Op) bool {
	if op.Type != OpCoalesced {
		return op.Type.IsP2P()
	}
	if len(op.Children) == 0 {
		return false
	}
	for _, c := range op.Children {
		if !c.Type.IsP2P() {
			return false
		}
	}
	return true
}
