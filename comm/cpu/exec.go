package cpu

import (
	"errors"
	"fmt"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu/kernel"
	"github.com/ranktree/ranktree/comm/cpu/transport"
	"github.com/ranktree/ranktree/comm/internal/enginekit"
)

// exec runs one op (not Coalesced) on the mesh, with the agreement step
// its kind needs (agree.go): before the data of a rooted collective, after
// the data of one whose per-rank sizes the fingerprint does not fix.
func (e *Engine) exec(op *comm.Op, pr *comm.Promise) error {
	e.mesh.Begin(opContext(op))
	if e.mesh.Size() == 1 {
		return e.execData(op, pr)
	}
	switch {
	case op.Type == comm.OpBroadcast && e.useSlots(op.In[0].Len()*op.In[0].DType().Size()):
		// Its slots carry every rank's fingerprint: no agreement first.
		return e.execData(op, pr)
	case op.Type.IsRooted():
		if err := agreeDissemination(e.mesh); err != nil {
			return err
		}
		return e.execData(op, pr)
	case op.Type == comm.OpAllGatherV || op.Type == comm.OpReduceScatterV ||
		op.Type == comm.OpAllToAll && (op.SendCounts != nil || op.RecvCounts != nil):
		if err := e.execData(op, pr); err != nil {
			return err
		}
		return agreeDissemination(e.mesh)
	}
	return e.execData(op, pr)
}

// execData moves one op's data. It is the only place that knows the
// buffer forms of comm.Op; the algorithms see byte blocks.
func (e *Engine) execData(op *comm.Op, pr *comm.Promise) error {
	m := e.mesh
	n, r := m.Size(), m.Rank()
	switch op.Type {
	case comm.OpAllReduce:
		return e.allReduce(op)
	case comm.OpBroadcast:
		buf := op.In[0].Bytes()
		if e.useBroadcastCMA(len(buf)) {
			err := broadcastCMA(m, buf, op.Root, &e.cma)
			if !errors.Is(err, errCMAFailed) {
				return err
			}
			// Every rank saw the failure and checked every rank's
			// fingerprint (broadcastCMA): all move this op's data
			// another way, with no agreement first, and from now on.
			e.noCMA(err)
		}
		if e.useFlat(len(buf)) {
			return broadcastFlat(m, buf, op.Root)
		}
		if e.useSlotBroadcast(len(buf)) {
			return broadcastSlots(m, buf, op.Root, e.opts.SlotBytes)
		}
		if n > 2 && len(buf) >= e.opts.RingThreshold {
			if e.useChain(len(buf)) {
				return broadcastChain(m, buf, op.Root)
			}
			return broadcastScatterAllGather(m, buf, op.Root)
		}
		return broadcastTree(m, buf, op.Root)
	case comm.OpReduce:
		return e.reduce(op)
	case comm.OpAllGather, comm.OpAllGatherV:
		in := op.In[0]
		var counts []int
		if op.Type == comm.OpAllGatherV {
			counts = op.RecvCounts
		}
		blocks := e.blockList(n)
		for i := range n {
			blocks[i] = comm.Chunk(op.Out, i, counts, in.Len()).Bytes()
		}
		defer clear(blocks) // keep no reference to the caller's buffers
		total := n * len(blocks[r])
		if op.Type == comm.OpAllGather && e.useCMA(total) {
			err := allgatherCMA(m, blocks, in.Bytes(), &e.cma)
			if !errors.Is(err, errCMAFailed) {
				return err
			}
			// Every rank saw the failure (allgatherCMA), its own block
			// copied: all move this op's data through the rings and use
			// them from now on.
			e.noCMA(err)
		} else {
			copy(blocks[r], in.Bytes())
			if op.Type == comm.OpAllGather && (e.useFlat(total) || e.useFlatRounds(total)) {
				return allgatherFlat(m, blocks, e.allgatherPiece(total))
			}
		}
		if e.useBruck(blocks) {
			return allgatherBruck(m, blocks, e.scratch(bruckScratch(blocks)))
		}
		return ringAllGather(m, blocks, 0)
	case comm.OpReduceScatter, comm.OpReduceScatterV:
		return e.reduceScatter(op)
	case comm.OpAllToAll:
		send, recv := make([][]byte, n), make([][]byte, n)
		sc, rc := op.SendCounts, op.RecvCounts
		sper, rper := 0, 0
		if sc == nil {
			sper = enginekit.TotalLen(op.In) / n
		}
		if rc == nil {
			rper = enginekit.TotalLen(op.Out) / n
		}
		for i := range n {
			send[i] = comm.Chunk(op.In, i, sc, sper).Bytes()
			recv[i] = comm.Chunk(op.Out, i, rc, rper).Bytes()
		}
		return alltoallPairwise(m, send, recv)
	case comm.OpGather:
		in := op.In[0]
		var out [][]byte
		if r == op.Root {
			out = make([][]byte, n)
			for i := range n {
				out[i] = comm.Chunk(op.Out, i, nil, in.Len()).Bytes()
			}
		}
		return gatherLinear(m, in.Bytes(), out, op.Root)
	case comm.OpScatter:
		out := op.Out[0]
		var in [][]byte
		if r == op.Root {
			in = make([][]byte, n)
			for i := range n {
				in[i] = comm.Chunk(op.In, i, nil, out.Len()).Bytes()
			}
		}
		return scatterLinear(m, in, out.Bytes(), op.Root)
	case comm.OpBarrier:
		return barrierDissemination(m)
	case comm.OpSend:
		if err := m.SendP2P(op.Peer, op.In[0].Bytes()); err != nil {
			return err
		}
		return m.Flush()
	case comm.OpRecv:
		src, err := m.RecvP2P(op.Peer, op.Out[0].Bytes())
		if err != nil {
			return err
		}
		pr.SetSource(src)
		return nil
	}
	return &comm.EngineError{Engine: "cpu", Rank: r, FP: op.FP, Msg: fmt.Sprintf("op %v is not supported by the cpu engine", op.Type)}
}

