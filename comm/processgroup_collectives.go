package comm

import "context"

// Collectives. Each method validates its input (returning a Work already
// failed with an *ArgError, wrapping ErrInvalidArgument, before anything is
// sent or a sequence number is used), lowers the call to one Op descriptor
// and posts it to the group's communicator actor. The returned Work
// completes when the engine finishes the op (c10d's async_op=True Work).
//
// Fingerprint.Count is the per-rank element count the op's buffers imply,
// chosen to be equal on every rank of a correct program: the buffer for
// AllReduce/Broadcast/Reduce, the input for AllGather and Gather, the output
// for ReduceScatter and Scatter, sum(counts) for the V-variants, 0 for
// AllToAll (per-rank totals legitimately differ) and Barrier.
// Fingerprint.Shape is the shape (Buffer.WithShape) of that same buffer, so
// that ranks passing different shapes fail with ErrMismatch; the
// V-variants, AllToAll and P2P carry none. Every buffer's shape is checked
// (product equal to its length, no negative dimension) before launch.

// newOp builds an op descriptor in block b (nil: a new block): the Op
// with its shape fingerprint (no identity yet) and the unused Promise that
// submit hands to the launcher with it (a child of a coalesced op leaves
// its Promise unused). A blocking call's block comes from the pool
// (opSetup) and goes back to it once nothing refers to it (opblock.go).
func newOp(b *opBlock, t OpType, dt DType, red RedOpType, count int, root int) *Op {
	fp := Fingerprint{Op: t, DType: dt, RedOp: red, Count: int64(count), Root: int32(root)}
	if b == nil {
		// Built in place by the allocation: no copy into the heap.
		b = &opBlock{op: Op{FP: fp, Type: t, Root: root, Peer: -1}}
	} else {
		b.op = Op{FP: fp, Type: t, Root: root, Peer: -1}
	}
	b.op.promise = &b.p
	return &b.op
}

// run submits op, lowered into block b with cfg from the call's options,
// or returns a Work failed with the lowering's error (b then goes back to
// the pool unused).
func (pg *ProcessGroup) run(ctx context.Context, t OpType, op *Op, err error, cfg OpConfig, b *opBlock) *Work {
	if err != nil {
		b.discard()
		return FailedWork(t, err)
	}
	return pg.submit(ctx, op, cfg)
}

// AllReduce reduces buf across the group with red, in place; every rank
// ends with the result (torch.distributed.all_reduce, ncclAllReduce). Avg
// divides the sum by Size; bool Sum is logical or.
func (pg *ProcessGroup) AllReduce(ctx context.Context, buf Buffer, red ReduceOp, opts ...OpOption) *Work {
	if w := pg.precheck(ctx, OpAllReduce); w != nil {
		return w
	}
	cfg, b := opSetup(opts)
	op, err := pg.lowerAllReduce(b, buf, red)
	return pg.run(ctx, OpAllReduce, op, err, cfg, b)
}

func (pg *ProcessGroup) lowerAllReduce(b *opBlock, buf Buffer, red ReduceOp) (*Op, error) {
	if err := pg.checkBuf(OpAllReduce, "buffer", buf); err != nil {
		return nil, err
	}
	if err := pg.checkReduce(OpAllReduce, red, buf.DType()); err != nil {
		return nil, err
	}
	op := newOp(b, OpAllReduce, buf.DType(), red.Type(), buf.Len(), -1)
	op.FP.Shape = buf.ShapeKey()
	op.Reduce = red.ForDType(buf.DType())
	op.setIn(buf)
	return op, nil
}

