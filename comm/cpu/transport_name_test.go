package cpu

import "testing"

// TestTransportName: Engine.Transport names the links the group uses, for
// the comm_init event and the byte metrics' transport label.
func TestTransportName(t *testing.T) {
	for _, c := range []struct {
		transport string
		n         int
		want      string
	}{{TransportSHM, 2, "shm"}, {TransportTCP, 3, "tcp"}, {TransportInmem, 2, "inmem"}, {TransportTCP, 1, "self"}} {
		g := newGroup(t, c.n, Options{Transport: c.transport})
		for r, e := range g.engines {
			if got := e.Transport(); got != c.want {
				t.Errorf("%s, %d ranks: rank %d Transport() = %q, want %q", c.transport, c.n, r, got, c.want)
			}
		}
	}
}
