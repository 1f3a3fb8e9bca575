package cpu

// allreduceSlots is the allreduce of a buffer too large for the one-step
// allreduce among three or more ranks on this host (Engine.useSlotAllReduce):
// the buffer goes through the group segment's slots in rounds of at most
// piece bytes (Options.SlotBytes), each round a reduce-scatter step and
// an allgather step, both one-step exchanges (reducescatter_flat.go,
// allgather_flat.go; the shared-memory allreduce of Open MPI's coll/sm
// and MPICH's release-gather for large messages works the same way).
//
// In the first step every rank publishes the round's segment of buf and
// folds block Rank() (of n blocks split on elements) of every rank's slot
// into its own segment in rank order, ((x0 op x1) op x2) ..., as
// allreduceFlat does. In the second it publishes that reduced block and
// copies every peer's reduced block out of the peer's slot. Each block is
// reduced by one rank and copied by the others, so every rank ends with
// bitwise the same result, the same as the one-step allreduce's.
//
// Per round of S bytes each rank writes S + S/n bytes into its slot and
// reads S (its block of every slot) plus (n−1)/n·S, in two exchanges,
// against the ring's 2(n−1) steps: with more ranks than cores every step
// hands a CPU over. Every slot read checks the peer's header
// (fingerprint and length), so the op needs no agreement step. esize is
// the element size.
func allreduceSlots(s Slots, buf []byte, esize, piece int) error {
	n, r := s.Size(), s.Rank()
	piece = max(piece-piece%esize, esize) // whole elements, at least one
	for off := 0; off < len(buf); off += piece {
		seg := buf[off:min(off+piece, len(buf))]
		count := len(seg) / esize
		if err := s.Publish(seg); err != nil {
			return err
		}
		lo, hi := split(count, n, r)
		mine := seg[lo*esize : hi*esize]
		for p := range n {
			src, err := s.Slot(p, len(seg))
			if err != nil {
				return err
			}
			blk := src[lo*esize : hi*esize]
			if p == 0 {
				copy(mine, blk) // this rank's own data stays in its slot
				continue
			}
			if err := s.Reduce(mine, blk); err != nil {
				return err
			}
		}
		if err := s.Publish(mine); err != nil {
			return err
		}
		for p := range n {
			plo, phi := split(count, n, p)
			src, err := s.Slot(p, (phi-plo)*esize)
			if err != nil {
				return err
			}
			if p != r {
				copy(seg[plo*esize:phi*esize], src)
			}
		}
	}
	return nil
}