// AllReduceCoalesced all-reduces every buffer of bufs (same dtype) as one
// op and one Work (torch all_reduce_coalesced). It lowers to an OpCoalesced
// whose children are AllReduce ops, one per buffer.
func (pg *ProcessGroup) AllReduceCoalesced(ctx context.Context, bufs []Buffer, red ReduceOp, opts ...OpOption) *Work {
	if w := pg.precheck(ctx, OpCoalesced); w != nil {
		return w
	}
	if len(bufs) == 0 {
		return FailedWork(OpCoalesced, pg.argErr(OpAllReduce, "all_reduce_coalesced requires a non-empty buffer list"))
	}
	if err := pg.checkBufs(OpAllReduce, "buffers", bufs, bufs[0].DType()); err != nil {
		return FailedWork(OpCoalesced, err)
	}
	children := make([]*Op, len(bufs))
	for i, buf := range bufs {
		op, err := pg.lowerAllReduce(nil, buf, red)
		if err != nil {
			return FailedWork(OpCoalesced, err)
		}
		children[i] = op
	}
	cfg, b := opSetup(opts)
	return pg.submit(ctx, coalesced(b, children), cfg)
}

// Broadcast copies root's buf to every rank's buf (torch broadcast,
// ncclBroadcast). root is a group rank.
func (pg *ProcessGroup) Broadcast(ctx context.Context, buf Buffer, root int, opts ...OpOption) *Work {
	if w := pg.precheck(ctx, OpBroadcast); w != nil {
		return w
	}
	cfg, b := opSetup(opts)
	op, err := pg.lowerBroadcast(b, buf, root)
	return pg.run(ctx, OpBroadcast, op, err, cfg, b)
}

func (pg *ProcessGroup) lowerBroadcast(b *opBlock, buf Buffer, root int) (*Op, error) {
	if err := pg.checkRoot(OpBroadcast, root); err != nil {
		return nil, err
	}
	if err := pg.checkBuf(OpBroadcast, "buffer", buf); err != nil {
		return nil, err
	}
	op := newOp(b, OpBroadcast, buf.DType(), 0, buf.Len(), root)
	op.FP.Shape = buf.ShapeKey()
	op.setIn(buf)
	return op, nil
}

// Reduce reduces buf across the group into root's buf; other ranks' buffers
// are left unchanged (torch reduce, ncclReduce).
func (pg *ProcessGroup) Reduce(ctx context.Context, buf Buffer, root int, red ReduceOp, opts ...OpOption) *Work {
	if w := pg.precheck(ctx, OpReduce); w != nil {
		return w
	}
	cfg, b := opSetup(opts)
	op, err := pg.lowerReduce(b, buf, root, red)
	return pg.run(ctx, OpReduce, op, err, cfg, b)
}

func (pg *ProcessGroup) lowerReduce(b *opBlock, buf Buffer, root int, red ReduceOp) (*Op, error) {
	if err := pg.checkRoot(OpReduce, root); err != nil {
		return nil, err
	}
	if err := pg.checkBuf(OpReduce, "buffer", buf); err != nil {
		return nil, err
	}
	if err := pg.checkReduce(OpReduce, red, buf.DType()); err != nil {
		return nil, err
	}
	op := newOp(b, OpReduce, buf.DType(), red.Type(), buf.Len(), root)
	op.FP.Shape = buf.ShapeKey()
	op.Reduce = red.ForDType(buf.DType())
	op.setIn(buf)
	return op, nil
}

// AllGather gathers every rank's in into out[i] (i = the source's group
// rank) on every rank: torch all_gather with a tensor list. out must hold
// Size buffers of in's dtype; out[Rank()] must have in's length.
//
// The other buffers may differ in length (torch all_gather with tensors of
// different sizes per rank, as ProcessGroupNCCL allows): out[i] must then
// have rank i's input length, and the op runs as AllGatherV with counts
// out[j].Len() (its Work and fingerprint are AllGatherV's). Ranks whose
// lists disagree (a length that is not the sender's) fail with
// ErrMismatch on every rank. With equal lengths it is ncclAllGather into
// the list.
func (pg *ProcessGroup) AllGather(ctx context.Context, out []Buffer, in Buffer, opts ...OpOption) *Work {
	if w := pg.precheck(ctx, OpAllGather); w != nil {
		return w
	}
	cfg, b := opSetup(opts)
	op, err := pg.lowerAllGather(b, out, in)
	return pg.run(ctx, OpAllGather, op, err, cfg, b)
}

