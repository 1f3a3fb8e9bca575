package testrank

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/store"
)

// LocalWorld creates the world group of n ranks in this process, each rank
// with its own actor system and communicator, engines made by bf (e.g.
// cpu.Factory(cpu.Options{Transport: cpu.TransportInmem, Hub: hub})) and
// connected through one shared in-memory store. The groups are destroyed
// when the test ends. The returned factories create subgroups.
func LocalWorld(t testing.TB, n int, engine string, bf comm.BackendFactory) ([]*comm.ProcessGroup, []*Factory) {
	t.Helper()
	st := store.NewMemStore(store.WithMemTimeout(30 * time.Second))
	pgs := make([]*comm.ProcessGroup, n)
	fs := make([]*Factory, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		fs[r] = BackendFactoryFactory(QuietSystem(), engine, bf, st, zerolog.New(io.Discard).With().Int("rank", r).Logger())
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			pgs[r], errs[r] = fs[r].World(ctx, r, n)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: creating the world group: %v", r, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, pg := range pgs {
			pg.Destroy(ctx)
		}
	})
	return pgs, fs
}

// Ranks runs fn(rank) for rank 0..n-1 concurrently and returns the errors
// joined, each prefixed with its rank; it gives up after timeout (a hang
// is reported as an error, with the ranks that did not finish).
func Ranks(n int, timeout time.Duration, fn func(rank int) error) error {
	errs := make([]error, n)
	done := make([]bool, n)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := fn(r)
			mu.Lock()
			errs[r], done[r] = err, true
			mu.Unlock()
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(timeout):
		mu.Lock()
		defer mu.Unlock()
		var stuck []int
		for r, d := range done {
			if !d {
				stuck = append(stuck, r)
			}
		}
		return fmt.Errorf("ranks %v did not finish within %v", stuck, timeout)
	}
	var out []error
	for r, err := range errs {
		if err != nil {
			out = append(out, fmt.Errorf("rank %d: %w", r, err))
		}
	}
	return errors.Join(out...)
}
