package kernel

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ranktree/ranktree/comm"
	"github.com/x448/float16"
)

// TestScale checks Scale on every floating dtype, aligned and misaligned,
// against a per-element reference, and that f == 1 leaves bits untouched.
func TestScale(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 5))
	for _, dt := range []comm.DType{comm.Float32, comm.Float64, comm.Float16, comm.BFloat16} {
		for _, f := range []float64{0.25, 1.0 / 3, -2, 1} {
			for _, n := range []int{0, 1, 7, blockElems + 3, stageBytes/dt.Size() + 9} {
				for _, mis := range []int{0, 1} {
					buf := alignedBytes(n*dt.Size(), mis)
					randomElems(r, buf, dt)
					want := make([]byte, len(buf))
					sz := dt.Size()
					for i := 0; i < len(buf); i += sz {
						x := getFloat(buf[i:], dt)
						switch dt {
						case comm.Float64:
							putFloat(want[i:], dt, x*f)
						default: // float32 arithmetic, one rounding to the type
							putFloat32(want[i:], dt, float32(x)*float32(f))
						}
					}
					if f == 1 {
						copy(want, buf)
					}
					if err := Scale(buf, dt, f); err != nil {
						t.Fatal(err)
					}
					if i := firstDiff(buf, want, dt); i >= 0 {
						t.Fatalf("%v ×%v n=%d mis=%d: element %d = % x, want % x", dt, f, n, mis, i/sz, buf[i:i+sz], want[i:i+sz])
					}
				}
			}
		}
	}
}

// putFloat32 stores a float32 value rounded once to dt.
func putFloat32(b []byte, dt comm.DType, v float32) {
	switch dt {
	case comm.Float32:
		ne.PutUint32(b, math.Float32bits(v))
	case comm.Float16:
		ne.PutUint16(b, float16.Fromfloat32(v).Bits())
	case comm.BFloat16:
		ne.PutUint16(b, uint16(comm.BFloat16FromFloat32(v)))
	}
}

// TestScaleAvgExample is the Avg use: the sum of 4 ranks' 1.5 scaled by 1/4.
func TestScaleAvgExample(t *testing.T) {
	for _, dt := range []comm.DType{comm.Float32, comm.Float64, comm.Float16, comm.BFloat16} {
		buf := alignedBytes(3*dt.Size(), 0)
		for i := 0; i < 3; i++ {
			putFloat(buf[i*dt.Size():], dt, 6) // 4 ranks × 1.5
		}
		if err := Scale(buf, dt, 0.25); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			if got := getFloat(buf[i*dt.Size():], dt); got != 1.5 {
				t.Errorf("%v: 6 × 0.25 = %v, want 1.5", dt, got)
			}
		}
	}
}

// TestScaleErrors: non-floating dtypes and partial elements are rejected.
func TestScaleErrors(t *testing.T) {
	for _, c := range []struct {
		dt comm.DType
		n  int
	}{{comm.Int32, 8}, {comm.Bool, 3}, {comm.Uint8, 1}, {comm.DType(0), 4}, {comm.Float32, 6}} {
		buf := make([]byte, c.n)
		buf[0] = 9
		err := Scale(buf, c.dt, 0.5)
		var ke *Error
		if !errors.Is(err, comm.ErrInvalidArgument) || !errors.As(err, &ke) || ke.Func != "Scale" || ke.DstBytes != c.n {
			t.Errorf("Scale(%v, %d B): err = %v, want *Error wrapping ErrInvalidArgument", c.dt, c.n, err)
		}
		if buf[0] != 9 {
			t.Errorf("Scale(%v): buffer modified by a rejected call", c.dt)
		}
	}
}

// TestConvertAllPatterns widens every 16-bit pattern and narrows it back:
// non-NaN values round-trip exactly, NaN stays NaN; the widened value
// matches the reference conversions.
func TestConvertAllPatterns(t *testing.T) {
	forEachSIMDPath(t, testConvertAllPatterns)
}

func testConvertAllPatterns(t *testing.T) {
	for _, dt := range []comm.DType{comm.Float16, comm.BFloat16} {
		for _, mis := range []int{0, 1} {
			src := alignedBytes(1<<17, mis)
			for i := 0; i < 1<<16; i++ {
				ne.PutUint16(src[2*i:], uint16(i))
			}
			f := make([]float32, 1<<16)
			if err := ToFloat32(f, src, dt); err != nil {
				t.Fatal(err)
			}
			back := alignedBytes(1<<17, mis)
			if err := FromFloat32(back, f, dt); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 1<<16; i++ {
				want := float32(getFloat(src[2*i:], dt))
				if math.Float32bits(f[i]) != math.Float32bits(want) && !(f[i] != f[i] && want != want) {
					t.Fatalf("%v: widen %#04x = %v, want %v", dt, i, f[i], want)
				}
				got := ne.Uint16(back[2*i:])
				if isNaNAt(src[2*i:], dt) {
					if !isNaNAt(back[2*i:], dt) {
						t.Fatalf("%v: NaN %#04x narrowed to %#04x", dt, i, got)
					}
				} else if got != uint16(i) {
					t.Fatalf("%v: %#04x round-tripped to %#04x", dt, i, got)
				}
			}
		}
	}
	// float32 is a copy; other dtypes and wrong sizes are errors.
	f := []float32{1, -2.5}
	b := make([]byte, 8)
	if err := FromFloat32(b, f, comm.Float32); err != nil || math.Float32frombits(ne.Uint32(b[4:])) != -2.5 {
		t.Fatalf("FromFloat32 float32: %v % x", err, b)
	}
	g := make([]float32, 2)
	if err := ToFloat32(g, b, comm.Float32); err != nil || g[0] != 1 || g[1] != -2.5 {
		t.Fatalf("ToFloat32 float32: %v %v", err, g)
	}
	for _, err := range []error{
		ToFloat32(g, b, comm.Int32), FromFloat32(b, f, comm.Float64),
		ToFloat32(g, b[:3], comm.Float16), FromFloat32(b[:5], f, comm.BFloat16),
	} {
		if !errors.Is(err, comm.ErrInvalidArgument) {
			t.Errorf("conversion error = %v, want ErrInvalidArgument", err)
		}
	}
}

