package model

import (
	"math/rand/v2"
	"strconv"
	"testing"
)

// BenchmarkTrainStep measures one forward+backward+SGD step of the MNIST
// MLP; samples/s is reported as a custom metric.
func BenchmarkTrainStep(b *testing.B) {
	for _, batch := range []int{64, 128} {
		b.Run("batch"+strconv.Itoa(batch), func(b *testing.B) {
			m, _ := New(MNISTSizes, 1)
			rng := rand.New(rand.NewPCG(1, 1))
			x, y := randomBatch(rng, batch, MNISTSizes[0], 10)
			ws := m.NewWorkspace(batch)
			grad := make([]float32, m.NumParams())
			opt, _ := NewSGD(0.01, 0.9, 0, false)
			b.ResetTimer()
			for b.Loop() {
				if _, _, err := m.LossAndGrad(ws, x, y, grad, nil); err != nil {
					b.Fatal(err)
				}
				if err := opt.Step(m.Params, grad); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(batch*b.N)/b.Elapsed().Seconds(), "samples/s")
		})
	}
}