func (pg *ProcessGroup) lowerAllGather(b *opBlock, out []Buffer, in Buffer) (*Op, error) {
	const t = OpAllGather
	if err := pg.checkBuf(t, "input", in); err != nil {
		return nil, err
	}
	if err := pg.checkListLen(t, "output list", len(out)); err != nil {
		return nil, err
	}
	if err := pg.checkBufs(t, "output", out, in.DType()); err != nil {
		return nil, err
	}
	if err := pg.checkLen(t, "output["+itoa(pg.rank)+"]", out[pg.rank], in.Len(), "this rank's own part holds its input"); err != nil {
		return nil, err
	}
	if !sameLen(out, in.Len()) {
		return pg.lowerUneven(b, OpAllGatherV, out, in, ReduceOp{}), nil
	}
	op := newOp(b, t, in.DType(), 0, in.Len(), -1)
	op.FP.Shape = in.ShapeKey()
	op.setIn(in)
	op.Out = append([]Buffer(nil), out...)
	return op, nil
}

// sameLen reports whether every buffer of bufs has n elements.
func sameLen(bufs []Buffer, n int) bool {
	for _, b := range bufs {
		if b.Len() != n {
			return false
		}
	}
	return true
}

// lowerUneven lowers the uneven list forms onto the V variants: an
// all_gather whose output list (list) has different lengths becomes an
// AllGatherV of one, and a reduce_scatter whose input list does becomes a
// ReduceScatterV into one; counts[i] is list[i].Len(), one is the flat
// buffer (the all-gather's input or the reduce-scatter's output). The
// checks were made by the caller (list length, dtypes, list[rank] ==
// one's length).
func (pg *ProcessGroup) lowerUneven(b *opBlock, t OpType, list []Buffer, one Buffer, red ReduceOp) *Op {
	counts := make([]int, len(list))
	sum := 0
	for i, buf := range list {
		counts[i] = buf.Len()
		sum += buf.Len()
	}
	op := newOp(b, t, one.DType(), red.Type(), sum, -1)
	op.RecvCounts = counts
	if t == OpAllGatherV {
		op.setIn(one)
		op.Out = append([]Buffer(nil), list...)
		return op
	}
	op.Reduce = red.ForDType(one.DType())
	op.In = append([]Buffer(nil), list...)
	op.setOut(one)
	return op
}

// AllGatherInto gathers every rank's in into one buffer out of Size×in.Len()
// elements, rank i's part at offset i×in.Len(): torch
// all_gather_into_tensor, ncclAllGather.
func (pg *ProcessGroup) AllGatherInto(ctx context.Context, out, in Buffer, opts ...OpOption) *Work {
	if w := pg.precheck(ctx, OpAllGather); w != nil {
		return w
	}
	cfg, b := opSetup(opts)
	op, err := pg.lowerAllGatherInto(b, out, in)
	return pg.run(ctx, OpAllGather, op, err, cfg, b)
}

func (pg *ProcessGroup) lowerAllGatherInto(b *opBlock, out, in Buffer) (*Op, error) {
	const t = OpAllGather
	if err := pg.checkBuf(t, "input", in); err != nil {
		return nil, err
	}
	if err := pg.checkBuf(t, "output", out); err != nil {
		return nil, err
	}
	if err := pg.checkDType(t, "output", out, "input", in); err != nil {
		return nil, err
	}
	if out.Len() != pg.size*in.Len() {
		return nil, pg.argErr(t, "output tensor size must be equal to world_size times input tensor size: output has %d elements, expected %d×%d = %d",
			out.Len(), pg.size, in.Len(), pg.size*in.Len())
	}
	op := newOp(b, t, in.DType(), 0, in.Len(), -1)
	op.FP.Shape = in.ShapeKey()
	op.setIn(in)
	op.setOut(out)
	return op, nil
}