// execCoalesced runs op's children as one unit. When every child is a Send
// or Recv (BatchP2P), all sends are queued before any receive waits, so
// that a batch is deadlock-free whatever order the ranks listed it in (as
// ncclGroupStart/End), and sends to self are copied into their paired
// receives from self (comm.SelfPairs); otherwise children run in order.
func (e *Engine) execCoalesced(op *comm.Op, pr *comm.Promise) error {
	// Children carry the parent's identity (comm.Op.SetIdentity, by the
	// communicator actor): their messages are tagged with it.
	allP2P := true
	children := op.Children
	for _, c := range children {
		if !c.Type.IsP2P() {
			allP2P = false
		}
	}
	if !allP2P {
		was := e.inCoalesced
		e.inCoalesced = true
		defer func() { e.inCoalesced = was }()
		for _, c := range children {
			var err error
			if c.Type == comm.OpCoalesced {
				err = e.execCoalesced(c, pr)
			} else {
				err = e.exec(c, pr)
			}
			if err != nil {
				return err
			}
		}
		// Each child was checked on its own; a closing agreement over the
		// parent's fingerprint (total count) makes sure that every rank
		// coalesced the same ops, not only a common prefix of them.
		e.mesh.Begin(opContext(op))
		if e.mesh.Size() > 1 {
			return agreeDissemination(e.mesh)
		}
		return nil
	}
	m := e.mesh
	pairs, err := e.selfPairs(children)
	if err != nil {
		return err
	}
	for _, c := range children {
		if c.Type == comm.OpSend && c.Peer != m.Rank() {
			m.Begin(opContext(c))
			if err := m.SendP2P(c.Peer, c.In[0].Bytes()); err != nil {
				return err
			}
		}
	}
	// A send to self pairs with a receive from self of the same batch
	// (NCCL allows both inside a group): a copy, no message.
	for _, p := range pairs {
		copy(children[p[1]].Out[0].Bytes(), children[p[0]].In[0].Bytes())
	}
	for _, c := range children {
		if c.Type == comm.OpRecv && c.Peer != m.Rank() {
			m.Begin(opContext(c))
			src, err := m.RecvP2P(c.Peer, c.Out[0].Bytes())
			if err != nil {
				return err
			}
			pr.SetSource(src)
		}
	}
	return m.Flush()
}

