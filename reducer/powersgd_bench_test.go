package reducer

import (
	"testing"

	"github.com/ranktree/ranktree/comm"
)

// BenchmarkPowerSGDHook measures one synced iteration of the MNIST MLP's
// first layer (a 784×256 float32 weight and its bias in one bucket) on
// one rank of the in-memory test group, compressed from the first
// iteration (no error feedback or warm start: a fresh Q each time):
// PowerSGD at ranks 1 and 4 and the batched variant at rank 1. The time is
// the hook's compute (the compressed allreduces are small); the test
// double's element-wise allreduce is too slow to stand for the plain path,
// so compare wire time with the allreduce benchmarks. It reports the
// compression rate.
// Run: go test -run '^$' -bench PowerSGDHook ./reducer/
func BenchmarkPowerSGDHook(b *testing.B) {
	for _, tc := range []struct {
		name string
		rank int
		kind string
	}{{"powerSGD/rank=1", 1, "layer"}, {"powerSGD/rank=4", 4, "layer"}, {"batched/rank=1", 1, "batched"}} {
		b.Run(tc.name, func(b *testing.B) {
			groups, _ := newTestGroups(b, 1)
			m := newShapedModel([]int{784, 256}, []int{256})
			red, err := New(bg, groups[0], m.params, Config{})
			if err != nil {
				b.Fatal(err)
			}
			st, err := NewPowerSGDState(PowerSGDConfig{MatrixApproximationRank: tc.rank, MinCompressionRate: 2})
			if err != nil {
				b.Fatal(err)
			}
			hook := PowerSGDHook(st)
			if tc.kind == "batched" {
				hook = BatchedPowerSGDHook(st)
			}
			if err := red.RegisterCommHook(hook); err != nil {
				b.Fatal(err)
			}
			for p := range m.grads {
				denseGrad(m.grads[p], p, 0, 0)
			}
			step := func() {
				for _, p := range []int{1, 0} {
					if err := red.GradReady(p, comm.HostBuffer(m.grads[p])); err != nil {
						b.Fatal(err)
					}
				}
				if err := red.EndBackward(bg); err != nil {
					b.Fatal(err)
				}
			}
			step() // the rebuild
			b.ResetTimer()
			for b.Loop() {
				step()
			}
			rate, _, _ := st.CompressionStats()
			b.ReportMetric(rate, "compression-x")
			b.ReportMetric(float64(len(m.grads[0])+len(m.grads[1]))*4/1e6, "MB-grads")
		})
	}
}