// AllGatherV gathers uneven parts: rank i contributes counts[i] elements
// (in.Len() must be counts[Rank()]) and out holds sum(counts) elements,
// rank i's at the prefix sum of counts (MPI_Allgatherv; torch all_gather
// with uneven tensors). counts must be equal on every rank.
func (pg *ProcessGroup) AllGatherV(ctx context.Context, out Buffer, in Buffer, counts []int, opts ...OpOption) *Work {
	if w := pg.precheck(ctx, OpAllGatherV); w != nil {
		return w
	}
	cfg, b := opSetup(opts)
	op, err := pg.lowerAllGatherV(b, out, in, counts)
	return pg.run(ctx, OpAllGatherV, op, err, cfg, b)
}

func (pg *ProcessGroup) lowerAllGatherV(b *opBlock, out, in Buffer, counts []int) (*Op, error) {
	const t = OpAllGatherV
	sum, err := pg.checkCounts(t, "counts", counts)
	if err != nil {
		return nil, err
	}
	if err := pg.checkBuf(t, "input", in); err != nil {
		return nil, err
	}
	if err := pg.checkBuf(t, "output", out); err != nil {
		return nil, err
	}
	if err := pg.checkDType(t, "output", out, "input", in); err != nil {
		return nil, err
	}
	if err := pg.checkLen(t, "input", in, counts[pg.rank], "counts[rank]"); err != nil {
		return nil, err
	}
	if err := pg.checkLen(t, "output", out, sum, "sum(counts)"); err != nil {
		return nil, err
	}
	op := newOp(b, t, in.DType(), 0, sum, -1)
	op.setIn(in)
	op.setOut(out)
	op.RecvCounts = append([]int(nil), counts...)
	return op, nil
}

// ReduceScatter reduces in[i] across the group into rank i's out: torch
// reduce_scatter with a tensor list. in must hold Size buffers of out's
// dtype; in[Rank()] must have out's length.
//
// The other buffers may differ in length (torch reduce_scatter with a list
// of different-size inputs, as ProcessGroupNCCL allows): in[i] must then
// have rank i's output length on every rank, and the op runs as
// ReduceScatterV with counts in[j].Len() (its Work and fingerprint are
// ReduceScatterV's). Ranks whose lists disagree fail with ErrMismatch on
// every rank. With equal lengths it is ncclReduceScatter from the list.
func (pg *ProcessGroup) ReduceScatter(ctx context.Context, out Buffer, in []Buffer, red ReduceOp, opts ...OpOption) *Work {
	if w := pg.precheck(ctx, OpReduceScatter); w != nil {
		return w
	}
	cfg, b := opSetup(opts)
	op, err := pg.lowerReduceScatter(b, out, in, red)
	return pg.run(ctx, OpReduceScatter, op, err, cfg, b)
}

func (pg *ProcessGroup) lowerReduceScatter(b *opBlock, out Buffer, in []Buffer, red ReduceOp) (*Op, error) {
	const t = OpReduceScatter
	if err := pg.checkBuf(t, "output", out); err != nil {
		return nil, err
	}
	if err := pg.checkListLen(t, "input list", len(in)); err != nil {
		return nil, err
	}
	if err := pg.checkBufs(t, "input", in, out.DType()); err != nil {
		return nil, err
	}
	if err := pg.checkLen(t, "input["+itoa(pg.rank)+"]", in[pg.rank], out.Len(), "this rank's own part has its output's count"); err != nil {
		return nil, err
	}
	if err := pg.checkReduce(t, red, out.DType()); err != nil {
		return nil, err
	}
	if !sameLen(in, out.Len()) {
		return pg.lowerUneven(b, OpReduceScatterV, in, out, red), nil
	}
	op := newOp(b, t, out.DType(), red.Type(), out.Len(), -1)
	op.FP.Shape = out.ShapeKey()
	op.Reduce = red.ForDType(out.DType())
	op.In = append([]Buffer(nil), in...)
	op.setOut(out)
	return op, nil
}

// ReduceScatterTensor reduces one buffer in of Size×out.Len() elements
// across the group; rank i receives the reduction of part i: torch
// reduce_scatter_tensor, ncclReduceScatter.
func (pg *ProcessGroup) ReduceScatterTensor(ctx context.Context, out, in Buffer, red ReduceOp, opts ...OpOption) *Work {
	if w := pg.precheck(ctx, OpReduceScatter); w != nil {
		return w
	}
	cfg, b := opSetup(opts)
	op, err := pg.lowerReduceScatterTensor(b, out, in, red)
	return pg.run(ctx, OpReduceScatter, op, err, cfg, b)
}

