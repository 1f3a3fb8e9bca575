package nccl

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/x448/float16"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cuda"
	"github.com/ranktree/ranktree/comm/internal/enginekit"
)

// injectFault honours cfg.Faults for this rank and op
// (enginekit.InjectFault): hang (the op is never launched and its Work
// waits for Abort), crash (exit 3), error.
func (e *Engine) injectFault(op *comm.Op) (hang bool, err error) {
	return enginekit.InjectFault(&e.cfg, "nccl", op, &e.log)
}

// launch orders c's stream after the callers' streams, enqueues op and
// records the op's end event (launch goroutine only).
func (e *Engine) launch(c *communicator, op *comm.Op) (ev cuda.Event, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &comm.EngineError{Engine: "nccl", Rank: e.cfg.Rank, FP: op.FP, Msg: fmt.Sprintf("internal error: %v", p)}
		}
	}()
	if (op.Type == comm.OpSend || op.Type == comm.OpRecv) && op.Peer == e.cfg.Rank {
		// NCCL needs a send to self matched by a receive in the same
		// group; alone it fails asynchronously (ncclInvalidUsage) and
		// poisons a nonblocking communicator. ProcessGroup refuses it
		// first; this guards callers of the engine itself.
		return 0, &comm.ArgError{Op: op.Type, Group: e.cfg.Group, Rank: e.cfg.Rank,
			Msg: fmt.Sprintf("peer %d is this rank itself: a send to self must be matched by a receive from self in the same batch (BatchP2P)", op.Peer)}
	}
	if s := e.stopped(); s != nil {
		// Stopped meanwhile: an abort may still hold c.mu inside a
		// blocked ncclCommAbort (abortComms).
		return 0, s
	}
	for _, s := range callerStreams(op, nil) {
		if err := e.cu.EventRecord(c.startEv, s); err != nil {
			return 0, e.engErr(op, err)
		}
		if err := e.cu.StreamWaitEvent(c.stream, c.startEv); err != nil {
			return 0, e.engErr(op, err)
		}
	}
	l := &enqueuer{e: e, c: c, s: c.stream}
	c.mu.Lock()
	if c.handle == 0 {
		c.mu.Unlock()
		return 0, e.stoppedOr(&comm.EngineError{Engine: "nccl", Rank: e.cfg.Rank, FP: op.FP, Msg: "communicator was aborted"})
	}
	l.h = c.handle
	err = l.op(op)
	for _, r := range l.redOps {
		_ = e.nc.RedOpDestroy(r, l.h)
	}
	c.mu.Unlock()
	if err != nil {
		return 0, e.engErr(op, err)
	}
	if ev, err = e.event(); err != nil {
		return 0, e.engErr(op, err)
	}
	if err := e.cu.EventRecord(ev, c.stream); err != nil {
		e.evPool = append(e.evPool, ev)
		return 0, e.engErr(op, err)
	}
	return ev, nil
}

// engErr wraps a binding error as a *comm.EngineError for op; errors that
// already carry a comm sentinel of their own (unsupported, invalid) pass.
func (e *Engine) engErr(op *comm.Op, err error) error {
	if s := e.stopped(); s != nil {
		return s
	}
	switch err.(type) {
	case *Error, *cuda.Error:
		return &comm.EngineError{Engine: "nccl", Rank: e.cfg.Rank, FP: op.FP, Msg: err.Error()}
	}
	return err
}

func (e *Engine) stoppedOr(err error) error {
	if s := e.stopped(); s != nil {
		return s
	}
	return err
}

// callerStreams lists the distinct streams of op's buffers.
func callerStreams(op *comm.Op, acc []cuda.Stream) []cuda.Stream {
	add := func(bufs []comm.Buffer) {
		for _, b := range bufs {
			s := cuda.Stream(b.Stream())
			dup := false
			for _, x := range acc {
				if x == s {
					dup = true
					break
				}
			}
			if !dup {
				acc = append(acc, s)
			}
		}
	}
	if op.Type == comm.OpCoalesced {
		for _, ch := range op.Children {
			acc = callerStreams(ch, acc)
		}
		return acc
	}
	add(op.In)
	add(op.Out)
	return acc
}

// enqueuer enqueues the NCCL calls of one op on communicator handle h and
// stream s; c.mu is held.
type enqueuer struct {
	e      *Engine
	c      *communicator
	h      Comm
	s      cuda.Stream
	redOps []RedOp // PreMulSum ops to destroy after the calls
}

