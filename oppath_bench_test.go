package ranktree

import (
	"context"
	"testing"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/store"
)

// benchWorld starts a two-rank job in this process over the CPU engine's
// shared-memory transport, with the rank's full supervision (watchdog,
// flight recorder) as Init builds it; events are off (no NATS).
func benchWorld(tb testing.TB) []*Runtime {
	tb.Helper()
	for _, v := range allVars {
		tb.Setenv(v, "")
	}
	tb.Setenv(EnvTransport, "shm")
	ms := store.NewMemStore()
	rts, errs := initWorld(nil, 2, func(int) []Option { return []Option{WithStore(ms), WithJob("bench")} })
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
// on its own goroutine, paced by next/done) and checks the result.
type allReduce4B struct {
	pgs  [2]*comm.ProcessGroup
	bufs [2][]float32
	next chan struct{}
	done chan error
}

func newAllReduce4B(tb testing.TB, rts []*Runtime) *allReduce4B {
	a := &allReduce4B{next: make(chan struct{}), done: make(chan error)}
	for r := range 2 {
		a.pgs[r], a.bufs[r] = rts[r].World(), make([]float32, 1)
	}
	ctx := context.Background()
	buf1 := comm.HostBuffer(a.bufs[1])
	go func() {
		for range a.next {
			a.bufs[1][0] = 2
			a.done <- a.pgs[1].AllReduce(ctx, buf1, comm.Sum).Wait(ctx)
		}
	}()
	tb.Cleanup(func() { close(a.next) })
	return a
}

func (a *allReduce4B) step(tb testing.TB, buf0 comm.Buffer) {
	ctx := context.Background()
	a.bufs[0][0] = 1
	a.next <- struct{}{}
	if err := a.pgs[0].AllReduce(ctx, buf0, comm.Sum).Wait(ctx); err != nil {
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
// whole public path (ProcessGroup.AllReduce → communicator actor → watchdog
// and flight recorder → CPU engine over shm → Work.Wait) with two ranks in
// this process; allocs/op counts both ranks.
func BenchmarkAllReduce4BPublicPath(b *testing.B) {
	rts := benchWorld(b)
	a := newAllReduce4B(b, rts)
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
