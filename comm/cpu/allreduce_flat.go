package cpu

// allreduceFlat is the one-step shared-memory allreduce for small buffers
// (Open MPI's coll/sm, MPICH's release-gather, NCCL's LL protocol within a
// node): every rank copies buf into its slot and publishes it, then reads
// every rank's slot in place and folds them in rank order,
// buf = ((x0 op x1) op x2) ..., so that every rank computes a bitwise
// identical result whatever the reduction's rounding. One step instead of
// ceil(log2 n) (recursive doubling) or 2(n-1) (ring): each rank writes
// |buf| bytes once and reads (n-1)·|buf|, and waits once for the last rank
// to arrive. The engine takes it when every rank of a group of 2..8 is on
// this host over shm and |buf| <= Options.FlatThreshold.
func allreduceFlat(s Slots, buf []byte) error {
	if err := s.Publish(buf); err != nil {
		return err
	}
	for p := range s.Size() {
		src, err := s.Slot(p, len(buf))
		if err != nil {
			return err
		}
		if p == 0 {
			copy(buf, src)
			continue
		}
		if err := s.Reduce(buf, src); err != nil {
			return err
		}
	}
	return nil
}
