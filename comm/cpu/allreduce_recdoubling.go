package cpu

// allreduceRecDoubling is the latency-optimal recursive-doubling allreduce
// (MPICH's MPIR_Allreduce_intra_recursive_doubling; Gloo's
// allreduce_halving_doubling without the halving) for small buffers: with
// p the largest power of two <= n and q = n-p, the first 2q ranks first
// pair up (even ranks hand their data to the odd neighbour and sit out),
// then the p remaining ranks exchange whole buffers with partners at
// distance 1, 2, 4, ... and reduce, and finally the odd ranks hand the
// result back. ceil(log2 n) (+2 when n is not a power of two) steps of
// |buf| bytes. tmp must be len(buf) bytes. Reduction is commutative, so
// every rank computes bit-identical results.
func allreduceRecDoubling(m Mesh, buf, tmp []byte) error {
	n, r := m.Size(), m.Rank()
	if n == 1 {
		return nil
	}
	p := 1
	for p*2 <= n {
		p *= 2
	}
	q := n - p
	vr := -1 // rank among the p participants
	switch {
	case r < 2*q && r%2 == 0:
		if err := m.Send(r+1, 0, buf); err != nil {
			return err
		}
		if err := m.Flush(); err != nil {
			return err
		}
	case r < 2*q:
		if err := m.RecvReduce(r-1, 0, buf); err != nil {
			return err
		}
		vr = r / 2
	default:
		vr = r - q
	}
	real := func(v int) int {
		if v < q {
			return 2*v + 1
		}
		return v + q
	}
	if vr >= 0 {
		step := 1
		for mask := 1; mask < p; mask <<= 1 {
			partner := real(vr ^ mask)
			if err := m.Send(partner, step, buf); err != nil {
				return err
			}
			// Receive into tmp, then reduce: buf is still being sent.
			if err := m.Recv(partner, step, tmp); err != nil {
				return err
			}
			if err := m.Flush(); err != nil {
				return err
			}
			if err := m.Reduce(buf, tmp); err != nil {
				return err
			}
			step++
		}
	}
	const final = 1 << 20
	if r < 2*q {
		if r%2 == 1 {
			if err := m.Send(r-1, final, buf); err != nil {
				return err
			}
			return m.Flush()
		}
		return m.Recv(r+1, final, buf)
	}
	return nil
}
