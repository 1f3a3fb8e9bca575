package comm

import (
	"fmt"
	"strings"
)

// Input checks shared by the ProcessGroup methods and the Coalescer. Each
// returns nil or an *ArgError whose text follows c10d's wording where c10d
// has one, and names what was expected and what was given. They are the
// one validation of an op: engines receive only ops that passed them
// (plus the identity the communicator actor stamps) and do not check again.

// checkBuf checks that b is a valid buffer on the kind of memory the engine
// uses (host memory for the CPU engine, a CUDA device for NCCL), whose
// shape, if it has one, describes it.
func (pg *ProcessGroup) checkBuf(op OpType, what string, b Buffer) error {
	if pg.bufOK(b) {
		return nil
	}
	if !b.Valid() {
		return pg.argErr(op, "%s is not a valid buffer (dtype %v, %d elements)", what, b.DType(), b.Len())
	}
	if msg := b.shapeProblem(); msg != "" {
		return pg.argErr(op, "%s: %s", what, msg)
	}
	if pg.device && b.IsHost() {
		return pg.argErr(op, "%s is in host memory but engine %q needs CUDA device buffers (Tensors must be CUDA and dense)", what, pg.engine)
	}
	if !pg.device && !b.IsHost() {
		return pg.argErr(op, "%s is on cuda:%d but engine %q only handles host buffers (unsupported device type cuda)", what, b.Device(), pg.engine)
	}
	if pg.device && b.Device() != pg.ordinal {
		return pg.argErr(op, "%s is on cuda:%d, not on the communicator's device cuda:%d", what, b.Device(), pg.ordinal)
	}
	return nil
}

// bufOK is the fast path of checkBuf.
func (pg *ProcessGroup) bufOK(b Buffer) bool {
	return b.Valid() && b.IsHost() != pg.device && (!pg.device || b.Device() == pg.ordinal) &&
		(b.shape == nil || (b.shape.ok && b.shape.prod == b.count))
}

// checkBufs checks every buffer of a list and that they share want's dtype.
func (pg *ProcessGroup) checkBufs(op OpType, what string, bufs []Buffer, want DType) error {
	for i, b := range bufs {
		if !pg.bufOK(b) {
			return pg.checkBuf(op, what+"["+itoa(i)+"]", b)
		}
		if b.DType() != want {
			return pg.argErr(op, "tensors with different dtypes: %s[%d] is %v, expected %v", what, i, b.DType(), want)
		}
	}
	return nil
}

// checkDType reports mixed dtypes between two buffers.
func (pg *ProcessGroup) checkDType(op OpType, aName string, a Buffer, bName string, b Buffer) error {
	if a.DType() != b.DType() {
		return pg.argErr(op, "tensors with different dtypes: %s is %v, %s is %v", aName, a.DType(), bName, b.DType())
	}
	return nil
}

// checkLen reports a buffer whose element count is not want.
func (pg *ProcessGroup) checkLen(op OpType, what string, b Buffer, want int, why string) error {
	if b.Len() != want {
		return pg.argErr(op, "%s has %d elements, expected %d (%s)", what, b.Len(), want, why)
	}
	return nil
}

// checkListLen reports a buffer list whose length is not the group size.
func (pg *ProcessGroup) checkListLen(op OpType, what string, n int) error {
	if n != pg.size {
		return pg.argErr(op, "%s has %d buffers, expected %d (the group size)", what, n, pg.size)
	}
	return nil
}

// checkRoot reports a root outside the group.
func (pg *ProcessGroup) checkRoot(op OpType, root int) error {
	if root < 0 || root >= pg.size {
		return pg.argErr(op, "invalid root rank %d: must be a group rank in [0, %d)", root, pg.size)
	}
	return nil
}

// checkPeer reports a P2P peer outside the group or equal to the caller
// (c10d: "Invalid destination rank: should not be the same as rank of the
// current process"). AnySource is accepted for receives when anyOK; a
// receive is only refused AnySource inside a batch (BatchP2P, Coalesce),
// and is told so.
func (pg *ProcessGroup) checkPeer(op OpType, peer int, anyOK bool) error {
	if peer == AnySource && op == OpRecv {
		switch {
		case !anyOK:
			return pg.argErr(op, "AnySource is not allowed in a batch (BatchP2P or Coalesce): a batched receive needs a source group rank in [0, %d); use IRecv for AnySource", pg.size)
		case pg.device:
			return fmt.Errorf("%w: group %q: engine %q cannot receive from any source (NCCL has no wildcard receive)", ErrUnsupported, pg.name, pg.engine)
		case pg.size == 1:
			return pg.argErr(op, "any-source receive in a group of one rank: there is no other rank to receive from")
		}
		return nil
	}
	role := "destination"
	if op == OpRecv {
		role = "source"
	}
	if peer < 0 || peer >= pg.size {
		return pg.argErr(op, "invalid %s rank %d: must be a group rank in [0, %d)", role, peer, pg.size)
	}
	if peer == pg.rank {
		return pg.argErr(op, "invalid %s rank %d: should not be the same as rank of the current process", role, peer)
	}
	return nil
}

// checkTag reports a negative tag (tags are matched as non-negative ints,
// as in Gloo and MPI).
func (pg *ProcessGroup) checkTag(op OpType, tag int) error {
	if tag < 0 {
		return pg.argErr(op, "invalid tag %d: tags must be non-negative", tag)
	}
	return nil
}

// checkCounts checks a per-rank count (or split) list: one entry per rank,
// none negative. It returns the sum.
func (pg *ProcessGroup) checkCounts(op OpType, what string, counts []int) (int, error) {
	if len(counts) != pg.size {
		return 0, pg.argErr(op, "%s has %d entries, expected %d (the group size)", what, len(counts), pg.size)
	}
	sum := 0
	for i, c := range counts {
		if c < 0 {
			return 0, pg.argErr(op, "%s[%d] is %d, expected a non-negative count", what, i, c)
		}
		sum += c
	}
	return sum, nil
}

// checkReduce applies ReduceOp.Check (c10d's dtype rules for reductions).
func (pg *ProcessGroup) checkReduce(op OpType, red ReduceOp, dt DType) error {
	if err := red.Check(dt); err != nil {
		return pg.argErr(op, "%s", strings.TrimPrefix(err.Error(), ErrInvalidArgument.Error()+": "))
	}
	return nil
}

// itoa formats small non-negative ints without fmt (validation is on the
// launch path).
func itoa(i int) string {
	if i < 10 && i >= 0 {
		return string(rune('0' + i))
	}
	var b [20]byte
	n := len(b)
	neg := i < 0
	if neg {
		i = -i
	}
	for i > 0 {
		n--
		b[n] = byte('0' + i%10)
		i /= 10
	}
	if neg {
		n--
		b[n] = '-'
	}
	return string(b[n:])
}
