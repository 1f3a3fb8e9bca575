package comm

import (
	"fmt"
	"time"
)

// OpType names a collective or point-to-point operation, with the c10d
// OpType spelling in String ("ALLREDUCE", "BROADCAST", ...).
type OpType uint8

// Operation kinds as they reach an engine. List forms, object collectives and
// V-variants are lowered by ProcessGroup to these.
const (
	OpAllReduce OpType = iota + 1
	OpBroadcast
	OpReduce
	OpAllGather     // equal counts; see Op for the buffer forms
	OpAllGatherV    // per-rank counts in Op.RecvCounts
	OpReduceScatter // equal counts
	OpReduceScatterV
	OpAllToAll // Op.SendCounts / Op.RecvCounts give the splits
	OpGather
	OpScatter
	OpBarrier
	OpSend
	OpRecv
	OpCoalesced // Op.Children run as one unit, one Work (coalescing, BatchP2P)
)

var opNames = [...]string{"INVALID", "ALLREDUCE", "BROADCAST", "REDUCE", "ALLGATHER", "ALLGATHER_V",
	"REDUCE_SCATTER", "REDUCE_SCATTER_V", "ALLTOALL", "GATHER", "SCATTER", "BARRIER", "SEND", "RECV", "COALESCED"}

var opTitles = [...]string{"Invalid", "AllReduce", "Broadcast", "Reduce", "AllGather", "AllGatherV",
	"ReduceScatter", "ReduceScatterV", "AllToAll", "Gather", "Scatter", "Barrier", "Send", "Recv", "Coalesced"}

// String is c10d's OpType name, e.g. "ALLREDUCE".
func (t OpType) String() string {
	if t < OpAllReduce || t > OpCoalesced {
		return fmt.Sprintf("OP(%d)", uint8(t))
	}
	return opNames[t]
}

// Title is the Go-style name used in messages, e.g. "AllReduce".
func (t OpType) Title() string {
	if t < OpAllReduce || t > OpCoalesced {
		return fmt.Sprintf("Op(%d)", uint8(t))
	}
	return opTitles[t]
}

// IsP2P reports whether t is Send or Recv (which use the P2P sequence).
func (t OpType) IsP2P() bool { return t == OpSend || t == OpRecv }

// IsRooted reports whether t is a collective with a root: Broadcast,
// Reduce, Gather or Scatter.
func (t OpType) IsRooted() bool {
	return t == OpBroadcast || t == OpReduce || t == OpGather || t == OpScatter
}

// AnySource as Op.Peer of a Recv receives from whichever rank sends first
// (torch.distributed.recv with src=None).
const AnySource = -1

// Op is the descriptor of one operation as the communicator actor hands it
// to a Backend. Ranks are group ranks. Counts are in elements.
//
// Buffer forms (c is the per-rank count, n the group size):
//   - AllReduce, Broadcast, Reduce: In[0], in place. Reduce leaves non-root buffers unchanged.
//   - AllGather: In[0] (c); Out is one buffer of n·c or n buffers of c.
//   - AllGatherV: In[0] (RecvCounts[rank]); Out is one buffer of sum(RecvCounts) or n buffers.
//   - ReduceScatter: In is one buffer of n·c or n buffers of c; Out[0] (c).
//   - ReduceScatterV: like ReduceScatter with RecvCounts[i] the count of rank i's chunk.
//   - AllToAll: In with SendCounts[i] elements for rank i, Out with RecvCounts[i]
//     from rank i; each either one flat buffer or n buffers.
//   - Gather: In[0]; on the root Out is one buffer of n·c or n buffers (nil elsewhere).
//   - Scatter: on the root In is one buffer of n·c or n buffers (nil elsewhere); Out[0].
//   - Barrier: no buffers.
//   - Send: In[0] to Peer with Tag. Recv: Out[0] from Peer (or AnySource) with Tag.
//   - Coalesced: Children, executed in order as one unit.
type Op struct {
	FP         Fingerprint
	Type       OpType
	Reduce     ReduceOp // for reductions; already mapped with ForDType
	Root       int      // group rank of the root, for rooted ops
	Peer       int      // group rank of the peer for Send/Recv, or AnySource
	Tag        int      // user tag for Send/Recv
	In, Out    []Buffer
	SendCounts []int // AllToAll
	RecvCounts []int // AllGatherV, ReduceScatterV, AllToAll
	Children   []*Op // Coalesced
	Timeout    time.Duration

	// one backs a single-buffer In (setIn), allocated (or recycled) with
	// the Op; a blocking op's block also backs a single-buffer Out
	// (setOut, pooledBlock).
	one [1]Buffer

	// promise is the unused Promise allocated (or recycled) with the Op
	// by a ProcessGroup's lowering (newOp), for submit to take; nil for
	// an Op built elsewhere.
	promise *Promise
}

