package cpu

// ringAllGather circulates blocks around the ring: on entry blocks[rank]
// holds this rank's block; on return every block is filled. Block sizes may
// differ (AllGatherV). Step s (0..n-2): send block (r-s) to the right and
// receive block (r-s-1) from the left. n-1 steps; step numbers start at
// step0. As Gloo's allgather_ring and NCCL's ring allgather.
func ringAllGather(m Mesh, blocks [][]byte, step0 int) error {
	n, r := m.Size(), m.Rank()
	if n == 1 {
		return nil
	}
	right, left := (r+1)%n, (r-1+n)%n
	for s := 0; s < n-1; s++ {
		send := ((r-s)%n + n) % n
		recv := ((r-s-1)%n + n) % n
		if err := m.Send(right, step0+s, blocks[send]); err != nil {
			return err
		}
		if err := m.Recv(left, step0+s, blocks[recv]); err != nil {
			return err
		}
		if err := m.Flush(); err != nil {
			return err
		}
	}
	return nil
}