// TestNarrowRoundingMatchesX448 compares the float16 narrowing with
// x448/float16's Fromfloat32 on every representable half, the midpoints
// between neighbours (ties to even) and one float32 ulp either side of them,
// plus the overflow and underflow edges. NaN only has to stay NaN.
func TestNarrowRoundingMatchesX448(t *testing.T) {
	forEachSIMDPath(t, testNarrowRounding)
}

func testNarrowRounding(t *testing.T) {
	var in []float32
	for h := 0; h < 0x7c00; h++ { // positive finite halves; signs below
		lo := float16.Frombits(uint16(h)).Float32()
		hi := float16.Frombits(uint16(h + 1)).Float32() // 0x7c00 is +Inf
		mid := lo + (hi-lo)/2
		if math.IsInf(float64(hi), 1) {
			mid = 65520
		}
		in = append(in, lo, mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, float32(math.Inf(1))))
	}
	in = append(in, 1e-10, 1e-30, math.SmallestNonzeroFloat32, 65519.99, 65520, 65536, 1e20, float32(math.Inf(1)))
	r := rand.New(rand.NewPCG(1, 2))
	for range 1 << 16 {
		in = append(in, math.Float32frombits(r.Uint32()&0x7fffffff))
	}
	n := len(in)
	for i := range n {
		in = append(in, -in[i])
	}
	got := make([]uint16, len(in))
	f32ToF16(got, in)
	for i, f := range in {
		want := float16.Fromfloat32(f).Bits()
		if f != f {
			if got[i]&0x7fff <= 0x7c00 {
				t.Fatalf("NaN %#08x narrowed to non-NaN %#04x", math.Float32bits(f), got[i])
			}
			continue
		}
		if got[i] != want {
			t.Fatalf("f32ToF16(%v = %#08x) = %#04x, x448 gives %#04x", f, math.Float32bits(f), got[i], want)
		}
	}
}

// forEachSIMDPath runs f once; it is where a second, SIMD-only code path
// would be exercised if the kernels had one (they use vek and x448/float16).
func forEachSIMDPath(t *testing.T, f func(t *testing.T)) {
	t.Run("portable", f)
}

// TestBFloat16NarrowMatchesComm compares the bulk bfloat16 rounding with
// comm.BFloat16FromFloat32 bit for bit (NaNs included) on every bfloat16
// value, the exact midpoints to its neighbour and one ulp either side, and
// random float32 patterns.
func TestBFloat16NarrowMatchesComm(t *testing.T) {
	forEachSIMDPath(t, func(t *testing.T) {
		var in []uint32
		for h := range uint32(1 << 16) {
			u := h << 16
			in = append(in, u, u+0x8000, u+0x7fff, u+0x8001, u+0xffff)
		}
		r := rand.New(rand.NewPCG(8, 8))
		for range 1 << 16 {
			in = append(in, r.Uint32())
		}
		f := make([]float32, len(in))
		for i, u := range in {
			f[i] = math.Float32frombits(u)
		}
		got := make([]uint16, len(f))
		f32ToBF16(got, f)
		for i, u := range in {
			if want := uint16(comm.BFloat16FromFloat32(f[i])); got[i] != want {
				t.Fatalf("f32ToBF16(%#08x) = %#04x, comm gives %#04x", u, got[i], want)
			}
		}
	})
}

// TestFloatReducePaths checks the floating reductions against the reference
// on the assembly and the portable paths, on lengths that leave a tail after
// the 4- and 8-wide SIMD loops.
func TestFloatReducePaths(t *testing.T) {
	forEachSIMDPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(5, 5))
		for _, dt := range []comm.DType{comm.Float32, comm.Float64, comm.Float16, comm.BFloat16} {
			for _, op := range []comm.ReduceOp{comm.Sum, comm.Product, comm.Min, comm.Max, comm.Avg} {
				for _, n := range []int{1, 3, 4, 7, 8, 9, 17, 64, blockElems + 5} {
					for _, mis := range []int{0, 1} {
						dst, src := alignedBytes(n*dt.Size(), mis), alignedBytes(n*dt.Size(), 0)
						randomElems(r, dst, dt)
						randomElems(r, src, dt)
						checkAgainstRef(t, Reduce, dst, src, dt, op)
					}
				}
			}
		}
	})
}