func opContext(op *comm.Op) transport.OpCtx {
	o := transport.OpCtx{FP: op.FP, Red: op.Reduce, Tag: int64(op.Tag)}
	switch {
	case len(op.In) > 0:
		o.DType = op.In[0].DType()
	case len(op.Out) > 0:
		o.DType = op.Out[0].DType()
	default:
		o.DType = op.FP.DType
	}
	if o.DType.Valid() {
		o.Red = o.Red.ForDType(o.DType)
	}
	return o
}

// preScale applies PreMulSum's factor before the sum.
func preScale(buf []byte, dt comm.DType, red comm.ReduceOp) error {
	if red.Type() == comm.RedPreMulSum && len(buf) > 0 {
		return kernel.Scale(buf, dt, red.Factor())
	}
	return nil
}

// postScale divides by n for Avg after the sum.
func postScale(buf []byte, dt comm.DType, red comm.ReduceOp, n int) error {
	if red.Type() == comm.RedAvg && n > 1 && len(buf) > 0 {
		return kernel.Scale(buf, dt, 1/float64(n))
	}
	return nil
}

func (e *Engine) allReduce(op *comm.Op) error {
	m := e.mesh
	b := op.In[0]
	buf, dt, red := b.Bytes(), b.DType(), m.Cur.Red
	if err := preScale(buf, dt, red); err != nil {
		return err
	}
	var err error
	if e.useFlat(len(buf)) {
		err = allreduceFlat(m, buf)
	} else if e.useSlotAllReduce(len(buf)) {
		err = allreduceSlots(m, buf, dt.Size(), e.opts.SlotBytes)
	} else if e.useRing(len(buf), b.Len()) {
		blocks := make([][]byte, m.Size())
		for i := range m.Size() {
			lo, hi := split(b.Len(), m.Size(), i)
			blocks[i] = buf[lo*dt.Size() : hi*dt.Size()]
		}
		err = allreduceRing(m, blocks, dt.Size(), e.ringOptions(len(buf)))
	} else {
		err = allreduceRecDoubling(m, buf, e.scratch(len(buf)))
	}
	if err != nil {
		return err
	}
	return postScale(buf, dt, red, m.Size())
}

// useFlat selects the one-step shared-memory algorithms (allreduce_flat.go)
// for an op that moves nbytes per slot: the group has a group segment
// (every rank on this host over shm, 2..8 ranks), nbytes is at most
// Options.FlatThreshold and below Options.RingThreshold, and the op is
// not a child of a Coalesced op (whose children share one seq, which the
// mismatch checks of transport/mesh_flat.go order ops by). Every input is in the
// fingerprint or the same on every rank, so every rank that launched the
// same op chooses alike.
func (e *Engine) useFlat(nbytes int) bool {
	return e.grp != nil && !e.inCoalesced && nbytes <= e.opts.FlatThreshold && nbytes < e.opts.RingThreshold
}

// useSlotAllReduce selects the slots in rounds of Options.SlotBytes
// (allreduceSlots) for an allreduce of nbytes among three or more ranks
// on this host that the one-step allreduce (useFlat, checked first) does
// not take, up to Options.SlotAllReduceMax. Every input is the same on
// every rank that launched the same op, so all choose alike.
func (e *Engine) useSlotAllReduce(nbytes int) bool {
	return e.grp != nil && !e.inCoalesced && e.mesh.Size() > 2 && e.opts.FlatThreshold > 0 &&
		nbytes <= e.opts.SlotAllReduceMax
}