func (pg *ProcessGroup) lowerReduceScatterTensor(b *opBlock, out, in Buffer, red ReduceOp) (*Op, error) {
	const t = OpReduceScatter
	if err := pg.checkBuf(t, "input", in); err != nil {
		return nil, err
	}
	if err := pg.checkBuf(t, "output", out); err != nil {
		return nil, err
	}
	if err := pg.checkDType(t, "output", out, "input", in); err != nil {
		return nil, err
	}
	if in.Len() != pg.size*out.Len() {
		return nil, pg.argErr(t, "input tensor must be the same size as output size times world size: input has %d elements, expected %d×%d = %d",
			in.Len(), pg.size, out.Len(), pg.size*out.Len())
	}
	if err := pg.checkReduce(t, red, out.DType()); err != nil {
		return nil, err
	}
	op := newOp(b, t, out.DType(), red.Type(), out.Len(), -1)
	op.FP.Shape = out.ShapeKey()
	op.Reduce = red.ForDType(out.DType())
	op.setIn(in)
	op.setOut(out)
	return op, nil
}

// ReduceScatterV reduces in (sum(counts) elements) across the group; rank i
// receives counts[i] elements, the reduction of the part at the prefix sum
// of counts. out.Len() must be counts[Rank()]; counts equal on every rank.
func (pg *ProcessGroup) ReduceScatterV(ctx context.Context, out, in Buffer, counts []int, red ReduceOp, opts ...OpOption) *Work {
	if w := pg.precheck(ctx, OpReduceScatterV); w != nil {
		return w
	}
	cfg, b := opSetup(opts)
	op, err := pg.lowerReduceScatterV(b, out, in, counts, red)
	return pg.run(ctx, OpReduceScatterV, op, err, cfg, b)
}

func (pg *ProcessGroup) lowerReduceScatterV(b *opBlock, out, in Buffer, counts []int, red ReduceOp) (*Op, error) {
	const t = OpReduceScatterV
	sum, err := pg.checkCounts(t, "counts", counts)
	if err != nil {
		return nil, err
	}
	if err := pg.checkBuf(t, "input", in); err != nil {
		return nil, err
	}
	if err := pg.checkBuf(t, "output", out); err != nil {
		return nil, err
	}
	if err := pg.checkDType(t, "output", out, "input", in); err != nil {
		return nil, err
	}
	if err := pg.checkLen(t, "output", out, counts[pg.rank], "counts[rank]"); err != nil {
		return nil, err
	}
	if err := pg.checkLen(t, "input", in, sum, "sum(counts)"); err != nil {
		return nil, err
	}
	if err := pg.checkReduce(t, red, out.DType()); err != nil {
		return nil, err
	}
	op := newOp(b, t, out.DType(), red.Type(), sum, -1)
	op.Reduce = red.ForDType(out.DType())
	op.setIn(in)
	op.setOut(out)
	op.RecvCounts = append([]int(nil), counts...)
	return op, nil
}

// AllToAllSingle sends part i of in to rank i and receives rank i's part
// into part i of out: torch all_to_all_single. inSplits[i] / outSplits[i]
// are the element counts of the parts; a nil split list means equal parts
// (the buffer's length must then divide by Size).
func (pg *ProcessGroup) AllToAllSingle(ctx context.Context, out, in Buffer, outSplits, inSplits []int, opts ...OpOption) *Work {
	if w := pg.precheck(ctx, OpAllToAll); w != nil {
		return w
	}
	cfg, b := opSetup(opts)
	op, err := pg.lowerAllToAllSingle(b, out, in, outSplits, inSplits)
	return pg.run(ctx, OpAllToAll, op, err, cfg, b)
}

