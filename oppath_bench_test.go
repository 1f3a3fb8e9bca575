package ranktree

import (
	"context"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/store"
	"github.com/ranktree/ranktree/supervisor"
)

// benchWorld starts a two-rank job in this process over the CPU engine's
// shared-memory transport, with the rank's full supervision (watchdog,
// flight recorder) as Init builds it; events are off (no NATS).
func benchWorld(tb testing.TB) []*Runtime {
	tb.Helper()
	ms := store.NewMemStore()
	return startShmPair(tb, func(int) []Option { return []Option{WithStore(ms), WithJob("bench")} }, nil)
}

// startShmPair starts a two-rank job in this process over the CPU engine's
// shared-memory transport, the environment cleared but for env (name,
// value pairs), with opts per rank; it closes the ranks at the end of the
// test.
func startShmPair(tb testing.TB, opts func(rank int) []Option, env []string) []*Runtime {
	tb.Helper()
	for _, v := range allVars {
		tb.Setenv(v, "")
	}
	tb.Setenv(EnvTransport, "shm")
	for i := 0; i+1 < len(env); i += 2 {
		tb.Setenv(env[i], env[i+1])
	}
	rts, errs := initWorld(nil, 2, opts)
	for r, err := range errs {
		if err != nil {
			tb.Fatalf("rank %d: %v", r, err)
		}
	}
	tb.Cleanup(func() {
		for _, rt := range rts {
			rt.Close(context.Background())
		}
	})
	return rts
}

// allReduce4B runs one 4-byte float32 sum allreduce on both ranks (rank 1
// on its own goroutine, paced by next/done) and checks the result. Both
// ranks pass ctx and opts to the op and ctx to Wait.
type allReduce4B struct {
	ctx  context.Context
	opts []comm.OpOption
	pgs  [2]*comm.ProcessGroup
	bufs [2][]float32
	next chan struct{}
	done chan error
}

func newAllReduce4B(tb testing.TB, rts []*Runtime, ctx context.Context, opts ...comm.OpOption) *allReduce4B {
	a := &allReduce4B{ctx: ctx, opts: opts, next: make(chan struct{}), done: make(chan error)}
	for r := range 2 {
		a.pgs[r], a.bufs[r] = rts[r].World(), make([]float32, 1)
	}
	buf1 := comm.HostBuffer(a.bufs[1])
	go func() {
		for range a.next {
			a.bufs[1][0] = 2
			a.done <- a.pgs[1].AllReduce(ctx, buf1, comm.Sum, opts...).Wait(ctx)
		}
	}()
	tb.Cleanup(func() { close(a.next) })
	return a
}

func (a *allReduce4B) step(tb testing.TB, buf0 comm.Buffer) {
	ctx := a.ctx
	a.bufs[0][0] = 1
	a.next <- struct{}{}
	if err := a.pgs[0].AllReduce(ctx, buf0, comm.Sum, a.opts...).Wait(ctx); err != nil {
		tb.Fatalf("rank 0: %v", err)
	}
	if err := <-a.done; err != nil {
		tb.Fatalf("rank 1: %v", err)
	}
	if a.bufs[0][0] != 3 {
		tb.Fatalf("rank 0 has %v, want 1+2", a.bufs[0][0])
	}
}

// BenchmarkAllReduce4BPublicPath times one 4-byte allreduce through the
// whole public path (ProcessGroup.AllReduce → communicator → watchdog and
// flight recorder → CPU engine over shm → Work.Wait) with two ranks in
// this process; allocs/op counts both ranks. The ctx is never done.
func BenchmarkAllReduce4BPublicPath(b *testing.B) {
	benchPublicPath(b, context.Background())
}

// BenchmarkAllReduce4BPublicPathCancelCtx is the same with a cancellable
// ctx, as allreduce-bench and training loops pass (signal.NotifyContext):
// the communicator watches it for every op.
func BenchmarkAllReduce4BPublicPathCancelCtx(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	benchPublicPath(b, ctx)
}

// BenchmarkAllReduce4BPublicPathBlocking is BenchmarkAllReduce4BPublicPath
// in the blocking form (comm.Blocking), whose op blocks are recycled.
func BenchmarkAllReduce4BPublicPathBlocking(b *testing.B) {
	benchPublicPath(b, context.Background(), comm.Blocking())
}

// BenchmarkAllReduce4BPublicPathBlockingCancelCtx is the blocking form
// with a cancellable ctx.
func BenchmarkAllReduce4BPublicPathBlockingCancelCtx(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	benchPublicPath(b, ctx, comm.Blocking())
}

func benchPublicPath(b *testing.B, ctx context.Context, opts ...comm.OpOption) {
	rts := benchWorld(b)
	a := newAllReduce4B(b, rts, ctx, opts...)
	buf0 := comm.HostBuffer(a.bufs[0])
	for range 200 {
		a.step(b, buf0)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		a.step(b, buf0)
	}
}

// TestPublicPathAllocs bounds the allocations of a small async allreduce
// on the whole public path, supervision included (issue 15): one per
// rank, the block of the Op and its Promise, which the caller's *Work
// lives in (comm/opblock.go), for a ctx that is never done and for a
// cancellable one. The blocking form allocates none
// (TestBlockingPublicPathAllocs).
func TestPublicPathAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a two-rank job")
	}
	rts := benchWorld(t)
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, ctx := range []context.Context{context.Background(), cctx} {
		a := newAllReduce4B(t, rts, ctx)
		buf0 := comm.HostBuffer(a.bufs[0])
		step := func() { a.step(t, buf0) }
		// Past a few watchdog ticks (supervisor.DefaultWatchdogInterval),
		// so that the watchdog's records are recycled (steady state).
		for end := time.Now().Add(4 * supervisor.DefaultWatchdogInterval); time.Now().Before(end); {
			step()
		}
		if n := testing.AllocsPerRun(2000, step); n > 2 {
			t.Errorf("%v allocations per allreduce on two ranks (ctx done channel %v), want at most 1 per rank", n, ctx.Done() != nil)
		}
	}
}