// useSlotBroadcast selects the slots, in rounds of Options.SlotBytes,
// for a broadcast of nbytes among three or more ranks (broadcastSlots):
// from e.slotBroadcastMin (slotBroadcastMinFor) up, where the group
// segment exists and the one-step broadcast (useFlat, checked first) does
// not take it. With two ranks the pair's ring copies as much (once in,
// once out).
func (e *Engine) useSlotBroadcast(nbytes int) bool {
	return e.grp != nil && !e.inCoalesced && e.mesh.Size() > 2 && nbytes >= e.slotBroadcastMin
}

// useSlots reports whether a broadcast of nbytes goes through the
// slots: in one step, in rounds, or to set up the single copy.
func (e *Engine) useSlots(nbytes int) bool {
	return e.useFlat(nbytes) || e.useSlotBroadcast(nbytes) || e.useBroadcastCMA(nbytes)
}

// slotBroadcastMinFor is the smallest broadcast among n ranks that goes
// through the slots in rounds (useSlotBroadcast), Engine.slotBroadcastMin's
// value. Measured on the 2-core VM, 2026-11-27, 6 rounds × 200 ops, mean
// µs (median over rounds), slots against the algorithm they replace: at
// 3 ranks 256 and 384 KiB took 58 and 78 through the slots (one round:
// nothing overlaps the root's copy with the others') against 37 and 53
// through the chain; at 4 ranks 74 and 76 against 85 and 126 through
// scatter + allgather. More than 4 ranks were not measured (the machine
// has 2 cores) and take 4 ranks' threshold.
func slotBroadcastMinFor(n int) int {
	if n == 3 {
		return 512 << 10
	}
	return 256 << 10
}

// useFlatRounds selects the slots, in rounds of allgatherPiece bytes per
// rank, for an allgather of nbytes gathered among three or more ranks
// that is too large for one round (allgather_flat.go), up to
// flatRoundsMax. With more ranks than cores the ring's n−1 steps each
// hand the CPUs over and it copies 2(n−1)·S bytes in all, the rounds n·S.
// On the 2-core VM, 2026-11-27, two rounds each, mean µs, rounds against
// the ring: 4 ranks 256 KiB 71–78 / 164–222, 1 MiB 171–205 / 334–388,
// 4 MiB 615–650 / 1071–1235, 8 MiB 1783–2120 / 2782–3217; 3 ranks 256 KiB
// 56–107 / 134–137, 1 MiB 169–177 / 269–296, 8 MiB 1694–1874 /
// 2019–2730 (rounds of 128 KiB). With two ranks the ring is one step: it
// keeps it.
func (e *Engine) useFlatRounds(nbytes int) bool {
	return e.grp != nil && !e.inCoalesced && e.mesh.Size() > 2 && e.opts.FlatThreshold > 0 && nbytes <= flatRoundsMax
}

// useCMA selects the single-copy allgather (allgatherCMA) for a gathered
// total of nbytes: between the two ranks of a group on this host over
// shm, from Options.SingleCopyMin, outside the probe's gap (cmaGap),
// until a single-copy read failed on some rank (cmaOff).
func (e *Engine) useCMA(nbytes int) bool {
	return e.grp != nil && !e.inCoalesced && !e.cmaOff && e.mesh.Size() == 2 &&
		e.opts.SingleCopyMin > 0 && nbytes >= e.opts.SingleCopyMin && !e.inCMAGap(nbytes)
}

// inCMAGap reports whether nbytes lies in the sizes the probe found the
// single copy slower at (Engine.cmaGap).
func (e *Engine) inCMAGap(nbytes int) bool {
	return nbytes >= e.cmaGap[0] && nbytes < e.cmaGap[1]
}

// noCMA turns the single-copy transfers off for this group after one
// failed (err, a *cmaError, which every rank returned for the same op).
func (e *Engine) noCMA(err error) {
	e.cmaOff = true
	e.log.Warn().Err(err).Msg("cpu engine: cross-memory attach failed; single-copy transfers off for this group")
}

