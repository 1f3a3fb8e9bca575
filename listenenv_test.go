package ranktree

import (
	"context"
	"errors"
	"testing"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/store"
)

// TestInitListenEnv: two ranks initialized with the listener on every
// interface, advertising the loopback interface's address by name, run an
// allreduce.
func TestInitListenEnv(t *testing.T) {
	t.Setenv(EnvSocketIfname, "lo")
	t.Setenv(EnvListenHost, "0.0.0.0")
	t.Setenv(EnvAdvertiseHost, "")
	t.Setenv(EnvTransport, "tcp")
	ms := store.NewMemStore()
	const n = 2
	errs := make(chan error, n)
	for r := range n {
		go func() {
			rt, err := Init(context.Background(), quiet(), WithStore(ms), WithRank(r), WithWorldSize(n),
				WithLocalRank(r), WithLocalWorldSize(n), WithNodeRank(0))
			if err != nil {
				errs <- err
				return
			}
			defer rt.Close(context.Background())
			buf := []float32{float32(r + 1)}
			if err := rt.World().AllReduce(context.Background(), comm.HostBuffer(buf), comm.Sum).Wait(context.Background()); err != nil {
				errs <- err
				return
			}
			if buf[0] != 3 {
				errs <- errors.New("wrong sum")
				return
			}
			errs <- nil
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
