package kernel

import (
	"github.com/ranktree/ranktree/comm"
	"github.com/viterin/vek"
	"github.com/viterin/vek/vek32"
)

// reduceF32 reduces float32: Sum and Product with vek (AVX2 or its pure-Go
// fallback), Min and Max with minFloat/maxFloat.
func reduceF32(d, s []float32, t comm.RedOpType) {
	switch t {
	case comm.RedSum:
		vek32.Add_Inplace(d, s)
	case comm.RedProduct:
		vek32.Mul_Inplace(d, s)
	case comm.RedMin:
		minFloat(d, s)
	case comm.RedMax:
		maxFloat(d, s)
	default:
		panic("kernel: unreachable: float32 reduction " + t.String())
	}
}

// minFloat is the elementwise minimum with Go's builtin min semantics, which
// follow torch.minimum: a NaN in either operand gives NaN, and min(-0, +0)
// is -0 in either order (so results do not depend on which rank's chunk is
// dst). The builtin compiles to branch-free MINSS/MINSD sequences. vek's
// Minimum is not used: it does not propagate NaN consistently (its SIMD body
// keeps a NaN in dst, its scalar tail one in src), so ranks' chunks could
// disagree on NaN.
func minFloat[F float32 | float64](d, s []F) {
	s = s[:len(d)]
	for i := range d {
		d[i] = min(d[i], s[i])
	}
}

// maxFloat is minFloat for the maximum: NaN propagates, max(-0, +0) is +0.
func maxFloat[F float32 | float64](d, s []F) {
	s = s[:len(d)]
	for i := range d {
		d[i] = max(d[i], s[i])
	}
}

// reduceF64 is reduceF32 for float64.
func reduceF64(d, s []float64, t comm.RedOpType) {
	switch t {
	case comm.RedSum:
		vek.Add_Inplace(d, s)
	case comm.RedProduct:
		vek.Mul_Inplace(d, s)
	case comm.RedMin:
		minFloat(d, s)
	case comm.RedMax:
		maxFloat(d, s)
	default:
		panic("kernel: unreachable: float64 reduction " + t.String())
	}
}

// Scale multiplies every element of buf by f in place: buf[i] *= f. The
// engine uses it to finish Avg (f = 1/n, as ncclAvg) and to pre-multiply
// PreMulSum inputs (ncclRedOpCreatePreMulSum). float64 multiplies by f;
// float32 by float32(f); float16 and bfloat16 are widened to float32, scaled
// by float32(f) and rounded back (ties to even); complex64 and complex128
// multiply both parts by the real f (float32(f) for complex64), as torch
// scales view_as_real. f is not checked: a NaN or infinite f gives what
// IEEE multiplication gives. f == 1 returns at once.
//
// Errors (an *Error wrapping comm.ErrInvalidArgument, buf untouched): dt is
// not a floating or complex type, or len(buf) is not a whole number of
// elements.
func Scale(buf []byte, dt comm.DType, f float64) error {
	fail := func(msg string) error {
		return &Error{Func: "Scale", DType: dt, DstBytes: len(buf), SrcBytes: -1, Msg: msg}
	}
	if !dt.IsFloating() && !dt.IsComplex() {
		return fail("Scale needs a floating dtype (or a complex one)")
	}
	if len(buf)%dt.Size() != 0 {
		return fail("length is not a whole number of elements")
	}
	if f == 1 || len(buf) == 0 {
		return nil
	}
	if isAligned(buf, dt.Real().Size()) {
		scaleAligned(buf, dt, f)
		return nil
	}
	sc := getScratch()
	defer putScratch(sc)
	a := stage(&sc.sa)
	for off := 0; off < len(buf); off += stageBytes {
		n := min(stageBytes, len(buf)-off)
		copy(a[:n], buf[off:off+n])
		scaleAligned(a[:n], dt, f)
		copy(buf[off:off+n], a[:n])
	}
	return nil
}

// scaleAligned scales an aligned buffer of a floating dtype.
func scaleAligned(buf []byte, dt comm.DType, f float64) {
	switch dt {
	case comm.Float32, comm.Complex64:
		vek32.MulNumber_Inplace(view[float32](buf), float32(f))
	case comm.Float64, comm.Complex128:
		vek.MulNumber_Inplace(view[float64](buf), f)
	case comm.Float16:
		scaleHalf(view[uint16](buf), float32(f), f16ToF32, f32ToF16)
	case comm.BFloat16:
		scaleHalf(view[uint16](buf), float32(f), bf16ToF32, f32ToBF16)
	default:
		panic("kernel: unreachable: Scale checked IsFloating and IsComplex")
	}
}
