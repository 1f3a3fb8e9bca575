package cpu

// reduceTree reduces buf onto root along a binomial tree (MPICH's binomial
// reduce): rank v (relative to root) reduces what v + 2^k sends for each
// 2^k below its lowest set bit, then sends its partial result to
// v - 2^lowbit. ceil(log2 n) steps of |buf| bytes. buf is overwritten with
// partial results on every rank (callers pass a copy on non-roots).
func reduceTree(m Mesh, buf []byte, root int) error {
	n, r := m.Size(), m.Rank()
	if n == 1 {
		return nil
	}
	vr := (r - root + n) % n
	for mask := 1; mask < n; mask <<= 1 {
		if vr&mask != 0 {
			if err := m.Send((vr-mask+root)%n, mask, buf); err != nil {
				return err
			}
			return m.Flush()
		}
		if vr+mask < n {
			if err := m.RecvReduce((vr+mask+root)%n, mask, buf); err != nil {
				return err
			}
		}
	}
	return nil
}