func (pg *ProcessGroup) splits(what string, b Buffer, splits []int) ([]int, error) {
	const t = OpAllToAll
	if splits == nil {
		if b.Len()%pg.size != 0 {
			return nil, pg.argErr(t, "%s has %d elements, which does not divide into %d equal splits (the group size)", what, b.Len(), pg.size)
		}
		s := make([]int, pg.size)
		for i := range s {
			s[i] = b.Len() / pg.size
		}
		return s, nil
	}
	sum, err := pg.checkCounts(t, what+" splits", splits)
	if err != nil {
		return nil, err
	}
	if sum != b.Len() {
		return nil, pg.argErr(t, "Split sizes doesn't match total dim 0 size: %s splits sum to %d, %s has %d elements", what, sum, what, b.Len())
	}
	return append([]int(nil), splits...), nil
}

func (pg *ProcessGroup) lowerAllToAllSingle(b *opBlock, out, in Buffer, outSplits, inSplits []int) (*Op, error) {
	const t = OpAllToAll
	if err := pg.checkBuf(t, "input", in); err != nil {
		return nil, err
	}
	if err := pg.checkBuf(t, "output", out); err != nil {
		return nil, err
	}
	if err := pg.checkDType(t, "output", out, "input", in); err != nil {
		return nil, err
	}
	send, err := pg.splits("input", in, inSplits)
	if err != nil {
		return nil, err
	}
	recv, err := pg.splits("output", out, outSplits)
	if err != nil {
		return nil, err
	}
	op := newOp(b, t, in.DType(), 0, 0, -1)
	op.setIn(in)
	op.setOut(out)
	op.SendCounts, op.RecvCounts = send, recv
	return op, nil
}

// AllToAll sends in[i] to rank i and receives rank i's buffer into out[i]
// (torch all_to_all with tensor lists; sizes may differ per pair). Both
// lists hold Size buffers of one dtype.
func (pg *ProcessGroup) AllToAll(ctx context.Context, out, in []Buffer, opts ...OpOption) *Work {
	if w := pg.precheck(ctx, OpAllToAll); w != nil {
		return w
	}
	cfg, b := opSetup(opts)
	op, err := pg.lowerAllToAll(b, out, in)
	return pg.run(ctx, OpAllToAll, op, err, cfg, b)
}

func (pg *ProcessGroup) lowerAllToAll(b *opBlock, out, in []Buffer) (*Op, error) {
	const t = OpAllToAll
	if err := pg.checkListLen(t, "input list", len(in)); err != nil {
		return nil, err
	}
	if err := pg.checkListLen(t, "output list", len(out)); err != nil {
		return nil, err
	}
	dt := in[0].DType()
	if err := pg.checkBufs(t, "input", in, dt); err != nil {
		return nil, err
	}
	if err := pg.checkBufs(t, "output", out, dt); err != nil {
		return nil, err
	}
	op := newOp(b, t, dt, 0, 0, -1)
	op.In = append([]Buffer(nil), in...)
	op.Out = append([]Buffer(nil), out...)
	op.SendCounts = make([]int, pg.size)
	op.RecvCounts = make([]int, pg.size)
	for i := range in {
		op.SendCounts[i] = in[i].Len()
		op.RecvCounts[i] = out[i].Len()
	}
	return op, nil
}

// Gather collects every rank's in on root into out[i] (i = the source's
// group rank): torch gather. out is given on root only (Size buffers of in's
// dtype and length) and must be empty elsewhere.
func (pg *ProcessGroup) Gather(ctx context.Context, out []Buffer, in Buffer, root int, opts ...OpOption) *Work {
	if w := pg.precheck(ctx, OpGather); w != nil {
		return w
	}
	cfg, b := opSetup(opts)
	op, err := pg.lowerGather(b, out, in, root)
	return pg.run(ctx, OpGather, op, err, cfg, b)
}

