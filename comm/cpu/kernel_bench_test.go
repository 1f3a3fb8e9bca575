package cpu

import (
	"testing"

	"github.com/ranktree/ranktree/comm"
	"github.com/ranktree/ranktree/comm/cpu/kernel"
)

// BenchmarkReduceMemcpy is a reference for the allreduce figures: the
// float32 sum kernel and copy() on 32 MiB, on one goroutine.
func BenchmarkReduceMemcpy(b *testing.B) {
	dst := make([]byte, 32<<20)
	src := make([]byte, 32<<20)
	b.Run("reduce", func(b *testing.B) {
		b.SetBytes(int64(len(dst)))
		for b.Loop() {
			_ = kernel.Reduce(dst, src, comm.Float32, comm.Sum)
		}
	})
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(int64(len(dst)))
		for b.Loop() {
			copy(dst, src)
		}
	})
}
