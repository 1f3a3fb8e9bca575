package kernel

import (
	"github.com/ranktree/ranktree/comm"
	"github.com/viterin/vek/vek32"
	"github.com/x448/float16"
)

// widenFunc converts 16-bit elements to float32 (len(dst) == len(src)).
type widenFunc func(dst []float32, src []uint16)

// narrowFunc rounds float32 to 16-bit elements (len(dst) == len(src)).
type narrowFunc func(dst []uint16, src []float32)

// reduceHalf reduces float16 or bfloat16 through float32 scratch blocks: both
// operands are widened exactly, reduced with the float32 kernel, and the
// result is rounded once to the 16-bit type.
func reduceHalf(d, s []uint16, t comm.RedOpType, widen widenFunc, narrow narrowFunc) {
	if len(d) == 0 {
		return
	}
	sc := getScratch()
	defer putScratch(sc)
	for off := 0; off < len(d); off += blockElems {
		n := min(blockElems, len(d)-off)
		a, b := sc.fa[:n], sc.fb[:n]
		widen(a, d[off:off+n])
		widen(b, s[off:off+n])
		reduceF32(a, b, t)
		narrow(d[off:off+n], a)
	}
}

// scaleHalf multiplies float16 or bfloat16 elements by f through float32.
func scaleHalf(d []uint16, f float32, widen widenFunc, narrow narrowFunc) {
	sc := getScratch()
	defer putScratch(sc)
	for off := 0; off < len(d); off += blockElems {
		n := min(blockElems, len(d)-off)
		a := sc.fa[:n]
		widen(a, d[off:off+n])
		vek32.MulNumber_Inplace(a, f)
		narrow(d[off:off+n], a)
	}
}

// f16ToF32 widens IEEE binary16 bit patterns to float32 (exact) with
// x448/float16.
func f16ToF32(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = float16.Frombits(h).Float32()
	}
}

// f32ToF16 rounds float32 to binary16 with x448/float16: nearest, ties to
// even; overflow to ±Inf; NaN stays NaN.
func f32ToF16(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, f := range src {
		dst[i] = float16.Fromfloat32(f).Bits()
	}
}

// bf16ToF32 widens bfloat16 bit patterns to float32 (exact: a shift).
func bf16ToF32(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = comm.BFloat16Value(h).Float32()
	}
}

// f32ToBF16 rounds float32 to bfloat16 with comm.BFloat16FromFloat32
// (nearest, ties to even; NaN stays NaN).
func f32ToBF16(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, f := range src {
		dst[i] = uint16(comm.BFloat16FromFloat32(f))
	}
}

// ToFloat32 widens len(dst) elements of dt held in src to float32: float16
// and bfloat16 exactly, float32 by copying. Use it to move 16-bit data
// into float32 arithmetic in bulk (e.g. a model's master weights).
//
// Errors (an *Error wrapping comm.ErrInvalidArgument): dt is not Float16,
// BFloat16 or Float32, or len(src) != len(dst)*dt.Size().
func ToFloat32(dst []float32, src []byte, dt comm.DType) error {
	if err := checkConvert("ToFloat32", dt, len(dst), len(src), true); err != nil {
		return err
	}
	if len(dst) == 0 {
		return nil
	}
	if dt == comm.Float32 {
		copy(asBytes(dst), src)
		return nil
	}
	widen := f16ToF32
	if dt == comm.BFloat16 {
		widen = bf16ToF32
	}
	if isAligned(src, 2) {
		widen(dst, view[uint16](src))
		return nil
	}
	sc := getScratch()
	defer putScratch(sc)
	a := stage(&sc.sa)
	for off := 0; off < len(src); off += stageBytes {
		n := min(stageBytes, len(src)-off)
		copy(a[:n], src[off:off+n])
		widen(dst[off/2:(off+n)/2], view[uint16](a[:n]))
	}
	return nil
}

// FromFloat32 rounds the float32 values of src to dt and writes them to dst:
// float16 and bfloat16 to nearest, ties to even (overflow to ±Inf, NaN stays
// NaN); float32 by copying.
//
// Errors (an *Error wrapping comm.ErrInvalidArgument): dt is not Float16,
// BFloat16 or Float32, or len(dst) != len(src)*dt.Size().
func FromFloat32(dst []byte, src []float32, dt comm.DType) error {
	if err := checkConvert("FromFloat32", dt, len(src), len(dst), false); err != nil {
		return err
	}
	if len(src) == 0 {
		return nil
	}
	if dt == comm.Float32 {
		copy(dst, asBytes(src))
		return nil
	}
	narrow := f32ToF16
	if dt == comm.BFloat16 {
		narrow = f32ToBF16
	}
	if isAligned(dst, 2) {
		narrow(view[uint16](dst), src)
		return nil
	}
	sc := getScratch()
	defer putScratch(sc)
	a := stage(&sc.sa)
	for off := 0; off < len(dst); off += stageBytes {
		n := min(stageBytes, len(dst)-off)
		narrow(view[uint16](a[:n]), src[off/2:(off+n)/2])
		copy(dst[off:off+n], a[:n])
	}
	return nil
}

// checkConvert validates a conversion between n float32 values and nb bytes
// of dt (the source side when toF32, else the destination).
func checkConvert(fn string, dt comm.DType, n, nb int, toF32 bool) error {
	fail := func(msg string) error {
		e := &Error{Func: fn, DType: dt, DstBytes: nb, SrcBytes: 4 * n, Msg: msg}
		if toF32 {
			e.DstBytes, e.SrcBytes = 4*n, nb
		}
		return e
	}
	if dt != comm.Float16 && dt != comm.BFloat16 && dt != comm.Float32 {
		return fail("conversion needs float16, bfloat16 or float32")
	}
	if nb != n*dt.Size() {
		return fail("the byte side is not the float32 count times the element size")
	}
	return nil
}
