package cpu

// allgatherFlat is the one-step shared-memory allgather (see
// allreduce_flat.go): every rank publishes its block, blocks[Rank()], in
// its slot, then copies every peer's block out of the peers' slots. Every
// block has the same length (AllGather, not AllGatherV). One step; each
// rank writes |block| bytes and reads (n-1)·|block|.
func allgatherFlat(s Slots, blocks [][]byte) error {
	r := s.Rank()
	if err := s.Publish(blocks[r]); err != nil {
		return err
	}
	for p := range s.Size() {
		src, err := s.Slot(p, len(blocks[r]))
		if err != nil {
			return err
		}
		if p != r {
			copy(blocks[p], src)
		}
	}
	s.Done()
	return nil
}
