package cpu

// ringReduceScatter reduces blocks (one per rank, sizes may differ) across
// the ring so that blocks[rank] ends fully reduced on each rank; the other
// blocks hold partial sums afterwards. Step s (0..n-2): send block
// (r-s-1) to the right neighbour and reduce block (r-s-2) received from
// the left one. n-1 steps, each moving one block; step numbers start at
// step0. Used by ReduceScatter(V) and by the ring allreduce.
func ringReduceScatter(m Mesh, blocks [][]byte, step0 int) error {
	n, r := m.Size(), m.Rank()
	if n == 1 {
		return nil
	}
	right, left := (r+1)%n, (r-1+n)%n
	for s := 0; s < n-1; s++ {
		send := ((r-s-1)%n + n) % n
		recv := ((r-s-2)%n + n) % n
		if err := m.Send(right, step0+s, blocks[send]); err != nil {
			return err
		}
		if err := m.RecvReduce(left, step0+s, blocks[recv]); err != nil {
			return err
		}
		if err := m.Flush(); err != nil {
			return err
		}
	}
	return nil
}