// done turns a call's result into an error, waiting out InProgress of the
// nonblocking communicator.
func (l *enqueuer) done(r Result, err error) error {
	if err != nil {
		return err
	}
	if r == InProgress {
		r, err = l.c.waitIdle(l.e.nc, l.e.abortCh)
		if err != nil {
			return err
		}
		if r != Success {
			return &Error{Call: "ncclCommGetAsyncError", Code: r, Msg: l.e.nc.ErrorString(r), Last: l.e.nc.LastError(l.h)}
		}
	}
	return nil
}

// group runs f between ncclGroupStart and ncclGroupEnd (GroupEnd runs even
// if f fails, as NCCL requires).
func (l *enqueuer) group(f func() error) error {
	if err := l.e.nc.GroupStart(); err != nil {
		return err
	}
	ferr := f()
	gerr := l.done(l.e.nc.GroupEnd())
	if ferr != nil {
		return ferr
	}
	return gerr
}

func ptr(b comm.Buffer) cuda.DevicePtr { return cuda.DevicePtr(b.DevicePtr()) }

// op enqueues one op (a Coalesced op as one NCCL group): it resolves the
// NCCL data type and hands the op to the enqueue step of its kind.
func (l *enqueuer) op(op *comm.Op) error {
	switch op.Type {
	case comm.OpCoalesced:
		return l.group(func() error {
			for _, ch := range op.Children {
				if err := l.op(ch); err != nil {
					return err
				}
			}
			return nil
		})
	case comm.OpBarrier:
		// c10d's NCCL barrier: an allreduce of one element.
		return l.done(l.e.nc.AllReduce(l.c.scratch, l.c.scratch, 1, Float32, Sum, l.h, l.s))
	}
	if opDType(op).IsComplex() {
		op = viewAsReal(op)
	}
	dt, err := l.dtype(op)
	if err != nil {
		return err
	}
	switch op.Type {
	case comm.OpAllReduce, comm.OpReduce, comm.OpReduceScatter, comm.OpReduceScatterV:
		return l.reduction(op, dt)
	case comm.OpBroadcast, comm.OpAllGather, comm.OpAllGatherV:
		return l.broadcastLike(op, dt)
	case comm.OpAllToAll:
		return l.allToAll(op, dt)
	case comm.OpGather:
		return l.gather(op, dt)
	case comm.OpScatter:
		return l.scatter(op, dt)
	case comm.OpSend:
		b := op.In[0]
		return l.done(l.e.nc.Send(ptr(b), b.Len(), dt, op.Peer, l.h, l.s))
	case comm.OpRecv:
		b := op.Out[0]
		return l.done(l.e.nc.Recv(ptr(b), b.Len(), dt, op.Peer, l.h, l.s))
	}
	return fmt.Errorf("%w: nccl engine: op %v", comm.ErrUnsupported, op.Type)
}

// reduction enqueues the ops that take a reduction: allreduce (in place),
// reduce (into the root's buffer), reduce-scatter (one call for a single
// input, else grouped reduces) and reduce-scatter-v.
func (l *enqueuer) reduction(op *comm.Op, dt DataType) error {
	red, err := l.redOp(op, dt)
	if err != nil {
		return err
	}
	nc, h, s := l.e.nc, l.h, l.s
	switch op.Type {
	case comm.OpAllReduce:
		b := op.In[0]
		return l.done(nc.AllReduce(ptr(b), ptr(b), b.Len(), dt, red, h, s))
	case comm.OpReduce:
		b := op.In[0]
		var recv cuda.DevicePtr
		if l.e.cfg.Rank == op.Root {
			recv = ptr(b)
		}
		return l.done(nc.Reduce(ptr(b), recv, b.Len(), dt, red, op.Root, h, s))
	case comm.OpReduceScatter:
		c := op.Out[0].Len()
		if len(op.In) == 1 {
			return l.done(nc.ReduceScatter(ptr(op.In[0]), ptr(op.Out[0]), c, dt, red, h, s))
		}
		return l.reduceEach(op, dt, red, nil, c)
	default: // comm.OpReduceScatterV
		return l.reduceEach(op, dt, red, op.RecvCounts, 0)
	}
}

