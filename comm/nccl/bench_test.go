package nccl_test

import (
	"context"
	"testing"

	"github.com/ranktree/ranktree/comm"
)

// BenchmarkAllReduce4B is the host time of one 4-byte allreduce through the
// engine, launched and waited for one at a time (on the fake library in CI:
// that measures ranktree's own overhead; on a GPU the full round trip).
func BenchmarkAllReduce4B(b *testing.B) {
	e, op := engineFor(b)
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w := comm.NewWork(comm.OpAllReduce)
		e.Launch(op, w)
		if err := w.Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAllReduce4BPipelined launches b.N ops back to back and waits for
// them all: the launch cost per op.
func BenchmarkAllReduce4BPipelined(b *testing.B) {
	e, op := engineFor(b)
	ctx := context.Background()
	ws := make([]*comm.Work, b.N)
	b.ResetTimer()
	for i := range ws {
		ws[i] = comm.NewWork(comm.OpAllReduce)
		e.Launch(op, ws[i])
	}
	for _, w := range ws {
		if err := w.Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
