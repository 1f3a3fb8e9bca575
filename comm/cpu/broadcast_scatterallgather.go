package cpu

// broadcastScatterAllGather is the bandwidth-optimal broadcast for large
// buffers (van de Geijn; MPICH's MPIR_Bcast_intra_scatter_ring_allgather):
// the root sends block i of buf (n nearly equal byte blocks) to rank i,
// then a ring allgather circulates the blocks. 1 + (n-1) steps; every rank
// sends about 2(n-1)/n · |buf| bytes, against ⌈log2 n⌉ · |buf| for the
// root of a binomial tree.
func broadcastScatterAllGather(m Mesh, buf []byte, root int) error {
	n, r := m.Size(), m.Rank()
	blocks := make([][]byte, n)
	for i := range n {
		lo, hi := split(len(buf), n, i)
		blocks[i] = buf[lo:hi]
	}
	if r == root {
		for i := range n {
			if i != root {
				if err := m.Send(i, 0, blocks[i]); err != nil {
					return err
				}
			}
		}
		if err := m.Flush(); err != nil {
			return err
		}
	} else if err := m.Recv(root, 0, blocks[r]); err != nil {
		return err
	}
	return ringAllGather(m, blocks, 1)
}