// useBroadcastCMA selects the single-copy broadcast (broadcastCMA) for
// a broadcast of nbytes among ranks on this host over shm (the group
// segment exists), from e.bcastCMA[0] to e.bcastCMA[1]
// (broadcastCMAWindow: three ranks only) and outside the probe's gap
// (cmaGap), unless cross-memory attach is
// off (Options.SingleCopyMin negative, or a read failed: cmaOff). Every
// input is the same on every rank that launched the same op (cmaOff
// changes on every rank for the same op), so all choose alike.
func (e *Engine) useBroadcastCMA(nbytes int) bool {
	return e.grp != nil && !e.inCoalesced && !e.cmaOff && e.opts.SingleCopyMin > 0 &&
		nbytes >= e.bcastCMA[0] && nbytes <= e.bcastCMA[1] && !e.inCMAGap(nbytes)
}

// broadcastCMAWindow is the range of broadcast sizes, in bytes, that
// take the single copy among n ranks (useBroadcastCMA): 64 KiB to 1 MiB
// with three ranks, none (an empty range) otherwise. Measured on the
// 2-core VM, 2026-11-28, mean µs per op; "before" is what it replaces
// (the one-step broadcast to 128 KiB, then the chain, from 512 KiB the
// slots in rounds; at four ranks scatter + allgather from 256 KiB to
// 1 MiB, where the slots take over).
//
// Three ranks, bench-ab (152 and 147 runs in the near state, median
// over runs), single copy / before: 64 KiB 18.7 / 20.4, 128 KiB 24.6 /
// 33.8, 256 KiB 39.0 / 45.3, 512 KiB 63.5 / 86.6, 1 MiB 115.7 / 127.4.
// Beyond, the kernel's copy (about 9 GB/s here: it pins each 4 KiB page
// of the root's buffer) loses to the chain's, which forwards each piece
// from the cache (3 rounds: 2 MiB 187 / 161, 16 MiB 2508 / 1324).
//
// Four ranks, bench-ab (120 and 110 runs): slower at every size but
// 256 KiB, where it was level, three readers sharing two CPUs and the
// root's pages: 64 KiB 30.4 / 23.3, 256 KiB 62.3 / 62.1, 512 KiB 107.1
// / 96.8, 1 MiB 208.4 / 141.2. Two
// ranks, 3 rounds: the pair's pipelined copy through its rings keeps
// both CPUs busy where a single reader keeps one, 256 KiB 18.2 / 13.9,
// 1 MiB 79.1 / 42.7, 64 MiB 7217 / 3598. More than four ranks were not
// measured (the machine has 2 cores) and do not take it.
//
// Two ranks in two processes may still take it after their probe at
// creation (tune.go): where it beat the rings, from 64 KiB up.
func broadcastCMAWindow(n int) [2]int {
	if n != 3 {
		return [2]int{1, 0}
	}
	return [2]int{64 << 10, 1 << 20}
}

// flatRoundsMax is the largest allgather (bytes gathered) that goes
// through the slots in rounds (useFlatRounds): the largest measured.
const flatRoundsMax = 64 << 20

// allgatherPiece is the round's length per rank of an allgather of
// nbytes gathered through the slots (allgatherFlat): FlatThreshold, and
// from 4 MiB the whole slot (Options.SlotBytes, 1 MiB by default with 3
// ranks or more), whose longer rounds hand the CPUs over less often. On
// the 2-core VM, 2026-11-27, 4 rounds × 30 ops interleaved, mean µs
// (median over rounds), 1 MiB rounds against the build before (128 KiB
// rounds up to 8 MiB, the ring above): 3 ranks 4 MiB 519 / 702, 8 MiB
// 1475 / 1584, 16 MiB 2439 / 3113, 64 MiB 9301 / 14574; 4 ranks 8 MiB
// 1378 / 2019, 16 MiB 3156 / 5434, 64 MiB 11316 / 18869; but 2 MiB 310 /
// 268 (3 ranks) and 361 / 322 (4 ranks).
func (e *Engine) allgatherPiece(nbytes int) int {
	if nbytes >= 4<<20 {
		return e.opts.SlotBytes
	}
	return e.opts.FlatThreshold
}