// broadcastLike enqueues broadcast (in place) and the all-gathers (one
// call for a single output, else grouped broadcasts).
func (l *enqueuer) broadcastLike(op *comm.Op, dt DataType) error {
	switch op.Type {
	case comm.OpBroadcast:
		b := op.In[0]
		return l.done(l.e.nc.Broadcast(ptr(b), ptr(b), b.Len(), dt, op.Root, l.h, l.s))
	case comm.OpAllGather:
		c := op.In[0].Len()
		if len(op.Out) == 1 {
			return l.done(l.e.nc.AllGather(ptr(op.In[0]), ptr(op.Out[0]), c, dt, l.h, l.s))
		}
		return l.bcastEach(op, dt, nil, c)
	default: // comm.OpAllGatherV
		return l.bcastEach(op, dt, op.RecvCounts, 0)
	}
}

// allToAll enqueues an all-to-all (equal or per-peer counts) as one group
// of sends and receives.
func (l *enqueuer) allToAll(op *comm.Op, dt DataType) error {
	n := l.e.cfg.Size
	sc, rc := op.SendCounts, op.RecvCounts
	sper, rper := 0, 0
	if sc == nil {
		sper = enginekit.TotalLen(op.In) / n
	}
	if rc == nil {
		rper = enginekit.TotalLen(op.Out) / n
	}
	return l.group(func() error {
		for i := 0; i < n; i++ {
			sb := comm.Chunk(op.In, i, sc, sper)
			rb := comm.Chunk(op.Out, i, rc, rper)
			if err := l.done(l.e.nc.Send(ptr(sb), sb.Len(), dt, i, l.h, l.s)); err != nil {
				return err
			}
			if err := l.done(l.e.nc.Recv(ptr(rb), rb.Len(), dt, i, l.h, l.s)); err != nil {
				return err
			}
		}
		return nil
	})
}

// gather enqueues a gather as one group: every rank sends to the root,
// which receives chunk i from rank i.
func (l *enqueuer) gather(op *comm.Op, dt DataType) error {
	c := op.In[0].Len()
	return l.group(func() error {
		if err := l.done(l.e.nc.Send(ptr(op.In[0]), c, dt, op.Root, l.h, l.s)); err != nil {
			return err
		}
		if l.e.cfg.Rank != op.Root {
			return nil
		}
		for i := 0; i < l.e.cfg.Size; i++ {
			rb := comm.Chunk(op.Out, i, nil, c)
			if err := l.done(l.e.nc.Recv(ptr(rb), c, dt, i, l.h, l.s)); err != nil {
				return err
			}
		}
		return nil
	})
}

// scatter enqueues a scatter as one group: the root sends chunk i to rank
// i, and every rank receives its chunk.
func (l *enqueuer) scatter(op *comm.Op, dt DataType) error {
	c := op.Out[0].Len()
	return l.group(func() error {
		if l.e.cfg.Rank == op.Root {
			for i := 0; i < l.e.cfg.Size; i++ {
				sb := comm.Chunk(op.In, i, nil, c)
				if err := l.done(l.e.nc.Send(ptr(sb), c, dt, i, l.h, l.s)); err != nil {
					return err
				}
			}
		}
		return l.done(l.e.nc.Recv(ptr(op.Out[0]), c, dt, op.Root, l.h, l.s))
	})
}

// bcastEach runs an all-gather into n output chunks as n grouped
// broadcasts, root i sending its input into chunk i (counts nil: per each).
func (l *enqueuer) bcastEach(op *comm.Op, dt DataType, counts []int, per int) error {
	rank, n := l.e.cfg.Rank, l.e.cfg.Size
	return l.group(func() error {
		for i := 0; i < n; i++ {
			dst := comm.Chunk(op.Out, i, counts, per)
			src := dst
			if i == rank {
				src = op.In[0]
			}
			if err := l.done(l.e.nc.Broadcast(ptr(src), ptr(dst), dst.Len(), dt, i, l.h, l.s)); err != nil {
				return err
			}
		}
		return nil
	})
}

// reduceEach runs a reduce-scatter from n input chunks as n grouped
// reduces, chunk i reduced to root i (into Out[0] on that rank).
func (l *enqueuer) reduceEach(op *comm.Op, dt DataType, red RedOp, counts []int, per int) error {
	rank, n := l.e.cfg.Rank, l.e.cfg.Size
	return l.group(func() error {
		for i := 0; i < n; i++ {
			src := comm.Chunk(op.In, i, counts, per)
			var recv cuda.DevicePtr
			if i == rank {
				recv = ptr(op.Out[0])
			}
			if err := l.done(l.e.nc.Reduce(ptr(src), recv, src.Len(), dt, red, i, l.h, l.s)); err != nil {
				return err
			}
		}
		return nil
	})
}

