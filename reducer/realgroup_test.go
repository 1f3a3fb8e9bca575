package reducer

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu"
	"github.com/ranktree/ranktree/internal/testrank"
	"github.com/ranktree/ranktree/store"
)

// newCPUGroups returns n real in-process process groups: comm.ProcessGroup
// over communicator actors over the built-in CPU engine (comm/cpu),
// connected through an in-memory store, ranks as goroutines.
func newCPUGroups(t testing.TB, n int) []Group {
	t.Helper()
	return newCPUGroupsWith(t, n, cpu.Options{})
}

// newCPUGroupsWith is newCPUGroups with engine options (e.g. a transport).
func newCPUGroupsWith(t testing.TB, n int, opts cpu.Options) []Group {
	t.Helper()
	sys := testrank.QuietSystem()
	st := store.NewMemStore(store.WithMemTimeout(30 * time.Second))
	f := testrank.BackendFactoryFactory(sys, "cpu", cpu.Factory(opts), st, zerolog.Nop())
	pgs := make([]*comm.ProcessGroup, n)
	errs := make([]error, n)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pgs[r], errs[r] = f.World(ctx, r, n)
		}()
	}
	wg.Wait()
	groups := make([]Group, n)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: creating the CPU process group: %v", r, err)
		}
		groups[r] = pgs[r]
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for _, pg := range pgs {
			wg.Add(1)
			go func() { defer wg.Done(); _ = pg.Destroy(ctx) }()
		}
		wg.Wait()
		sys.Shutdown()
	})
	return groups
}

// eachWorld runs fn as subtests on n ranks of each group implementation:
// the real CPU engine ("cpu"; w is nil) and the in-memory double
// ("memtest"; w gives its launch log).
func eachWorld(t *testing.T, n int, fn func(t *testing.T, groups []Group, w *memWorld)) {
	t.Helper()
	t.Run("cpu", func(t *testing.T) { fn(t, newCPUGroups(t, n), nil) })
	t.Run("memtest", func(t *testing.T) {
		groups, w := newTestGroups(t, n)
		fn(t, groups, w)
	})
}

// The real process group satisfies Group.
var _ Group = (*comm.ProcessGroup)(nil)