// useChain selects the pipelined chain broadcast over scatter + allgather
// for a broadcast of nbytes (at least RingThreshold) among three or more
// ranks: only when every link is shared memory (the group segment exists),
// where a middle rank forwards each piece while it is in its cache, and
// from chainMin4 with four ranks or more, where the chain fills only
// after n−1 of the forward's 256 KiB pieces (broadcast_chain.go). On the
// 2-core VM, 2026-11-27, two rounds each, mean µs: 3 ranks 256 KiB 52–57
// against 69–80 for scatter + allgather, 1 MiB 125–195 against 174–205,
// 64 MiB 8.6–9.7 ms against 16.0–16.6; 4 ranks 512 KiB 193–223 against
// 164–185 (the chain slower), 1 MiB 243–263 against 244–298, 64 MiB
// 13.7–14.7 ms against 18.5–19.9.
func (e *Engine) useChain(nbytes int) bool {
	n := e.mesh.Size()
	return e.grp != nil && n > 2 && (n == 3 || nbytes >= chainMin4)
}

// chainMin4 is the smallest broadcast that takes the chain among four
// ranks or more (useChain).
const chainMin4 = 1 << 20

// useRing selects the ring allreduce (bandwidth-optimal) over recursive
// doubling (latency-optimal) by message size: see Options.RingThreshold.
func (e *Engine) useRing(nbytes, count int) bool {
	return e.mesh.Size() > 1 && nbytes >= e.opts.RingThreshold && count >= e.mesh.Size()
}

// useBruck selects Bruck's allgather (ceil(log2 n) steps, but packing
// copies) over the ring (n-1 steps) when the gathered total is below
// RingThreshold/16 (16 KiB by default) and there are more than two ranks
// (with two, both take one step). Measured with 4 ranks on the 2-core VM,
// Bruck's was 20-40% slower than the ring at 64 KiB gathered and about
// as fast at 4 KiB, the ranks sharing cores; the step it saves pays off
// where each rank has a core. Every rank knows every block's size, so all choose
// alike.
func (e *Engine) useBruck(blocks [][]byte) bool {
	if len(blocks) <= 2 {
		return false
	}
	t := 0
	for _, b := range blocks {
		t += len(b)
	}
	return t < e.opts.RingThreshold/16
}

// split is the element range [lo, hi) of part i of count elements in n
// nearly equal parts.
func split(count, n, i int) (lo, hi int) {
	q, rem := count/n, count%n
	lo = i*q + min(i, rem)
	hi = lo + q
	if i < rem {
		hi++
	}
	return lo, hi
}

func (e *Engine) reduce(op *comm.Op) error {
	m := e.mesh
	b := op.In[0]
	dt, red := b.DType(), m.Cur.Red
	buf := b.Bytes()
	if m.Rank() != op.Root {
		// Leave the caller's buffer unchanged on non-roots.
		tmp := e.scratch(len(buf))
		copy(tmp, buf)
		buf = tmp
	}
	if err := preScale(buf, dt, red); err != nil {
		return err
	}
	if err := reduceTree(m, buf, op.Root); err != nil {
		return err
	}
	if m.Rank() == op.Root {
		return postScale(buf, dt, red, m.Size())
	}
	return nil
}

