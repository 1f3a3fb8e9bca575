package cpu

// allgatherBruck is the latency-optimal allgather for small messages (Bruck
// et al. 1997, "Efficient algorithms for all-to-all communications in
// multiport message-passing systems"; MPICH's MPIR_Allgather_intra_brucks):
// ceil(log2 n) steps for any n, against n-1 for the ring. On entry
// blocks[rank] holds this rank's block; on return every block is filled.
// Block sizes may differ (AllGatherV); every rank knows them all.
//
// After step k a rank holds the 2^(k+1) blocks rank, rank+1, ... (mod n).
// At step k (distance d = 2^k) it sends the first min(d, n-d) of the blocks
// it holds to rank-d and receives as many from rank+d: blocks rank+d,
// rank+d+1, .... The blocks of one step travel as one message, packed
// into scratch, so a step costs one latency whatever n is.
func allgatherBruck(m Mesh, blocks [][]byte, scratch []byte) error {
	n, r := m.Size(), m.Rank()
	if n == 1 {
		return nil
	}
	// span is the byte length of the cnt blocks from index first (mod n).
	span := func(first, cnt int) int {
		t := 0
		for i := range cnt {
			t += len(blocks[(first+i)%n])
		}
		return t
	}
	for step, d := 0, 1; d < n; step, d = step+1, d*2 {
		cnt := min(d, n-d)
		to, from := (r-d+n)%n, (r+d)%n
		out := scratch[:span(r, cnt)]
		in := scratch[len(out) : len(out)+span(from, cnt)]
		off := 0
		for i := range cnt {
			off += copy(out[off:], blocks[(r+i)%n])
		}
		if err := m.Send(to, step, out); err != nil {
			return err
		}
		if err := m.Recv(from, step, in); err != nil {
			return err
		}
		if err := m.Flush(); err != nil {
			return err
		}
		off = 0
		for i := range cnt {
			b := blocks[(from+i)%n]
			off += copy(b, in[off:off+len(b)])
		}
	}
	return nil
}

// bruckScratch is the scratch allgatherBruck needs for blocks: the largest
// step's outgoing plus incoming bytes, bounded by twice the total.
func bruckScratch(blocks [][]byte) int {
	t := 0
	for _, b := range blocks {
		t += len(b)
	}
	return 2 * t
}
