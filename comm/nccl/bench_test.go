package nccl_test

import (
	"context"
	"testing"
	"time"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/nccl"
)

// BenchmarkAllReduce4B is the host time of one 4-byte allreduce through the
// engine, launched and waited for one at a time (on the fake library in CI:
// that measures ranktree's own overhead; on a GPU the full round trip).
func BenchmarkAllReduce4B(b *testing.B) {
	e, op := engineFor(b, nccl.Options{EagerInit: true})
	benchSync(b, e, op)
}

// BenchmarkAllReduce4BSpin is BenchmarkAllReduce4B with the launch
// goroutine and the waiter spinning (SpinIdle, SpinWait 200 µs, as the
// defaults are on hosts with GOMAXPROCS ≥ 4): no OS wake-up per op.
func BenchmarkAllReduce4BSpin(b *testing.B) {
	e, op := engineFor(b, nccl.Options{EagerInit: true, SpinIdle: 200 * time.Microsecond, SpinWait: 200 * time.Microsecond})
	benchSync(b, e, op)
}

// BenchmarkAllReduce4BNoSpin is BenchmarkAllReduce4B with spinning off
// (the defaults on hosts with GOMAXPROCS < 4).
func BenchmarkAllReduce4BNoSpin(b *testing.B) {
	e, op := engineFor(b, nccl.Options{EagerInit: true, SpinIdle: -1, SpinWait: -1})
	benchSync(b, e, op)
}

func benchSync(b *testing.B, e *nccl.Engine, op *comm.Op) {
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p := comm.NewPromise(comm.OpAllReduce)
		e.Launch(op, p)
		if err := p.Work().Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAllReduce4BPipelined launches b.N ops back to back and waits for
// them all: the launch cost per op.
func BenchmarkAllReduce4BPipelined(b *testing.B) {
	e, op := engineFor(b, nccl.Options{EagerInit: true})
	ctx := context.Background()
	ws := make([]*comm.Promise, b.N)
	b.ResetTimer()
	for i := range ws {
		ws[i] = comm.NewPromise(comm.OpAllReduce)
		e.Launch(op, ws[i])
	}
	for _, w := range ws {
		if err := w.Work().Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
