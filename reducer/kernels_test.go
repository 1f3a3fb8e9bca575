package reducer

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/x448/float16"

	"github.com/ranktree/ranktree/comm"
)

// TestDivIntoMatchesScalar: divInto equals IEEE division bit for bit (as
// c10d's grad.div), in place and copying.
func TestDivIntoMatchesScalar(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, n := range []int{0, 1, 7, 8191, 8192, 8195, 3*8192 + 17} {
		for _, div := range []int{1, 2, 3, 4, 7, 8, 64} {
			s32, s64 := make([]float32, n), make([]float64, n)
			for i := range s32 {
				s32[i] = float32(rng.NormFloat64() * 1e3)
				s64[i] = rng.NormFloat64() * 1e3
				if i%5 == 0 { // subnormal and near-subnormal values
					s32[i] = math.Float32frombits(uint32(rng.IntN(1 << 24)))
					s64[i] = math.Float64frombits(uint64(rng.Int64N(1 << 53)))
				}
			}
			d32, d64 := make([]float32, n), make([]float64, n)
			if err := divInto(comm.HostBuffer(d32), comm.HostBuffer(s32), div); err != nil {
				t.Fatal(err)
			}
			if err := divInto(comm.HostBuffer(d64), comm.HostBuffer(s64), div); err != nil {
				t.Fatal(err)
			}
			for i := range s32 {
				if d32[i] != s32[i]/float32(div) || d64[i] != s64[i]/float64(div) {
					t.Fatalf("n=%d div=%d [%d]: %v %v, want %v %v", n, div, i, d32[i], d64[i], s32[i]/float32(div), s64[i]/float64(div))
				}
			}
			in := append([]float32(nil), s32...)
			if err := divInto(comm.HostBuffer(in), comm.HostBuffer(in), div); err != nil {
				t.Fatal(err)
			}
			for i := range in {
				if in[i] != s32[i]/float32(div) {
					t.Fatalf("in place n=%d div=%d [%d]: %v", n, div, i, in[i])
				}
			}
		}
	}
	if err := divInto(comm.HostBuffer(make([]float32, 2)), comm.HostBuffer(make([]float32, 3)), 2); err == nil {
		t.Error("length mismatch accepted")
	}
	if err := divInto(comm.HostBuffer(make([]int32, 2)), comm.HostBuffer(make([]int32, 2)), 2); err == nil {
		t.Error("int32 division accepted")
	}
}

// TestCastInto: float32 → float16/bfloat16 with division and back.
func TestCastInto(t *testing.T) {
	src := []float32{0, 1, -2, 65504, 32768, 0.5}
	h := make([]comm.Float16Value, len(src))
	b := make([]comm.BFloat16Value, len(src))
	if err := castInto(comm.HostBuffer(h), comm.HostBuffer(src), 2); err != nil {
		t.Fatal(err)
	}
	if err := castInto(comm.HostBuffer(b), comm.HostBuffer(src), 2); err != nil {
		t.Fatal(err)
	}
	back := make([]float32, len(src))
	for _, buf := range []comm.Buffer{comm.HostBuffer(h), comm.HostBuffer(b)} {
		if err := castInto(comm.HostBuffer(back), buf, 1); err != nil {
			t.Fatal(err)
		}
		for i, v := range src {
			if want := v / 2; back[i] != want && buf.DType() == comm.Float16 {
				t.Errorf("%v[%d] = %v, want %v", buf.DType(), i, back[i], want)
			} else if d := back[i] - want; buf.DType() == comm.BFloat16 && (d > want/128 || d < -want/128) && want > 0 {
				t.Errorf("%v[%d] = %v, want ≈%v", buf.DType(), i, back[i], want)
			}
		}
	}
	if h[4] != float16.Fromfloat32(16384) {
		t.Errorf("fp16 of 32768/2 = %v", h[4].Float32())
	}
}
