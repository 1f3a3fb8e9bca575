// Package memgroup is a test double of a process group: n ranks in one
// process, with the collectives the DDP reducer and the MNIST loop use
// (AllReduce of float32/int32/int64 with Sum, Max or Min; Broadcast;
// AllGatherInto). It is not the comm engine: it exists so the MNIST job can
// be tested end to end without sockets or a launcher.
package memgroup

import (
	"context"
	"fmt"
	"sync"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/reducer"
)

// World is n ranks in one process. The k-th collectives of all ranks are
// matched; the last rank to issue one executes it and completes everyone's
// Work, so launches are asynchronous as with a real engine. Mismatched
// collectives fail with comm.ErrMismatch. Safe for concurrent use.
type World struct {
	n     int
	mu    sync.Mutex
	seqs  []int
	slots map[int][]*memPart
	ops   []int // collectives executed, per rank
}

type memPart struct {
	typ     comm.OpType
	in, out comm.Buffer
	op      comm.ReduceOp
	root    int
	p       *comm.Promise // the group completes the part's Work once every rank issued it
}

type memGroup struct {
	w    *World
	rank int
}

// New returns a World of n ranks (n ≥ 1).
func New(n int) *World {
	return &World{n: n, seqs: make([]int, n), slots: map[int][]*memPart{}, ops: make([]int, n)}
}

// Group is rank's handle; it satisfies reducer.Group.
func (w *World) Group(rank int) reducer.Group { return &memGroup{w: w, rank: rank} }

// Ops is the number of collectives rank has completed.
func (w *World) Ops(rank int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ops[rank]
}

func (g *memGroup) Rank() int { return g.rank }
func (g *memGroup) Size() int { return g.w.n }

func (g *memGroup) AllReduce(ctx context.Context, buf comm.Buffer, op comm.ReduceOp, _ ...comm.OpOption) *comm.Work {
	return g.issue(&memPart{typ: comm.OpAllReduce, in: buf, out: buf, op: op})
}

func (g *memGroup) Broadcast(ctx context.Context, buf comm.Buffer, root int, _ ...comm.OpOption) *comm.Work {
	return g.issue(&memPart{typ: comm.OpBroadcast, in: buf, out: buf, root: root})
}

func (g *memGroup) AllGatherInto(ctx context.Context, out, in comm.Buffer, _ ...comm.OpOption) *comm.Work {
	return g.issue(&memPart{typ: comm.OpAllGather, in: in, out: out})
}

func (g *memGroup) issue(p *memPart) *comm.Work {
	p.p = comm.NewPromise(p.typ)
	w := g.w
	w.mu.Lock()
	defer w.mu.Unlock()
	seq := w.seqs[g.rank]
	w.seqs[g.rank]++
	if w.slots[seq] == nil {
		w.slots[seq] = make([]*memPart, w.n)
	}
	parts := w.slots[seq]
	parts[g.rank] = p
	for _, q := range parts {
		if q == nil {
			return p.p.Work()
		}
	}
	delete(w.slots, seq)
	err := execute(parts)
	for r, q := range parts {
		w.ops[r]++
		q.p.Complete(err)
	}
	return p.p.Work()
}

func execute(parts []*memPart) error {
	p0 := parts[0]
	for r, q := range parts {
		if q.typ != p0.typ || q.in.DType() != p0.in.DType() || q.in.Len() != p0.in.Len() || q.op != p0.op || q.root != p0.root {
			return fmt.Errorf("%w: rank %d issued %v %v, rank 0 %v %v", comm.ErrMismatch, r, q.typ, q.in, p0.typ, p0.in)
		}
	}
	switch p0.typ {
	case comm.OpBroadcast:
		src := parts[p0.root].in.Bytes()
		for _, q := range parts {
			copy(q.out.Bytes(), src)
		}
		return nil
	case comm.OpAllGather:
		var all []byte
		for _, q := range parts {
			all = append(all, q.in.Bytes()...)
		}
		for _, q := range parts {
			copy(q.out.Bytes(), all)
		}
		return nil
	}
	switch p0.in.DType() {
	case comm.Float32:
		return reduceAll[float32](parts)
	case comm.Int32:
		return reduceAll[int32](parts)
	case comm.Int64:
		return reduceAll[int64](parts)
	}
	return fmt.Errorf("%w: test group: dtype %v", comm.ErrUnsupported, p0.in.DType())
}

func reduceAll[T float32 | int32 | int64](parts []*memPart) error {
	bufs := make([][]T, len(parts))
	for r, q := range parts {
		s, err := comm.AsSlice[T](q.in)
		if err != nil {
			return err
		}
		bufs[r] = s
	}
	for i := range bufs[0] {
		acc := bufs[0][i]
		for _, b := range bufs[1:] {
			switch parts[0].op {
			case comm.Sum:
				acc += b[i]
			case comm.Max:
				acc = max(acc, b[i])
			case comm.Min:
				acc = min(acc, b[i])
			default:
				return fmt.Errorf("%w: test group: op %v", comm.ErrUnsupported, parts[0].op)
			}
		}
		for _, b := range bufs {
			b[i] = acc
		}
	}
	return nil
}
