package supervisor

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ranktree/ranktree/store"
)

func TestRestartEpochAllArrive(t *testing.T) {
	st := store.NewMemStore()
	defer st.Close()
	const size = 3
	got := make([]uint32, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := 0; r < size; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			got[r], errs[r] = RestartEpoch(context.Background(), st, "default_pg", 4, r, size, 10*time.Second)
		}(r)
	}
	wg.Wait()
	for r := 0; r < size; r++ {
		if errs[r] != nil || got[r] != 5 {
			t.Errorf("rank %d: epoch %d, %v; want 5", r, got[r], errs[r])
		}
	}
}

func TestRestartEpochNamesMissingRank(t *testing.T) {
	st := store.NewMemStore()
	defer st.Close()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := 0; r < 2; r++ { // rank 2 of 3 never arrives
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			_, errs[r] = RestartEpoch(context.Background(), st, "pg1", 0, r, 3, 200*time.Millisecond)
		}(r)
	}
	wg.Wait()
	for r, err := range errs {
		var be *store.BarrierError
		if !errors.As(err, &be) || !errors.Is(err, store.ErrTimeout) || !slices.Equal(be.Missing, []int{2}) {
			t.Errorf("rank %d: %v, want a BarrierError missing [2]", r, err)
		}
	}
}