func (e *Engine) reduceScatter(op *comm.Op) error {
	m := e.mesh
	out := op.Out[0]
	dt, red := out.DType(), m.Cur.Red
	var counts []int
	if op.Type == comm.OpReduceScatterV {
		counts = op.RecvCounts
	}
	if op.Type == comm.OpReduceScatter && e.useFlat(m.Size()*out.Len()*dt.Size()) {
		// The input, gathered in one scratch buffer (not modified:
		// ncclReduceScatter), scaled for PreMulSum, is published as is.
		tmp := e.scratch(m.Size() * out.Len() * dt.Size())[:0]
		for i := range m.Size() {
			tmp = append(tmp, comm.Chunk(op.In, i, nil, out.Len()).Bytes()...)
		}
		if err := preScale(tmp, dt, red); err != nil {
			return err
		}
		ob := out.Bytes()
		if err := reduceScatterFlat(m, tmp, ob); err != nil {
			return err
		}
		return postScale(ob, dt, red, m.Size())
	}
	// Work on a copy: the input is not modified (ncclReduceScatter). The
	// copy is the engine's scratch, reused from op to op: a fresh buffer
	// per op (a large object, zeroed, its pages faulted in again after
	// each collection) cost more than the exchange itself (2 ranks,
	// 64 KiB: 75 µs against 8 µs at 32 KiB).
	tmp := e.scratch(enginekit.TotalLen(op.In) * dt.Size())[:0]
	blocks := e.blockList(m.Size())
	defer clear(blocks) // keep no reference to the scratch's old layout
	for i := range m.Size() {
		src := comm.Chunk(op.In, i, counts, out.Len()).Bytes()
		off := len(tmp)
		tmp = append(tmp, src...)
		blocks[i] = tmp[off:len(tmp):len(tmp)]
	}
	if err := preScale(tmp, dt, red); err != nil {
		return err
	}
	if err := ringReduceScatter(m, blocks, 0); err != nil {
		return err
	}
	ob := out.Bytes()
	copy(ob, blocks[m.Rank()])
	return postScale(ob, dt, red, m.Size())
}

// blockList returns a list of n byte blocks for one op's buffers (the
// caller clears it after the op), reused from op to op (the stream runs
// one op at a time), so that a small all-gather allocates nothing.
func (e *Engine) blockList(n int) [][]byte {
	if cap(e.blocks) < n {
		e.blocks = make([][]byte, n)
	}
	return e.blocks[:n]
}

// scratch returns a reusable buffer of n bytes, for the op the stream
// runs (one at a time: on the progress goroutine or inline on a waiter's;
// a Coalesced op's children use it in turn).
func (e *Engine) scratch(n int) []byte {
	if cap(e.scratchBuf) < n {
		e.scratchBuf = make([]byte, n)
	}
	return e.scratchBuf[:n]
}

// selfPairs pairs the sends to self of a BatchP2P's children with its
// receives from self (comm.SelfPairs) and checks each pair's sizes. An
// unpaired or ill-sized self op cannot run; BatchP2P rejects both before
// launch, so meeting one here is a bug, reported as an *comm.EngineError.
func (e *Engine) selfPairs(children []*comm.Op) ([][2]int, error) {
	r := e.cfg.Rank
	hasSelf := false
	peers, types, tags := make([]int, len(children)), make([]comm.OpType, len(children)), make([]int, len(children))
	for i, c := range children {
		if !c.Type.IsP2P() {
			return nil, nil // not a BatchP2P: self ops were refused child by child
		}
		peers[i], types[i], tags[i] = c.Peer, c.Type, c.Tag
		hasSelf = hasSelf || c.Peer == r
	}
	if !hasSelf {
		return nil, nil
	}
	pairs, unpaired := comm.SelfPairs(r, peers, types, tags)
	if unpaired >= 0 {
		return nil, fmt.Errorf("child %d (%v of rank %d to itself, tag %d) has no matching self %v in the batch", unpaired, types[unpaired], r, tags[unpaired], map[comm.OpType]string{comm.OpSend: "receive", comm.OpRecv: "send"}[types[unpaired]])
	}
	for _, p := range pairs {
		s, d := children[p[0]], children[p[1]]
		if len(s.In) != 1 || len(d.Out) != 1 || len(s.In[0].Bytes()) != len(d.Out[0].Bytes()) || s.In[0].DType() != d.Out[0].DType() {
			return nil, fmt.Errorf("self send child %d and self receive child %d differ in dtype or size", p[0], p[1])
		}
	}
	return pairs, nil
}
