package cpu

// allgatherFlat is the shared-memory allgather through the group
// segment's slots (see allreduce_flat.go): every rank publishes its block,
// blocks[Rank()], in its slot, then copies every peer's block out of the
// peers' slots. Every block has the same length (AllGather, not
// AllGatherV). A block longer than piece bytes (the slots' size,
// Options.FlatThreshold) goes in rounds of one piece each, a one-step
// exchange per round; the slots are double-buffered, so a rank publishes
// round j+1 while the slowest peer still reads round j. Each rank writes
// |block| bytes and reads (n-1)·|block|: n·S bytes copied in all for a
// gathered S, against 2(n-1)·S for the ring, in ⌈|block|/piece⌉ rounds
// instead of n-1 steps.
func allgatherFlat(s Slots, blocks [][]byte, piece int) error {
	r := s.Rank()
	mine := blocks[r]
	for off := 0; ; off += piece {
		k := min(piece, len(mine)-off)
		if err := s.Publish(mine[off : off+k]); err != nil {
			return err
		}
		for p := range s.Size() {
			src, err := s.Slot(p, k)
			if err != nil {
				return err
			}
			if p != r {
				copy(blocks[p][off:off+k], src)
			}
		}
		if off+k >= len(mine) {
			return nil
		}
	}
}