// SetIdentity stamps op's fingerprint, and its children's at every depth,
// with the op's identity: group hash (GroupHash), epoch and sequence
// number; a Coalesced op's children carry their parent's identity, so that
// their messages are tagged with it. The group's communicator actor
// (actors.Communicator) is its one caller, when it assigns the seq: engines
// receive ops already stamped and never stamp them again.
func (op *Op) SetIdentity(group uint64, epoch uint32, seq uint64) {
	op.FP.Group, op.FP.Epoch, op.FP.Seq = group, epoch, seq
	for _, c := range op.Children {
		c.SetIdentity(group, epoch, seq)
	}
}

// setIn sets In to the one buffer b without a second allocation.
func (op *Op) setIn(b Buffer) {
	op.one[0] = b
	op.In = op.one[:]
}

// setOut sets Out to the one buffer b: without a second allocation in a
// blocking op's block (pooledBlock), in a slice of its own otherwise (an
// async op's block stays within 512 bytes).
func (op *Op) setOut(b Buffer) {
	if op.promise != nil && op.promise.blk != nil {
		pb := op.promise.blk
		pb.out[0] = b
		op.Out = pb.out[:]
		return
	}
	op.Out = []Buffer{b}
}

// Chunk returns piece i of a list-or-flat buffer set: bufs[i] when there
// are several buffers, else the slice of bufs[0] at counts' prefix sum (or
// i·per if counts is nil).
func Chunk(bufs []Buffer, i int, counts []int, per int) Buffer {
	if len(bufs) > 1 {
		return bufs[i]
	}
	if counts == nil {
		return bufs[0].Slice(i*per, per)
	}
	off := 0
	for j := 0; j < i; j++ {
		off += counts[j]
	}
	return bufs[0].Slice(off, counts[i])
}

// Fingerprint identifies one op across ranks: every message of the op
// carries it, and a rank that receives a different one fails with
// ErrMismatch. Group is a 64-bit hash of the group's name (GroupHash).
type Fingerprint struct {
	Group uint64
	Epoch uint32
	Seq   uint64 // collective seq, or the P2P seq for Send/Recv
	Op    OpType
	DType DType
	RedOp RedOpType
	Count int64 // elements per rank (In[0] for most ops)
	Root  int32 // root for rooted ops, peer for P2P, else -1
	// Shape is the shape of the buffer Count counts (Buffer.WithShape), 0
	// for none or 1-D, and for the ops whose per-rank sizes legitimately
	// differ (V-variants, all-to-all, Send/Recv), which carry none.
	Shape ShapeKey
}

