package cpu

// barrierDissemination is the dissemination barrier (Hensgen, Finkel and
// Manber; MPICH's MPIR_Barrier_intra_dissemination): in round k a rank
// sends an empty message to (r + 2^k) mod n and waits for one from
// (r - 2^k) mod n. After ceil(log2 n) rounds every rank has (transitively)
// heard from every other, so no rank leaves before all have arrived.
func barrierDissemination(m Mesh) error {
	n, r := m.Size(), m.Rank()
	step := 0
	for k := 1; k < n; k <<= 1 {
		if err := m.Send((r+k)%n, step, nil); err != nil {
			return err
		}
		if err := m.Recv((r-k+n)%n, step, nil); err != nil {
			return err
		}
		if err := m.Flush(); err != nil {
			return err
		}
		step++
	}
	return nil
}
