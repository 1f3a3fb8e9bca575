package cpu

// ringOpts are the ring allreduce's choices that do not come from the
// op: how the blocks are cut (every rank must cut alike: it shapes the
// messages) and how this rank writes what it receives last (its own
// business).
type ringOpts struct {
	// chunk is the size in bytes of the chunks the blocks are cut into;
	// 0: one chunk per block.
	chunk int
	// streamOut writes the finished blocks this rank receives with
	// non-temporal stores (Mesh.RecvStreaming).
	streamOut bool
}

// allreduceRing is the bandwidth-optimal ring allreduce (Gloo's
// allreduce_ring_chunked, NCCL's ring): blocks[i] is the part of the buffer
// rank i finishes, elem the element size. A reduce-scatter of n-1 steps
// leaves blocks[rank] fully reduced; an allgather of n-1 steps then
// circulates the finished blocks.
//
// Every block is cut into the same number of chunks of about o.chunk
// bytes, and the 2(n-1) steps run chunk by chunk, as NCCL's ring loops
// over chunks. Each step after the first forwards what it received
// (Mesh.RecvReduceSend, Mesh.RecvSend): the piece it has just reduced or
// copied goes on to the right while it is still in cache, instead of being
// read again from memory by a separate send. Per rank and byte of its
// buffer that is one copy in (the first step), one reduce, and one copy
// out, instead of two copies in, a reduce and a copy out. The chunks keep
// the messages of a link short enough that a forward need not wait behind
// a whole block: with 2 ranks, left and right are the same peer, and the
// forward queues behind the first step's send on the same ring.
//
// No step waits for its sends to leave the buffer (no Flush until the
// end): a region of the buffer is written after it was queued for sending
// only in the allgather, with the region's final value, and that value
// exists only once the right neighbour has read this rank's contribution
// to the same region out of the transport, so the send has copied it.
//
// Message steps: chunk c uses 2(n-1)·c + s for its step s (reduce-scatter
// 0..n-2, allgather n-1..2n-3), so that one chunk's messages are the
// classic ring's.
func allreduceRing(m Mesh, blocks [][]byte, elem int, o ringOpts) error {
	n, r := m.Size(), m.Rank()
	if n == 1 {
		return nil
	}
	right, left := (r+1)%n, (r-1+n)%n
	k := ringChunks(blocks, elem, o.chunk, n)
	// piece is chunk c of block b (mod n): the elements split(count, k, c)
	// of the block's count.
	piece := func(b, c int) []byte {
		blk := blocks[((b%n)+n)%n]
		lo, hi := split(len(blk)/elem, k, c)
		return blk[lo*elem : hi*elem]
	}
	for c := range k {
		base := 2 * (n - 1) * c
		if err := m.Send(right, base, piece(r-1, c)); err != nil {
			return err
		}
		// Reduce-scatter step s receives block r-s-2 and forwards it as
		// step s+1; the last one (s = n-2) finishes block r and forwards
		// it as the allgather's first step.
		for s := 0; s < n-1; s++ {
			if err := m.RecvReduceSend(left, base+s, piece(r-s-2, c), right, base+s+1); err != nil {
				return err
			}
		}
		// Allgather step s receives block r-s-1 and forwards it as step
		// s+1, except the last.
		for s := 0; s < n-2; s++ {
			if err := m.RecvSend(left, base+n-1+s, piece(r-s-1, c), right, base+n+s); err != nil {
				return err
			}
		}
		last, step := piece(r+1, c), base+2*n-3
		var err error
		if o.streamOut {
			err = m.RecvStreaming(left, step, last)
		} else {
			err = m.Recv(left, step, last)
		}
		if err != nil {
			return err
		}
	}
	return m.Flush()
}

// ringMaxSteps bounds the message steps of one ring allreduce below the
// step numbers of the one-step slots and the agreement rounds
// (transport.AgreeStep0).
const ringMaxSteps = 1 << 22

// ringChunks is the number of chunks every block is cut into: about
// chunk bytes each (of the largest block), at least one element each,
// and few enough that every message step stays below ringMaxSteps. Every
// rank computes the same from the op's count and the group size.
func ringChunks(blocks [][]byte, elem, chunk, n int) int {
	if chunk <= 0 {
		return 1
	}
	largest := 0
	for _, b := range blocks {
		largest = max(largest, len(b))
	}
	k := (largest + chunk - 1) / chunk
	k = min(k, len(blocks[len(blocks)-1])/elem, ringMaxSteps/(2*(n-1)))
	return max(k, 1)
}

// ringStreamOutMin is the buffer size from which the ring allreduce
// writes the finished blocks it receives with non-temporal stores: the
// size of the last-level cache of the development machine (and more than
// the L3 of most server cores' share), beyond which they would be out of
// cache before the caller reads them anyway. Measured there with 2 ranks
// (docs/algorithms.md): 8% less time per 64 MiB allreduce, but 20-40%
// more at 1-8 MiB, whose results ordinary stores leave in cache.
const ringStreamOutMin = 32 << 20

// ringChunkMin is the number of chunks from which the ring allreduce cuts
// a buffer into chunks at all: 16 MiB with the default 1 MiB chunks.
// Forwarding from cache (see allreduceRing) saves a read of the buffer
// from memory only where the buffer does not stay in cache between the
// reduce-scatter and the allgather; below, the chunks' extra messages and
// turns cost more than they save. Measured with 2 ranks on the
// development machine (32 MiB last-level cache; the two alternated op by
// op, docs/algorithms.md): unchunked was about 10 % faster at 4 and
// 8 MiB, chunked 5-15 % faster at 16 MiB and 20-30 % at 32 and 64 MiB.
const ringChunkMin = 16

// ringOptions are the ring allreduce's options for a buffer of nbytes.
// The chunks are 1 MiB (a quarter of the default 4 MiB shm ring, so that
// a chunk's message and the forward behind it both fit in a ring), used
// for buffers of at least ringChunkMin chunks, when the group has a group
// segment, which means every rank is on this host over shm
// (transport/shm_group.go; every rank knows it alike, and nbytes is in
// the op's fingerprint); else there is one chunk per block, the classic
// ring's messages (over TCP more and smaller messages gain nothing).
func (e *Engine) ringOptions(nbytes int) ringOpts {
	o := ringOpts{streamOut: nbytes >= ringStreamOutMin}
	if c := min(1<<20, e.opts.ShmRingBytes/4); e.grp != nil && nbytes >= ringChunkMin*c {
		o.chunk = c
	}
	return o
}
