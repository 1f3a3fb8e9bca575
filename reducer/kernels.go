package reducer

import (
	"fmt"
	"unsafe"

	"github.com/viterin/vek"
	"github.com/viterin/vek/vek32"
	"github.com/x448/float16"

	"github.com/ranktree/ranktree/comm"
)

// Host kernels the reducer needs: copy-and-divide (the pre-division of
// c10d's copy_grad_to_bucket), zeroing, and the fp16/bf16 casts of the
// compression hooks. All take host buffers of floating dtypes.

// sameMemory reports whether a and b are the same view (same first byte
// and length). Empty buffers of equal dtype count as the same.
func sameMemory(a, b comm.Buffer) bool {
	if a.DType() != b.DType() || a.Len() != b.Len() {
		return false
	}
	ab, bb := a.Bytes(), b.Bytes()
	if len(ab) == 0 {
		return true
	}
	return unsafe.SliceData(ab) == unsafe.SliceData(bb)
}

// divInto sets dst[i] = src[i] / div (div > 0; src may be dst; div 1 is a
// plain copy). Both must be host buffers of one floating dtype and length.
func divInto(dst, src comm.Buffer, div int) error {
	if dst.DType() != src.DType() || dst.Len() != src.Len() {
		return fmt.Errorf("%w: reducer: cannot copy %v into %v", comm.ErrInvalidArgument, src, dst)
	}
	if div == 1 {
		if !sameMemory(dst, src) {
			comm.CopyBuffer(dst, src)
		}
		return nil
	}
	switch dst.DType() {
	case comm.Float32:
		if isPow2(div) {
			scaleChunked(mustSlice[float32](dst), mustSlice[float32](src), 1/float32(div), vek32.MulNumber_Inplace)
		} else {
			divScalar(mustSlice[float32](dst), mustSlice[float32](src), float32(div))
		}
	case comm.Float64:
		if isPow2(div) {
			scaleChunked(mustSlice[float64](dst), mustSlice[float64](src), 1/float64(div), vek.MulNumber_Inplace)
		} else {
			divScalar(mustSlice[float64](dst), mustSlice[float64](src), float64(div))
		}
	case comm.Float16:
		d, s := mustSlice[comm.Float16Value](dst), mustSlice[comm.Float16Value](src)
		f := float32(div)
		for i := range d {
			d[i] = float16.Fromfloat32(s[i].Float32() / f)
		}
	case comm.BFloat16:
		d, s := mustSlice[comm.BFloat16Value](dst), mustSlice[comm.BFloat16Value](src)
		f := float32(div)
		for i := range d {
			d[i] = comm.BFloat16FromFloat32(s[i].Float32() / f)
		}
	default:
		return fmt.Errorf("%w: reducer: cannot divide %v gradients", comm.ErrUnsupported, dst.DType())
	}
	return nil
}

// divScalar sets d[i] = s[i] / f with IEEE division, as c10d's
// grad.div(div_factor); SIMD libraries that multiply by the reciprocal
// differ in the last bit for world sizes that are not powers of two.
func divScalar[T float32 | float64](d, s []T, f T) {
	s = s[:len(d)]
	for i := range d {
		d[i] = s[i] / f
	}
}

func isPow2(n int) bool { return n > 0 && n&(n-1) == 0 }

// scaleChunk is how many elements scaleChunked copies and scales at a
// time: small enough that the scaling pass finds them in cache.
const scaleChunk = 8192

// scaleChunked sets d = s × f with a SIMD multiply (vek: AVX2 where
// available). Used for division by a power of two, where multiplying by
// the exact reciprocal gives the same bits as IEEE division.
func scaleChunked[T float32 | float64](d, s []T, f T, scaleInPlace func([]T, T)) {
	same := len(d) > 0 && &d[0] == &s[0]
	for off := 0; off < len(d); off += scaleChunk {
		end := min(off+scaleChunk, len(d))
		if !same {
			copy(d[off:end], s[off:end])
		}
		scaleInPlace(d[off:end], f)
	}
}

// castInto converts src into dst (any pair of floating dtypes, same
// length), dividing by div on the way (div 1: none). It is the compress
// and decompress step of the fp16/bf16 hooks.
func castInto(dst, src comm.Buffer, div int) error {
	if dst.Len() != src.Len() {
		return fmt.Errorf("%w: reducer: cannot cast %v into %v", comm.ErrInvalidArgument, src, dst)
	}
	if dst.DType() == src.DType() {
		return divInto(dst, src, div)
	}
	n := src.Len()
	get, err := reader(src)
	if err != nil {
		return err
	}
	put, err := writer(dst)
	if err != nil {
		return err
	}
	f := float64(div)
	for i := range n {
		put(i, get(i)/f)
	}
	return nil
}

func reader(b comm.Buffer) (func(int) float64, error) {
	switch b.DType() {
	case comm.Float32:
		s := mustSlice[float32](b)
		return func(i int) float64 { return float64(s[i]) }, nil
	case comm.Float64:
		s := mustSlice[float64](b)
		return func(i int) float64 { return s[i] }, nil
	case comm.Float16:
		s := mustSlice[comm.Float16Value](b)
		return func(i int) float64 { return float64(s[i].Float32()) }, nil
	case comm.BFloat16:
		s := mustSlice[comm.BFloat16Value](b)
		return func(i int) float64 { return float64(s[i].Float32()) }, nil
	}
	return nil, fmt.Errorf("%w: reducer: cannot convert %v gradients", comm.ErrUnsupported, b.DType())
}

func writer(b comm.Buffer) (func(int, float64), error) {
	switch b.DType() {
	case comm.Float32:
		s := mustSlice[float32](b)
		return func(i int, v float64) { s[i] = float32(v) }, nil
	case comm.Float64:
		s := mustSlice[float64](b)
		return func(i int, v float64) { s[i] = v }, nil
	case comm.Float16:
		s := mustSlice[comm.Float16Value](b)
		return func(i int, v float64) { s[i] = float16.Fromfloat32(float32(v)) }, nil
	case comm.BFloat16:
		s := mustSlice[comm.BFloat16Value](b)
		return func(i int, v float64) { s[i] = comm.BFloat16FromFloat32(float32(v)) }, nil
	}
	return nil, fmt.Errorf("%w: reducer: cannot convert %v gradients", comm.ErrUnsupported, b.DType())
}

// mustSlice views a host buffer whose dtype the caller has checked.
func mustSlice[T comm.Elem](b comm.Buffer) []T {
	s, err := comm.AsSlice[T](b)
	if err != nil {
		panic("reducer: internal dtype mismatch: " + err.Error())
	}
	return s
}

// zero clears a host buffer.
func zero(b comm.Buffer) { clear(b.Bytes()) }
