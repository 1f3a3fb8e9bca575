package cpu

// gatherLinear collects every rank's in into out[i] on root (Gloo's
// gather): non-roots send one message to root; root receives n-1 messages.
// out is nil on non-roots.
func gatherLinear(m Mesh, in []byte, out [][]byte, root int) error {
	n, r := m.Size(), m.Rank()
	if r != root {
		if err := m.Send(root, 0, in); err != nil {
			return err
		}
		return m.Flush()
	}
	copy(out[r], in)
	for i := range n {
		if i == root {
			continue
		}
		if err := m.Recv(i, 0, out[i]); err != nil {
			return err
		}
	}
	return nil
}