func (pg *ProcessGroup) lowerGather(b *opBlock, out []Buffer, in Buffer, root int) (*Op, error) {
	const t = OpGather
	if err := pg.checkRoot(t, root); err != nil {
		return nil, err
	}
	if err := pg.checkBuf(t, "input", in); err != nil {
		return nil, err
	}
	op := newOp(b, t, in.DType(), 0, in.Len(), root)
	op.FP.Shape = in.ShapeKey()
	op.setIn(in)
	if pg.rank != root {
		if len(out) != 0 {
			return nil, pg.argErr(t, "Argument gather_list must NOT be specified on non-destination ranks: got %d output buffers on rank %d, root is %d", len(out), pg.rank, root)
		}
		return op, nil
	}
	if err := pg.checkListLen(t, "gather_list", len(out)); err != nil {
		return nil, err
	}
	if err := pg.checkBufs(t, "gather_list", out, in.DType()); err != nil {
		return nil, err
	}
	for i, b := range out {
		if err := pg.checkLen(t, "gather_list["+itoa(i)+"]", b, in.Len(), "the input's count"); err != nil {
			return nil, err
		}
	}
	op.Out = append([]Buffer(nil), out...)
	return op, nil
}

// Scatter sends root's in[i] to rank i's out: torch scatter. in is given on
// root only (Size buffers of out's dtype and length) and must be empty
// elsewhere.
func (pg *ProcessGroup) Scatter(ctx context.Context, out Buffer, in []Buffer, root int, opts ...OpOption) *Work {
	if w := pg.precheck(ctx, OpScatter); w != nil {
		return w
	}
	cfg, b := opSetup(opts)
	op, err := pg.lowerScatter(b, out, in, root)
	return pg.run(ctx, OpScatter, op, err, cfg, b)
}

func (pg *ProcessGroup) lowerScatter(b *opBlock, out Buffer, in []Buffer, root int) (*Op, error) {
	const t = OpScatter
	if err := pg.checkRoot(t, root); err != nil {
		return nil, err
	}
	if err := pg.checkBuf(t, "output", out); err != nil {
		return nil, err
	}
	op := newOp(b, t, out.DType(), 0, out.Len(), root)
	op.FP.Shape = out.ShapeKey()
	op.setOut(out)
	if pg.rank != root {
		if len(in) != 0 {
			return nil, pg.argErr(t, "Argument scatter_list must NOT be specified on non-source ranks: got %d input buffers on rank %d, root is %d", len(in), pg.rank, root)
		}
		return op, nil
	}
	if err := pg.checkListLen(t, "scatter_list", len(in)); err != nil {
		return nil, err
	}
	if err := pg.checkBufs(t, "scatter_list", in, out.DType()); err != nil {
		return nil, err
	}
	for i, b := range in {
		if err := pg.checkLen(t, "scatter_list["+itoa(i)+"]", b, out.Len(), "the output's count"); err != nil {
			return nil, err
		}
	}
	op.In = append([]Buffer(nil), in...)
	return op, nil
}

// Barrier completes when every rank of the group has entered it (torch
// barrier; the Work completes on each rank once all have arrived).
func (pg *ProcessGroup) Barrier(ctx context.Context, opts ...OpOption) *Work {
	if w := pg.precheck(ctx, OpBarrier); w != nil {
		return w
	}
	cfg, b := opSetup(opts)
	return pg.submit(ctx, newOp(b, OpBarrier, 0, 0, 0, -1), cfg)
}

// coalesced wraps children into one OpCoalesced, built in block b (nil: a
// new one). Its fingerprint carries the children's common dtype and
// reduce op (0 when they differ) and the sum of their counts.
func coalesced(b *opBlock, children []*Op) *Op {
	op := newOp(b, OpCoalesced, 0, 0, 0, -1)
	op.Children = children
	var count int64
	for i, c := range children {
		count += c.FP.Count
		if i == 0 {
			op.FP.DType, op.FP.RedOp = c.FP.DType, c.FP.RedOp
			continue
		}
		if c.FP.DType != op.FP.DType {
			op.FP.DType = 0
		}
		if c.FP.RedOp != op.FP.RedOp {
			op.FP.RedOp = 0
		}
	}
	op.FP.Count = count
	op.FP.Shape = combineShapeKeys(children)
	return op
}
