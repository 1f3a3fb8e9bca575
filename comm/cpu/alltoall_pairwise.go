package cpu

// alltoallPairwise exchanges send[i] → rank i's recv[rank] in n-1 steps: at
// step s a rank sends to (r+s) mod n and receives from (r-s) mod n (MPICH's
// pairwise exchange; Gloo's alltoall). The own block is copied. Blocks may
// have any sizes (AllToAll with splits).
func alltoallPairwise(m Mesh, send, recv [][]byte) error {
	n, r := m.Size(), m.Rank()
	copy(recv[r], send[r])
	for s := 1; s < n; s++ {
		to, from := (r+s)%n, (r-s+n)%n
		if err := m.Send(to, s, send[to]); err != nil {
			return err
		}
		if err := m.Recv(from, s, recv[from]); err != nil {
			return err
		}
		if err := m.Flush(); err != nil {
			return err
		}
	}
	return nil
}
