package ranktree

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu"
	"github.com/ranktree/ranktree/internal/testrank"
	"github.com/ranktree/ranktree/store"
)

// startRanks runs Init for n ranks as goroutines sharing one MemStore and
// returns their runtimes (closed at cleanup).
func startRanks(t *testing.T, n int, opts ...Option) []*Runtime {
	t.Helper()
	st := store.NewMemStore()
	rts := make([]*Runtime, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			o := append([]Option{WithStore(st), WithRank(r), WithWorldSize(n), WithJob("wt"),
				WithLocalRank(r), WithLocalWorldSize(n), WithNodeRank(0), WithRestartCount(0),
				WithNATSURL("unused://"), WithLogger(zerolog.Nop()), WithTimeout(20 * time.Second)}, opts...)
			rts[r], errs[r] = Init(context.Background(), o...)
		}(r)
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: Init: %v", r, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, rt := range rts {
			if err := rt.Close(ctx); err != nil {
				t.Errorf("Close: %v", err)
			}
		}
	})
	return rts
}

// eachRank runs f for every rank concurrently (testrank.Ranks: a hang is
// reported with the ranks that did not finish) and fails on any error.
func eachRank(t *testing.T, rts []*Runtime, f func(rt *Runtime) error) {
	t.Helper()
	if err := testrank.Ranks(len(rts), 60*time.Second, func(r int) error { return f(rts[r]) }); err != nil {
		t.Fatal(err)
	}
}

func TestWorldAllReduceAndSubgroup(t *testing.T) {
	const n = 3
	rts := startRanks(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	eachRank(t, rts, func(rt *Runtime) error {
		pg := rt.World()
		if pg.Rank() != rt.Rank() || pg.Size() != n {
			t.Errorf("world group rank/size %d/%d, want %d/%d", pg.Rank(), pg.Size(), rt.Rank(), n)
		}
		x := []float32{float32(rt.Rank() + 1), 10}
		if err := pg.AllReduce(ctx, comm.HostBuffer(x), comm.Sum).Wait(ctx); err != nil {
			return err
		}
		if x[0] != n*(n+1)/2 || x[1] != 10*n {
			t.Errorf("rank %d: allreduce got %v", rt.Rank(), x)
		}
		sub, err := rt.NewGroup(ctx, []int{0, 2})
		if err != nil {
			return err
		}
		y := []int64{int64(rt.Rank())}
		if sub.Rank() < 0 {
			if rt.Rank() != 1 {
				t.Errorf("rank %d: not a member of [0 2]", rt.Rank())
			}
			return nil
		}
		if err := sub.AllReduce(ctx, comm.HostBuffer(y), comm.Sum).Wait(ctx); err != nil {
			return err
		}
		if y[0] != 2 {
			t.Errorf("rank %d: subgroup allreduce got %d, want 2", rt.Rank(), y[0])
		}
		return nil
	})
}

// TestWithDevice: WithDevice gives every group's engine that CUDA ordinal
// (here through a wrapped CPU engine that records it); a negative ordinal
// is an *OptionError naming the option.
func TestWithDevice(t *testing.T) {
	var mu sync.Mutex
	var devices []int
	inner := cpu.Factory(cpu.Options{})
	rec := WithBackend(func(ctx context.Context, cfg comm.BackendConfig) (comm.Backend, error) {
		mu.Lock()
		devices = append(devices, cfg.Device)
		mu.Unlock()
		cfg.Device = -1 // the CPU engine runs on the host
		return inner(ctx, cfg)
	})
	rts := startRanks(t, 1, rec, WithDevice(3))
	if _, err := rts[0].NewGroup(context.Background(), []int{0}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := append([]int(nil), devices...)
	mu.Unlock()
	if len(got) != 2 || got[0] != 3 || got[1] != 3 {
		t.Fatalf("engines created on devices %v, want [3 3]", got)
	}

	_, err := Init(context.Background(), WithStore(store.NewMemStore()), WithRank(0), WithDevice(-1))
	var oe *OptionError
	if !errors.As(err, &oe) || !strings.Contains(err.Error(), "WithDevice(-1)") {
		t.Fatalf("Init with WithDevice(-1): %v", err)
	}
}