// opDType is the dtype of op's elements (from its first buffer).
func opDType(op *comm.Op) comm.DType {
	switch {
	case len(op.In) > 0:
		return op.In[0].DType()
	case len(op.Out) > 0:
		return op.Out[0].DType()
	}
	return op.FP.DType
}

// dtype is the NCCL type of op's elements (from its first buffer).
func (l *enqueuer) dtype(op *comm.Op) (DataType, error) {
	return DataTypeOf(opDType(op))
}

// viewAsReal returns a copy of op (not a Coalesced one) whose complex
// buffers are viewed as real pairs: each buffer of n complex64 (complex128)
// elements becomes 2n float32 (float64) elements at the same address, and
// split or V-variant counts double. NCCL has no complex types; this is
// what c10d's ProcessGroupNCCL gets from torch.view_as_real. It is exact
// for the ops ProcessGroup allows on complex dtypes: data movement, and
// Sum, Avg and PreMulSum with a real factor, which act on each part alone.
func viewAsReal(op *comm.Op) *comm.Op {
	v := *op
	v.In = realBufs(op.In)
	v.Out = realBufs(op.Out)
	v.SendCounts = doubled(op.SendCounts)
	v.RecvCounts = doubled(op.RecvCounts)
	return &v
}

func realBufs(bufs []comm.Buffer) []comm.Buffer {
	if bufs == nil {
		return nil
	}
	out := make([]comm.Buffer, len(bufs))
	for i, b := range bufs {
		out[i] = b
		if b.DType().IsComplex() {
			out[i] = comm.DeviceBuffer(b.DevicePtr(), 2*b.Len(), b.DType().Real(), b.Device(), b.Stream())
		}
	}
	return out
}

func doubled(counts []int) []int {
	if counts == nil {
		return nil
	}
	out := make([]int, len(counts))
	for i, c := range counts {
		out[i] = 2 * c
	}
	return out
}

// redOp maps op's reduction to NCCL, as c10d's getNcclReduceOp: bool Sum
// runs as Max and Product as Min; Avg is ncclAvg; PreMulSum is a
// ncclRedOpCreatePreMulSum op; bitwise ops are unsupported by NCCL.
func (l *enqueuer) redOp(op *comm.Op, ndt DataType) (RedOp, error) {
	var dt comm.DType
	if len(op.In) > 0 {
		dt = op.In[0].DType()
	}
	ro := op.Reduce.ForDType(dt)
	switch ro.Type() {
	case comm.RedSum:
		return Sum, nil
	case comm.RedProduct:
		return Prod, nil
	case comm.RedMin:
		return Min, nil
	case comm.RedMax:
		return Max, nil
	case comm.RedAvg:
		if l.e.nc.Version() < 21000 {
			return 0, fmt.Errorf("%w: ReduceOp.AVG needs NCCL 2.10+ (loaded %s)", comm.ErrUnsupported, VersionString(l.e.nc.Version()))
		}
		return Avg, nil
	case comm.RedPreMulSum:
		scalar, err := scalarBytes(dt, ro.Factor())
		if err != nil {
			return 0, err
		}
		r, err := l.e.nc.RedOpCreatePreMulSum(unsafe.Pointer(&scalar[0]), ndt, ScalarHostImmediate, l.h)
		if err != nil {
			return 0, err
		}
		l.redOps = append(l.redOps, r)
		return r, nil
	}
	return 0, fmt.Errorf("%w: Cannot use ReduceOp.%s with NCCL", comm.ErrUnsupported, ro.Type())
}

// scalarBytes encodes factor as one element of dt (a floating type).
func scalarBytes(dt comm.DType, factor float64) ([]byte, error) {
	b := make([]byte, 8)
	switch dt {
	case comm.Float64:
		*(*float64)(unsafe.Pointer(&b[0])) = factor
	case comm.Float32:
		*(*float32)(unsafe.Pointer(&b[0])) = float32(factor)
	case comm.Float16:
		*(*uint16)(unsafe.Pointer(&b[0])) = float16.Fromfloat32(float32(factor)).Bits()
	case comm.BFloat16:
		*(*uint16)(unsafe.Pointer(&b[0])) = uint16(comm.BFloat16FromFloat32(float32(factor)))
	default:
		return nil, fmt.Errorf("%w: PreMulSum needs a floating dtype, got %v", comm.ErrInvalidArgument, dt)
	}
	if math.IsNaN(factor) || math.IsInf(factor, 0) {
		return nil, fmt.Errorf("%w: PreMulSum factor %v is not finite", comm.ErrInvalidArgument, factor)
	}
	return b, nil
}
