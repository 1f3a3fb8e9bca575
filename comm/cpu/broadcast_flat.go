package cpu

// broadcastFlat is the one-step shared-memory broadcast (see
// allreduce_flat.go): the root publishes buf, every other rank an empty
// slot; every rank waits for every slot and checks every header, which is
// the agreement a rooted collective needs (agree.go), so none runs
// before; non-roots then copy the root's slot into buf. One step; the root
// writes |buf| bytes, every other rank reads them.
func broadcastFlat(s Slots, buf []byte, root int) error {
	mine := buf[:0]
	if s.Rank() == root {
		mine = buf
	}
	if err := s.Publish(mine); err != nil {
		return err
	}
	for p := range s.Size() {
		n := 0
		if p == root {
			n = len(buf)
		}
		src, err := s.Slot(p, n)
		if err != nil {
			return err
		}
		if p == root && p != s.Rank() {
			copy(buf, src)
		}
	}
	return nil
}
