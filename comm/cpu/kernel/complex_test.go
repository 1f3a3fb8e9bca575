package kernel

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"

	"github.com/ranktree/ranktree/comm"
)

// complexBytes views a complex slice's memory as bytes.
func complexBytes[C complex64 | complex128](s []C) []byte { return asBytes(s) }

// randComplex returns n random complex values with parts in [-8, 8).
func randComplex[C complex64 | complex128](r *rand.Rand, n int) []C {
	s := make([]C, n)
	for i := range s {
		s[i] = C(complex(r.Float64()*16-8, r.Float64()*16-8))
	}
	return s
}

// TestComplexReduce checks complex Sum (and Avg/PreMulSum, which reduce as
// Sum) against Go's complex addition, which adds the parts: aligned,
// misaligned (a complex128 view 4 bytes off goes through the staged path),
// aliased, and with ReduceParallel above its threshold.
func TestComplexReduce(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 9))
	for _, op := range []comm.ReduceOp{comm.Sum, comm.Avg, comm.PreMulSum(3)} {
		for _, n := range []int{0, 1, 3, 9, blockElems + 5, ParallelThreshold/8 + 3} {
			a64, b64 := randComplex[complex64](r, n), randComplex[complex64](r, n)
			want64 := make([]complex64, n)
			for i := range want64 {
				want64[i] = a64[i] + b64[i]
			}
			if err := ReduceParallel(complexBytes(a64), complexBytes(b64), comm.Complex64, op); err != nil {
				t.Fatal(err)
			}
			for i := range a64 {
				if a64[i] != want64[i] {
					t.Fatalf("complex64 %v n=%d: element %d = %v, want %v", op, n, i, a64[i], want64[i])
				}
			}
			for _, mis := range []int{0, 4} {
				a128, b128 := randComplex[complex128](r, n), randComplex[complex128](r, n)
				want := make([]complex128, n)
				for i := range want {
					want[i] = a128[i] + b128[i]
				}
				dst := alignedBytes(n*16, mis)
				copy(dst, complexBytes(a128))
				if err := Reduce(dst, complexBytes(b128), comm.Complex128, op); err != nil {
					t.Fatal(err)
				}
				for i := range want {
					got := *(*complex128)(unsafe.Pointer(&append([]byte(nil), dst[i*16:i*16+16]...)[0]))
					if got != want[i] {
						t.Fatalf("complex128 %v n=%d mis=%d: element %d = %v, want %v", op, n, mis, i, got, want[i])
					}
				}
			}
		}
	}
	// Aliased: x + x.
	x := []complex64{1 + 2i, -3 - 4i}
	if err := Reduce(complexBytes(x), complexBytes(x), comm.Complex64, comm.Sum); err != nil {
		t.Fatal(err)
	}
	if x[0] != 2+4i || x[1] != -6-8i {
		t.Fatalf("aliased complex64 sum: %v", x)
	}
}

// TestComplexScale: Scale multiplies both parts by the real factor (Avg's
// 1/n, PreMulSum's factor), aligned and misaligned.
func TestComplexScale(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	for _, f := range []float64{0.25, -2, 1.0 / 3} {
		for _, n := range []int{0, 1, 7, stageBytes/16 + 5} {
			c64 := randComplex[complex64](r, n)
			want64 := make([]complex64, n)
			for i, c := range c64 {
				want64[i] = complex(real(c)*float32(f), imag(c)*float32(f))
			}
			if err := Scale(complexBytes(c64), comm.Complex64, f); err != nil {
				t.Fatal(err)
			}
			for i := range c64 {
				if c64[i] != want64[i] {
					t.Fatalf("complex64 ×%v: element %d = %v, want %v", f, i, c64[i], want64[i])
				}
			}
			for _, mis := range []int{0, 4} {
				c128 := randComplex[complex128](r, n)
				buf := alignedBytes(n*16, mis)
				copy(buf, complexBytes(c128))
				if err := Scale(buf, comm.Complex128, f); err != nil {
					t.Fatal(err)
				}
				for i, c := range c128 {
					got := *(*complex128)(unsafe.Pointer(&append([]byte(nil), buf[i*16:i*16+16]...)[0]))
					if want := complex(real(c)*f, imag(c)*f); got != want {
						t.Fatalf("complex128 ×%v mis=%d: element %d = %v, want %v", f, mis, i, got, want)
					}
				}
			}
		}
	}
}

// TestComplexRefusedOps: Product, Min, Max and the bitwise ops on complex
// dtypes fail (torch refuses them on complex tensors) with an error naming
// the op and the dtype, and dst is untouched; a partial element too.
func TestComplexRefusedOps(t *testing.T) {
	for _, dt := range []comm.DType{comm.Complex64, comm.Complex128} {
		for _, op := range []comm.ReduceOp{comm.Product, comm.Min, comm.Max, comm.BAnd, comm.BOr, comm.BXor} {
			dst, src := alignedBytes(2*dt.Size(), 0), alignedBytes(2*dt.Size(), 0)
			for i := range dst {
				dst[i], src[i] = byte(i), byte(3*i)
			}
			before := string(dst)
			err := Reduce(dst, src, dt, op)
			if !errors.Is(err, comm.ErrInvalidArgument) || !strings.Contains(err.Error(), dt.String()) || !strings.Contains(err.Error(), op.Type().String()) {
				t.Fatalf("%v %v: err %v, want ErrInvalidArgument naming both", dt, op, err)
			}
			if string(dst) != before {
				t.Fatalf("%v %v: dst changed", dt, op)
			}
		}
		if err := Reduce(make([]byte, dt.Size()+4), make([]byte, dt.Size()+4), dt, comm.Sum); !errors.Is(err, comm.ErrInvalidArgument) {
			t.Fatalf("%v: partial element: %v", dt, err)
		}
		if err := Scale(make([]byte, dt.Size()/2), dt, 2); !errors.Is(err, comm.ErrInvalidArgument) {
			t.Fatalf("%v: Scale of a partial element: %v", dt, err)
		}
	}
}
