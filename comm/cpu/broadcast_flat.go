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

// broadcastSlots is the broadcast of a buffer larger than the one-step
// threshold among three or more ranks when every rank is on this host
// (Engine.useSlotBroadcast): broadcastFlat in rounds of at most piece
// bytes (the slots' size, Options.SlotBytes), each round a one-step
// exchange whose slots carry every rank's fingerprint, as broadcastFlat's
// do, so it needs no agreement first. The slots are double-buffered: the
// root writes round j+1 while the others still copy round j out. The
// root copies |buf| bytes into its slot and each other rank copies them
// out, n·|buf| bytes in all, against 2(n−1)·|buf| for the chain
// (broadcast_chain.go), whose middle ranks copy each piece in and
// forward it.
func broadcastSlots(s Slots, buf []byte, root, piece int) error {
	for off := 0; off < len(buf); off += piece {
		if err := broadcastFlat(s, buf[off:min(off+piece, len(buf))], root); err != nil {
			return err
		}
	}
	return nil
}
