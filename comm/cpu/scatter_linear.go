package cpu

// scatterLinear sends in[i] from root to rank i's out (Gloo's scatter):
// root queues n-1 messages; the others receive one. in is nil on
// non-roots.
func scatterLinear(m Mesh, in [][]byte, out []byte, root int) error {
	n, r := m.Size(), m.Rank()
	if r != root {
		return m.Recv(root, 0, out)
	}
	for i := range n {
		if i == root {
			continue
		}
		if err := m.Send(i, 0, in[i]); err != nil {
			return err
		}
	}
	copy(out, in[r])
	return m.Flush()
}
