package cpu

// allreduceRing is the bandwidth-optimal ring allreduce (Gloo's
// allreduce_ring_chunked, NCCL's ring): blocks[i] is the part of the buffer
// rank i finishes. A reduce-scatter leaves blocks[rank] fully reduced; an
// allgather then circulates the finished blocks. Each rank sends and
// receives 2(n-1) messages of about |buf|/n bytes; transports stream each
// message in segments, so reduction overlaps the transfer (pipelining).
func allreduceRing(m Mesh, blocks [][]byte) error {
	if err := ringReduceScatter(m, blocks, 0); err != nil {
		return err
	}
	return ringAllGather(m, blocks, m.Size()-1)
}
