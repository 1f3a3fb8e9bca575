package cpu

// broadcastChain is the pipelined chain broadcast (NCCL's ring broadcast,
// MPICH's pipelined chain): buf goes root → root+1 → … → root+n−1 as one
// message per link, which the shared-memory transport streams in pieces,
// every middle rank sending each piece on as soon as it has copied it in,
// while it is still in its cache (Mesh.RecvSend). The root copies |buf|
// out, each middle rank copies it in and on, the last rank in: 2(n−1)·|buf|
// bytes copied in all and at most 2·|buf| by any rank, against
// 2(n−1)(1+1/n)·|buf| in all and up to 3(n−1)/n·|buf| at the root for
// scatter + allgather, at a latency of n−1 pieces before the last rank
// has the first. Over TCP a forward is a receive and then a send (no
// streaming), so the engine uses it only when every link is shared memory.
func broadcastChain(m Mesh, buf []byte, root int) error {
	n, r := m.Size(), m.Rank()
	if n == 1 {
		return nil
	}
	v := (r - root + n) % n
	next, prev := (r+1)%n, (r-1+n)%n
	switch v {
	case 0:
		if err := m.Send(next, 0, buf); err != nil {
			return err
		}
	case n - 1:
		return m.Recv(prev, 0, buf)
	default:
		if err := m.RecvSend(prev, 0, buf, next, 0); err != nil {
			return err
		}
	}
	return m.Flush()
}
