package kernel

import (
	"fmt"
	"testing"

	"github.com/ranktree/ranktree/comm"
)

// Benchmarks report GB/s of dst processed (each byte of dst is read and
// written and one byte of src read, so memory traffic is 3× that figure).
// Run: go test -run '^$' -bench . -benchtime 20x ./comm/cpu/kernel/

var benchSizes = []int{4 << 10, 1 << 20, 32 << 20}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	default:
		return fmt.Sprintf("%dKiB", n>>10)
	}
}

func reportGBps(b *testing.B, n int) {
	b.SetBytes(int64(n))
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}

// benchBuffers returns dst and two srcs, +x and -x: benchmarks alternate
// them so repeated sums stay bounded (no drift into Inf, which would take
// the slow path of the half-precision conversions).
func benchBuffers(n int, dt comm.DType) (dst []byte, src [2][]byte) {
	dst, src = alignedBytes(n, 0), [2][]byte{alignedBytes(n, 0), alignedBytes(n, 0)}
	for i := 0; i+dt.Size() <= n; i += dt.Size() {
		putFloat(dst[i:], dt, float64(i%97+1)*0.5)
		putFloat(src[0][i:], dt, float64(i%89+1)*0.25)
		putFloat(src[1][i:], dt, -float64(i%89+1)*0.25)
	}
	return dst, src
}

// naiveSumF32 is the plain Go loop the SIMD kernel is compared with.
func naiveSumF32(d, s []float32) {
	s = s[:len(d)]
	for i := range d {
		d[i] += s[i]
	}
}

func BenchmarkReduceFloat32Sum(b *testing.B) {
	for _, n := range benchSizes {
		dst, src := benchBuffers(n, comm.Float32)
		b.Run(sizeName(n), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				if err := Reduce(dst, src[i&1], comm.Float32, comm.Sum); err != nil {
					b.Fatal(err)
				}
			}
			reportGBps(b, n)
		})
	}
}

func BenchmarkNaiveFloat32Sum(b *testing.B) {
	for _, n := range benchSizes {
		dst, src := benchBuffers(n, comm.Float32)
		d, s := view[float32](dst), [2][]float32{view[float32](src[0]), view[float32](src[1])}
		b.Run(sizeName(n), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				naiveSumF32(d, s[i&1])
			}
			reportGBps(b, n)
		})
	}
}

func BenchmarkReduceParallelFloat32Sum(b *testing.B) {
	for _, n := range []int{1 << 20, 32 << 20} {
		dst, src := benchBuffers(n, comm.Float32)
		b.Run(sizeName(n), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				if err := ReduceParallel(dst, src[i&1], comm.Float32, comm.Sum); err != nil {
					b.Fatal(err)
				}
			}
			reportGBps(b, n)
		})
	}
}

func BenchmarkReduceFloat32Max(b *testing.B) {
	n := 1 << 20
	dst, src := benchBuffers(n, comm.Float32)
	for b.Loop() {
		if err := Reduce(dst, src[0], comm.Float32, comm.Max); err != nil {
			b.Fatal(err)
		}
	}
	reportGBps(b, n)
}

func BenchmarkReduceHalfSum(b *testing.B) {
	for _, dt := range []comm.DType{comm.Float16, comm.BFloat16} {
		for _, n := range []int{4 << 10, 1 << 20} {
			dst, src := benchBuffers(n, dt)
			b.Run(dt.String()+"/"+sizeName(n), func(b *testing.B) {
				for i := 0; b.Loop(); i++ {
					if err := Reduce(dst, src[i&1], dt, comm.Sum); err != nil {
						b.Fatal(err)
					}
				}
				reportGBps(b, n)
			})
		}
	}
}

func BenchmarkReduceInt64Sum(b *testing.B) {
	n := 1 << 20
	dst, src := benchBuffers(n, comm.Float64) // any bits will do
	for b.Loop() {
		if err := Reduce(dst, src[0], comm.Int64, comm.Sum); err != nil {
			b.Fatal(err)
		}
	}
	reportGBps(b, n)
}

func BenchmarkScaleFloat32(b *testing.B) {
	n := 1 << 20
	dst, _ := benchBuffers(n, comm.Float32)
	for b.Loop() {
		if err := Scale(dst, comm.Float32, 0.5); err != nil {
			b.Fatal(err)
		}
	}
	reportGBps(b, n)
}

func BenchmarkReduceSmallInts(b *testing.B) {
	n := 1 << 20
	dst, src := alignedBytes(n, 0), alignedBytes(n, 0)
	for i := range src {
		src[i] = byte(i * 7)
	}
	for _, c := range []struct {
		dt comm.DType
		op comm.ReduceOp
	}{{comm.Int8, comm.Sum}, {comm.Uint8, comm.Max}, {comm.Int32, comm.BXor}, {comm.Bool, comm.Sum}} {
		b.Run(c.dt.String()+"/"+c.op.String(), func(b *testing.B) {
			for b.Loop() {
				if err := Reduce(dst, src, c.dt, c.op); err != nil {
					b.Fatal(err)
				}
			}
			reportGBps(b, n)
		})
	}
}

// BenchmarkReduceComplexSum: complex sums run the float kernels over the
// parts, so their GB/s should match BenchmarkReduceFloat32Sum's (and the
// float64 kernel's).
func BenchmarkReduceComplexSum(b *testing.B) {
	for _, dt := range []comm.DType{comm.Complex64, comm.Complex128} {
		for _, n := range []int{4 << 10, 1 << 20} {
			dst, src := benchBuffers(n, dt.Real()) // parts are floats of the real type
			b.Run(dt.String()+"/"+sizeName(n), func(b *testing.B) {
				for i := 0; b.Loop(); i++ {
					if err := Reduce(dst, src[i&1], dt, comm.Sum); err != nil {
						b.Fatal(err)
					}
				}
				reportGBps(b, n)
			})
		}
	}
}
