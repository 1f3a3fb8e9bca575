package cpu

// broadcastTree sends buf from root to every rank along a binomial tree
// (MPICH's binomial broadcast; Gloo's broadcast_one_to_all sends directly).
// Rank v (relative to root) receives from v - 2^k where 2^k is its lowest
// set bit, then forwards to v + 2^j for every 2^j below that bit.
// ceil(log2 n) steps of |buf| bytes.
func broadcastTree(m Mesh, buf []byte, root int) error {
	n, r := m.Size(), m.Rank()
	if n == 1 {
		return nil
	}
	vr := (r - root + n) % n
	mask := 1
	for mask < n {
		if vr&mask != 0 {
			src := (vr - mask + root) % n
			if err := m.Recv(src, 0, buf); err != nil {
				return err
			}
			break
		}
		mask <<= 1
	}
	for mask >>= 1; mask > 0; mask >>= 1 {
		if vr+mask < n {
			if err := m.Send((vr+mask+root)%n, 0, buf); err != nil {
				return err
			}
		}
	}
	return m.Flush()
}
