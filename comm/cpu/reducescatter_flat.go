package cpu

// reduceScatterFlat is the one-step shared-memory reduce-scatter (see
// allreduce_flat.go): every rank publishes its whole input in (n blocks of
// len(out) bytes), then folds block Rank() of every rank's slot into out
// in rank order, out = ((x0 op x1) op x2) ..., straight from the shared
// pages. One step; each rank writes |in| bytes and reads (n-1)·|in|/n.
func reduceScatterFlat(s Slots, in, out []byte) error {
	if err := s.Publish(in); err != nil {
		return err
	}
	lo := s.Rank() * len(out)
	for p := range s.Size() {
		src, err := s.Slot(p, len(in))
		if err != nil {
			return err
		}
		blk := src[lo : lo+len(out)]
		if p == 0 {
			copy(out, blk)
			continue
		}
		if err := s.Reduce(out, blk); err != nil {
			return err
		}
	}
	return nil
}
