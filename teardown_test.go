package ranktree

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/store/natsstore"
)

// closeBound is the teardown bound of issue 4 (2 s plus the grace period),
// with slack for a loaded test machine.
const closeBound = CloseGrace + 2*time.Second + 3*time.Second

func TestCloseIdempotentAndLaterOpsFail(t *testing.T) {
	t.Setenv(EnvFault, "")
	const n = 2
	rts := initRanks(t, store.NewMemStore(), n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if d := closeAll(t, rts); d > closeBound {
		t.Errorf("idle Close took %v, bound %v", d, closeBound)
	}
	for _, rt := range rts {
		if err := rt.Close(ctx); err != nil {
			t.Errorf("rank %d: second Close: %v", rt.Rank(), err)
		}
		if err := sumCheck(ctx, rt.World(), rt.Rank(), n); !errors.Is(err, comm.ErrClosed) {
			t.Errorf("rank %d: allreduce after Close: %v, want ErrClosed", rt.Rank(), err)
		}
		if _, err := rt.NewGroup(ctx, []int{0, 1}); !errors.Is(err, comm.ErrClosed) {
			t.Errorf("rank %d: NewGroup after Close: %v, want ErrClosed", rt.Rank(), err)
		}
		if _, err := rt.RestartGroup(ctx, rt.World()); !errors.Is(err, comm.ErrClosed) {
			t.Errorf("rank %d: RestartGroup after Close: %v, want ErrClosed", rt.Rank(), err)
		}
	}
}

func TestCloseDuringHungOp(t *testing.T) {
	t.Setenv("RANKTREE_ASYNC_ERROR_HANDLING", "CleanupOnly")
	t.Setenv(EnvFault, "hang@rank=1,seq=1")
	const n = 2
	rts := initRanks(t, store.NewMemStore(), n)
	works := make([]*comm.Work, n)
	for i, rt := range rts {
		works[i] = rt.World().AllReduce(context.Background(), comm.HostBuffer([]float32{1}), comm.Sum)
	}
	time.Sleep(200 * time.Millisecond) // let the ops reach the engines
	start := time.Now()
	d := closeAll(t, rts)
	if d > closeBound {
		t.Errorf("Close during a hung op took %v, bound %v", d, closeBound)
	}
	if d < CloseGrace/2 {
		t.Errorf("Close returned after %v: the in-flight op got no grace period", d)
	}
	for i, w := range works {
		select {
		case <-w.Done():
			if w.Err() == nil {
				t.Errorf("rank %d: hung allreduce succeeded", i)
			}
		case <-time.After(closeBound - time.Since(start)):
			t.Errorf("rank %d: hung Work still incomplete after Close", i)
		}
	}
}

func TestDestroyBoundedAndIdempotent(t *testing.T) {
	t.Setenv(EnvFault, "")
	const n = 2
	rts := initRanks(t, store.NewMemStore(), n)
	defer closeAll(t, rts)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	eachRank(t, rts, func(rt *Runtime) error {
		pg, err := rt.NewGroup(ctx, []int{0, 1}, comm.WithGroupName("dg"))
		if err != nil {
			return err
		}
		if err := sumCheck(ctx, pg, rt.Rank(), n); err != nil {
			return err
		}
		start := time.Now()
		if err := pg.Destroy(ctx); err != nil {
			return err
		}
		if d := time.Since(start); d > closeBound {
			t.Errorf("rank %d: Destroy took %v", rt.Rank(), d)
		}
		if err := pg.Destroy(ctx); err != nil {
			t.Errorf("rank %d: second Destroy: %v", rt.Rank(), err)
		}
		if err := sumCheck(ctx, pg, rt.Rank(), n); !errors.Is(err, comm.ErrClosed) {
			t.Errorf("rank %d: allreduce after Destroy: %v, want ErrClosed", rt.Rank(), err)
		}
		// The same name again gets the next epoch and works.
		pg2, err := rt.NewGroup(ctx, []int{0, 1}, comm.WithGroupName("dg"))
		if err != nil {
			return err
		}
		if pg2.Epoch() != pg.Epoch()+1 {
			t.Errorf("rank %d: re-created group epoch %d, want %d", rt.Rank(), pg2.Epoch(), pg.Epoch()+1)
		}
		return sumCheck(ctx, pg2, rt.Rank(), n)
	})
}

func TestCloseWithNATSDown(t *testing.T) {
	setEnv(t, nil)
	url, shutdown, err := natsstore.StartEmbedded(natsstore.EmbeddedOptions{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	rt, err := Init(context.Background(), quiet(), WithNATSURL(url), WithJob("natsdown"), WithRank(0), WithWorldSize(1),
		WithLocalRank(0), WithLocalWorldSize(1), WithNodeRank(0), WithTimeout(10*time.Second))
	if err != nil {
		shutdown()
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sumCheck(ctx, rt.World(), 0, 1); err != nil {
		t.Fatal(err)
	}
	shutdown()
	start := time.Now()
	err = rt.Close(ctx)
	d := time.Since(start)
	t.Logf("Close with NATS down: %v (%v)", d, err)
	if d > closeBound {
		t.Errorf("Close with NATS down took %v (err %v), bound %v", d, err, closeBound)
	}
	if err := sumCheck(ctx, rt.World(), 0, 1); !errors.Is(err, comm.ErrClosed) {
		t.Errorf("allreduce after Close: %v, want ErrClosed", err)
	}
}
