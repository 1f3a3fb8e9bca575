package ranktree

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/internal/groups"
	"github.com/ranktree/ranktree/store"
)

// initRanks runs Init for n in-process ranks on st (no cleanup: callers close).
func initRanks(t *testing.T, st store.Store, n int) []*Runtime {
	t.Helper()
	rts := make([]*Runtime, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rts[r], errs[r] = Init(context.Background(), WithStore(st), WithRank(r), WithWorldSize(n), WithJob("rt"),
				WithLocalRank(r), WithLocalWorldSize(n), WithNodeRank(0), WithLogger(zerolog.Nop()), WithTimeout(20*time.Second))
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: Init: %v", r, err)
		}
	}
	return rts
}

// closeAll closes every runtime concurrently and returns the slowest Close's duration.
func closeAll(t *testing.T, rts []*Runtime) time.Duration {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var slowest time.Duration
	for _, rt := range rts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			if err := rt.Close(ctx); err != nil {
				t.Errorf("rank %d: Close: %v", rt.Rank(), err)
			}
			mu.Lock()
			slowest = max(slowest, time.Since(start))
			mu.Unlock()
		}()
	}
	wg.Wait()
	return slowest
}

// sumCheck all-reduces [rank+1] on pg and checks the closed form n(n+1)/2.
func sumCheck(ctx context.Context, pg *comm.ProcessGroup, rank, n int) error {
	x := []float64{float64(rank + 1)}
	if err := pg.AllReduce(ctx, comm.HostBuffer(x), comm.Sum).Wait(ctx); err != nil {
		return err
	}
	if want := float64(n * (n + 1) / 2); x[0] != want {
		return errors.New("allreduce result wrong")
	}
	return nil
}

func TestRestartGroupAfterAbort(t *testing.T) {
	t.Setenv("RANKTREE_ASYNC_ERROR_HANDLING", "CleanupOnly")
	t.Setenv(EnvFault, "error@rank=1,seq=2")
	const n = 3
	rts := initRanks(t, store.NewMemStore(), n)
	defer closeAll(t, rts)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	eachRank(t, rts, func(rt *Runtime) error {
		old := rt.World()
		if err := sumCheck(ctx, old, rt.Rank(), n); err != nil {
			return err
		}
		err := sumCheck(ctx, old, rt.Rank(), n) // seq 2: rank 1's engine fails it
		if err == nil {
			t.Errorf("rank %d: seq 2 succeeded despite the injected error", rt.Rank())
		}
		// Once the watchdogs have aborted the group (asynchronously: an op
		// launched right away may meet a peer still at seq 2 and fail with
		// a mismatch), later ops fail fast with ErrAborted.
		deadline := time.Now().Add(5 * time.Second)
		for {
			err := sumCheck(ctx, old, rt.Rank(), n)
			if errors.Is(err, comm.ErrAborted) {
				break
			}
			if err == nil || time.Now().After(deadline) {
				t.Errorf("rank %d: op after abort: %v, want ErrAborted", rt.Rank(), err)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		pg, err := rt.RestartGroup(ctx, old)
		if err != nil {
			return err
		}
		if pg.Epoch() != old.Epoch()+1 || rt.World() != pg {
			t.Errorf("rank %d: restarted epoch %d (world is new: %v), want %d", rt.Rank(), pg.Epoch(), rt.World() == pg, old.Epoch()+1)
		}
		if _, err := rt.RestartGroup(ctx, old); !errors.Is(err, comm.ErrInvalidArgument) {
			t.Errorf("rank %d: restarting a stale handle: %v, want ErrInvalidArgument", rt.Rank(), err)
		}
		return sumCheck(ctx, pg, rt.Rank(), n) // seq 1 of the new epoch
	})
}

func TestInitAgainAfterClose(t *testing.T) {
	t.Setenv(EnvFault, "")
	const n = 2
	st := store.NewMemStore()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for inc := uint32(0); inc < 2; inc++ {
		rts := initRanks(t, st, n)
		eachRank(t, rts, func(rt *Runtime) error {
			if rt.Incarnation() != inc || rt.World().Epoch() != groups.BaseEpoch(inc) {
				t.Errorf("rank %d: incarnation %d epoch %d, want %d and %d", rt.Rank(), rt.Incarnation(), rt.World().Epoch(), inc, groups.BaseEpoch(inc))
			}
			return sumCheck(ctx, rt.World(), rt.Rank(), n)
		})
		closeAll(t, rts)
	}
}
