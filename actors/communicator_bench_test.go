package actors_test

import (
	"context"
	"io"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/ranktree/ranktree/actors"
	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu"
	"github.com/ranktree/ranktree/internal/testrank"
)

// nopBackend completes every op at once: the cheapest possible engine, so
// that the benchmarks below measure launch-path overhead only.
type nopBackend struct{}

func (nopBackend) Name() string                        { return "nop" }
func (nopBackend) Rank() int                           { return 0 }
func (nopBackend) Size() int                           { return 1 }
func (nopBackend) Launch(op *comm.Op, p *comm.Promise) { p.Complete(nil) }
func (nopBackend) Abort(error)                         {}
func (nopBackend) AsyncError() error                   { return nil }
func (nopBackend) Close() error                        { return nil }

// benchLaunch measures one 4-element float32 all-reduce per iteration,
// issued and waited for, directly on be and through a ProcessGroup whose
// communicator actor owns be. The difference of the two ns/op figures is
// the actor launch overhead (goal: at most 5 µs).
func benchLaunch(b *testing.B, be comm.Backend) {
	ctx := context.Background()
	buf := comm.HostBuffer(make([]float32, 4))
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			op := &comm.Op{Type: comm.OpAllReduce, Reduce: comm.Sum, Root: -1, Peer: -1, In: []comm.Buffer{buf},
				FP: comm.Fingerprint{Op: comm.OpAllReduce, DType: comm.Float32, RedOp: comm.RedSum, Count: 4, Root: -1, Seq: uint64(i + 1)}}
			w := comm.NewPromise(comm.OpAllReduce)
			be.Launch(op, w)
			if err := w.Work().Wait(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	c, err := actors.NewCommunicator(testrank.QuietSystem(), be, actors.CommunicatorConfig{Group: "bench", Log: zerolog.New(io.Discard)})
	if err != nil {
		b.Fatal(err)
	}
	pg, err := comm.NewProcessGroup(comm.GroupConfig{Name: "bench", Rank: 0, Size: 1, Launcher: c, Engine: be.Name()})
	if err != nil {
		b.Fatal(err)
	}
	defer pg.Destroy(ctx)
	b.Run("processgroup", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if err := pg.AllReduce(ctx, buf, comm.Sum).Wait(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	// The same with every launch through the actor's mailbox: run by the
	// Submit's goroutine (synchronized dispatcher, the launch path before
	// the launch queue), or by the actor loop on its own goroutine (a
	// hand-off per op).
	for _, d := range []struct {
		name string
		disp actor.Dispatcher
	}{{"processgroup-mailbox", actor.NewSynchronizedDispatcher(300)}, {"processgroup-goroutine-dispatch", actor.NewDefaultDispatcher(300)}} {
		c2, err := actors.NewCommunicator(testrank.QuietSystem(), be, actors.CommunicatorConfig{
			Group: "bench2", Log: zerolog.New(io.Discard), Dispatcher: d.disp})
		if err != nil {
			b.Fatal(err)
		}
		pg2, err := comm.NewProcessGroup(comm.GroupConfig{Name: "bench2", Rank: 0, Size: 1, Launcher: c2, Engine: be.Name()})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(d.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if err := pg2.AllReduce(ctx, buf, comm.Sum).Wait(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("processgroup-pipelined", func(b *testing.B) {
		b.ReportAllocs()
		ws := make([]*comm.Work, 0, 64)
		for i := 0; i < b.N; i++ {
			ws = append(ws, pg.AllReduce(ctx, buf, comm.Sum))
			if len(ws) == cap(ws) || i == b.N-1 {
				for _, w := range ws {
					if err := w.Wait(ctx); err != nil {
						b.Fatal(err)
					}
				}
				ws = ws[:0]
			}
		}
	})
}

// BenchmarkLaunchOverhead compares the same op directly on an in-process
// engine that completes at once and through the ProcessGroup and actor.
func BenchmarkLaunchOverhead(b *testing.B) { benchLaunch(b, nopBackend{}) }

// BenchmarkLaunchOverheadCPU is the same comparison on the CPU engine with
// a world of one rank (its stream and progress goroutine included in both).
func BenchmarkLaunchOverheadCPU(b *testing.B) {
	e, err := cpu.New(context.Background(), comm.BackendConfig{Group: "bench", Rank: 0, Size: 1, Device: -1, Log: zerolog.New(io.Discard)}, cpu.Options{})
	if err != nil {
		b.Fatal(err)
	}
	benchLaunch(b, e)
}

// TestLaunchPathAllocs bounds the allocations of one small AllReduce
// through the ProcessGroup and the communicator on an engine that
// completes at once (issue 15): the one block of the Op and its Promise
// (newOp). The launch needs no mailbox message, the Work no channel
// (nobody blocks on it), and a cancellable ctx no registration per op
// (comm.CtxWatch): at most 1, for a ctx that is never done and for one
// that is.
func TestLaunchPathAllocs(t *testing.T) {
	c, err := actors.NewCommunicator(testrank.QuietSystem(), nopBackend{}, actors.CommunicatorConfig{Group: "allocs", Log: zerolog.New(io.Discard)})
	if err != nil {
		t.Fatal(err)
	}
	pg, err := comm.NewProcessGroup(comm.GroupConfig{Name: "allocs", Rank: 0, Size: 1, Launcher: c, Engine: "nop"})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Destroy(context.Background())
	buf := comm.HostBuffer(make([]float32, 1))
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, ctx := range []context.Context{context.Background(), cctx} {
		step := func() {
			if err := pg.AllReduce(ctx, buf, comm.Sum).Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
		for range 100 {
			step()
		}
		if a := testing.AllocsPerRun(500, step); a > 1 {
			t.Fatalf("%v allocations per AllReduce through the communicator (ctx done channel %v), want at most 1", a, ctx.Done() != nil)
		}
	}
}