// String reads like "seq 7 AllReduce(float32×1024)",
// "seq 7 Broadcast(float32×1024, root 0)" or, for an all-to-all (whose
// fingerprint carries no count: per-rank totals legitimately differ),
// "seq 7 AllToAll(float32, split sizes per rank)". A coalesced op of
// several dtypes reads "Coalesced(mixed dtypes×12)". A shape follows the
// count: "seq 7 AllReduce(float32×12 [3, 4], sum)" (a shape too long to
// pack prints as a hash, "[#1f2e…]", and so do a coalesced op's children's
// shapes combined).
func (f Fingerprint) String() string {
	dt := f.DType.String()
	if f.Op == OpCoalesced && f.DType == 0 {
		dt = "mixed dtypes"
	}
	args := fmt.Sprintf("%s×%d", dt, f.Count)
	if f.Shape != 0 {
		args += " " + f.Shape.format(f.Count)
	}
	switch f.Op {
	case OpAllToAll:
		if f.Count == 0 {
			args = dt + ", split sizes per rank"
		}
	case OpBroadcast, OpReduce, OpGather, OpScatter:
		args += fmt.Sprintf(", root %d", f.Root)
	case OpSend, OpRecv:
		args += fmt.Sprintf(", peer %d", f.Root)
	case OpBarrier:
		args = ""
	}
	if f.RedOp != 0 && (f.Op == OpAllReduce || f.Op == OpReduce || f.Op == OpReduceScatter || f.Op == OpReduceScatterV) {
		args += ", " + f.RedOp.String()
	}
	return fmt.Sprintf("seq %d %s(%s)", f.Seq, f.Op.Title(), args)
}

// GroupHash is the 64-bit FNV-1a hash of a group name, used as Fingerprint.Group.
func GroupHash(name string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= 1099511628211
	}
	return h
}

// OpConfig holds per-op settings gathered from OpOptions.
type OpConfig struct {
	// Timeout overrides the group's timeout for this op (0: the group's).
	Timeout time.Duration
	// Blocking makes the ProcessGroup method wait for the op and return a
	// completed Work (Blocking).
	Blocking bool
}

// OpOption is one per-op setting of a ProcessGroup call, made by
// WithOpTimeout or Blocking; later options override earlier ones of the
// same kind, and the zero OpOption sets nothing. It is a small value
// rather than a func, as functional options usually are, so that passing
// options to an op allocates nothing: an option func would make the
// OpConfig it fills escape to the heap on every call.
type OpOption struct {
	kind    optKind
	timeout time.Duration
}

// optKind says which setting an OpOption carries.
type optKind uint8

const (
	optNone optKind = iota
	optTimeout
	optBlocking
)

// WithOpTimeout overrides the group timeout for one op (c10d: the timeout
// argument of a collective; here it also bounds P2P).
func WithOpTimeout(d time.Duration) OpOption { return OpOption{kind: optTimeout, timeout: d} }

// Blocking makes a ProcessGroup method run its op to completion before it
// returns, as torch.distributed's collectives do with async_op=False
// (their default): the method submits the op, waits for it with the ctx
// it was given, exactly as Work.Wait(ctx) on the returned Work of the
// async form would, and returns a completed Work. Its Err is what that
// Wait would have returned:
//   - success: a shared, read-only Work, already completed without error
//     (the same *Work for every blocking op of a type): its OpType is the
//     op's, but its Seq is 0, its Fingerprint zero and its Timings zero,
//     not the op's;
//   - the op failed: the op's own Work, with its error, Seq, Fingerprint
//     and Timings;
//   - ctx ended first: a Work failed with ctx's error, as Wait returns it;
//     the op itself stays in flight under the communicator and the
//     watchdog, as after an async op's Wait(ctx) returns early (a
//     cancelled ctx aborts the communicator and fails the op with a
//     *CanceledError; a ctx deadline is the op's timeout).
//
// The op's timeout, ctx and error semantics are those of the async form.
// Since no handle to the op's own Work is given out on success, the
// runtime recycles the memory of the op's descriptor and Work: a small
// blocking op allocates nothing in steady state, where the async form
// allocates one block per op (docs/semantics.md, "Blocking ops").
func Blocking() OpOption { return OpOption{kind: optBlocking} }

// ApplyOpOptions folds opts into an OpConfig, in order. It allocates
// nothing.
func ApplyOpOptions(opts []OpOption) OpConfig {
	var c OpConfig
	for _, o := range opts {
		switch o.kind {
		case optTimeout:
			c.Timeout = o.timeout
		case optBlocking:
			c.Blocking = true
		}
	}
	return c
}
