package ranktree

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/store/natsstore"
	"github.com/ranktree/ranktree/supervisor"
)

// supervisedWorld starts a two-rank job in this process over the CPU
// engine's shared-memory transport with everything a rank supervises an op
// with: the watchdog, the flight recorder, work events published on NATS
// (an embedded server, also the job's store) and Prometheus metrics.
func supervisedWorld(tb testing.TB) []*Runtime {
	tb.Helper()
	url, stop, err := natsstore.StartEmbedded(natsstore.EmbeddedOptions{StoreDir: tb.TempDir()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(stop)
	rts := startShmPair(tb, func(int) []Option { return []Option{WithNATSURL(url), WithJob("allocs")} },
		[]string{EnvMetricsAddr, "127.0.0.1:0"})
	if rts[0].NATS() == nil {
		tb.Fatal("no NATS connection: work events would be off")
	}
	return rts
}

// pairOp runs one op on both ranks of a two-rank world: rank 1 on its own
// goroutine, paced by next and done, rank 0 on the caller's.
type pairOp struct {
	next chan struct{}
	done chan error
	op   func(r int) error
}

func newPairOp(tb testing.TB, op func(r int) error) *pairOp {
	p := &pairOp{next: make(chan struct{}), done: make(chan error), op: op}
	go func() {
		for range p.next {
			p.done <- op(1)
		}
	}()
	tb.Cleanup(func() { close(p.next) })
	return p
}

func (p *pairOp) step(tb testing.TB) {
	p.next <- struct{}{}
	if err := p.op(0); err != nil {
		tb.Fatalf("rank 0: %v", err)
	}
	if err := <-p.done; err != nil {
		tb.Fatalf("rank 1: %v", err)
	}
}

// mallocsPer is the exact mean number of heap allocations per call of f
// over n calls (testing.AllocsPerRun rounds down).
func mallocsPer(n int, f func()) float64 {
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	for range n {
		f()
	}
	runtime.ReadMemStats(&b)
	return float64(b.Mallocs-a.Mallocs) / float64(n)
}

// hotOps are the collectives a training step issues small and often, in
// their blocking form (comm.Blocking), each checking its result.
func hotOps(rts []*Runtime, ctx context.Context) map[string]func(r int) error {
	type bufs struct{ a, b []float32 }
	var bs [2]bufs
	for r := range bs {
		bs[r] = bufs{make([]float32, 2), make([]float32, 4)}
	}
	pg := func(r int) *comm.ProcessGroup { return rts[r].World() }
	check := func(got, want float32) error {
		if got != want {
			return &comm.ArgError{Msg: "wrong result"}
		}
		return nil
	}
	return map[string]func(r int) error{
		"AllReduce": func(r int) error {
			b := bs[r].a[:1]
			b[0] = float32(r + 1)
			if err := pg(r).AllReduce(ctx, comm.HostBuffer(b), comm.Sum, comm.Blocking()).Err(); err != nil {
				return err
			}
			return check(b[0], 3)
		},
		"Broadcast": func(r int) error {
			b := bs[r].a[:1]
			b[0] = float32(r + 5)
			if err := pg(r).Broadcast(ctx, comm.HostBuffer(b), 0, comm.Blocking()).Err(); err != nil {
				return err
			}
			return check(b[0], 5)
		},
		"AllGatherInto": func(r int) error {
			in, out := bs[r].a[:1], bs[r].b[:2]
			in[0] = float32(r + 1)
			if err := pg(r).AllGatherInto(ctx, comm.HostBuffer(out), comm.HostBuffer(in), comm.Blocking()).Err(); err != nil {
				return err
			}
			return check(out[0]+10*out[1], 21)
		},
		"ReduceScatterTensor": func(r int) error {
			in, out := bs[r].b[:2], bs[r].a[:1]
			in[0], in[1] = 1, 2
			if err := pg(r).ReduceScatterTensor(ctx, comm.HostBuffer(out), comm.HostBuffer(in), comm.Sum, comm.Blocking()).Err(); err != nil {
				return err
			}
			return check(out[0], float32(2*(r+1)))
		},
		"Barrier": func(r int) error {
			return pg(r).Barrier(ctx, comm.Blocking()).Err()
		},
	}
}

// allocRuns is how many ops the allocation counts run (fewer under the
// race detector, which only checks the same paths for races).
var allocRuns = map[bool]int{false: 2000, true: 300}[raceEnabled]

// warm runs step until the op blocks' pool has filled (every block the
// watchdog holds between drains, and the test binary's quarantine of
// released blocks), and, the first time (ticks), until the watchdog has
// ticked a few times: the steady state.
func warm(step func(), ticks bool) {
	if ticks {
		for end := time.Now().Add(4 * supervisor.DefaultWatchdogInterval); time.Now().Before(end); {
			step()
		}
	}
	for range allocRuns {
		step()
	}
}

// TestBlockingPublicPathAllocs asserts that the blocking form
// (comm.Blocking) of the hot small collectives allocates nothing per op
// in steady state on the whole public path of two ranks, supervision
// included (watchdog, flight recorder, work events, metrics), for a ctx
// that is never done and for a cancellable one (issue 15); the async
// form still allocates its op block, one per rank. Under the race
// detector it runs the same ops (the recycling's holders on every
// goroutine of the rank) without asserting the counts.
func TestBlockingPublicPathAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a two-rank job")
	}
	rts := supervisedWorld(t)
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := true
	for _, ctx := range []context.Context{context.Background(), cctx} {
		name := map[bool]string{false: "never-done ctx", true: "cancellable ctx"}[ctx.Done() != nil]
		ops := hotOps(rts, ctx)
		for _, op := range []string{"AllReduce", "Broadcast", "AllGatherInto", "ReduceScatterTensor", "Barrier"} {
			p := newPairOp(t, ops[op])
			step := func() { p.step(t) }
			warm(step, first)
			first = false
			n := testing.AllocsPerRun(allocRuns, step)
			exact := mallocsPer(2*allocRuns, step)
			t.Logf("%s blocking, %s: %v allocations per op on two ranks (%.4f exactly)", op, name, n, exact)
			if n != 0 && !raceEnabled {
				t.Errorf("%s blocking, %s: %v allocations per op on two ranks, want 0", op, name, n)
			}
		}
		a := newAllReduce4B(t, rts, ctx)
		buf0 := comm.HostBuffer(a.bufs[0])
		step := func() { a.step(t, buf0) }
		warm(step, false)
		n := testing.AllocsPerRun(allocRuns, step)
		t.Logf("AllReduce async, %s: %v allocations per op on two ranks (%.4f exactly)", name, n, mallocsPer(2*allocRuns, step))
		if n > 2 && !raceEnabled {
			t.Errorf("AllReduce async, %s: %v allocations per op on two ranks, want at most 1 per rank", name, n)
		}
	}
}
