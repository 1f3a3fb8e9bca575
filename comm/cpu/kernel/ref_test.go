package kernel

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"unsafe"

	"github.com/ranktree/ranktree/comm"
	"github.com/x448/float16"
)

// This file holds the naive reference the kernels are checked against: one
// element at a time, decoded with encoding/binary, written from the package
// documentation's rules rather than from the kernels' code.

var ne = binary.NativeEndian

// allOps lists every reduction, including PreMulSum with a factor.
var allOps = []comm.ReduceOp{comm.Sum, comm.Avg, comm.Product, comm.Min, comm.Max,
	comm.PreMulSum(0.5), comm.BAnd, comm.BOr, comm.BXor}

// validPairs lists every (dtype, op) pair that ReduceOp.Check accepts.
func validPairs() (dts []comm.DType, ops []comm.ReduceOp) {
	for _, dt := range comm.AllDTypes {
		for _, op := range allOps {
			if op.Check(dt) == nil {
				dts = append(dts, dt)
				ops = append(ops, op)
			}
		}
	}
	return dts, ops
}

func refFloat32(a, b float32, t comm.RedOpType) float32 {
	switch t {
	case comm.RedSum, comm.RedAvg, comm.RedPreMulSum:
		return a + b
	case comm.RedProduct:
		return a * b
	case comm.RedMin, comm.RedMax:
		return float32(refFloat64(float64(a), float64(b), t))
	}
	panic("bad float op " + t.String())
}

func refFloat64(a, b float64, t comm.RedOpType) float64 {
	switch t {
	case comm.RedSum, comm.RedAvg, comm.RedPreMulSum:
		return a + b
	case comm.RedProduct:
		return a * b
	case comm.RedMin, comm.RedMax:
		// torch.minimum/maximum: NaN wins; -0 is below +0.
		isMin := t == comm.RedMin
		switch {
		case math.IsNaN(a) || math.IsNaN(b):
			return math.NaN()
		case a == b && math.Signbit(a) != math.Signbit(b):
			if isMin == math.Signbit(a) {
				return a
			}
			return b
		case (b < a) == isMin:
			return b
		}
		return a
	}
	panic("bad float op " + t.String())
}

func refInt[T int8 | uint8 | int32 | int64](a, b T, t comm.RedOpType) T {
	switch t {
	case comm.RedSum:
		return a + b
	case comm.RedProduct:
		return a * b
	case comm.RedMin:
		if b < a {
			return b
		}
		return a
	case comm.RedMax:
		if b > a {
			return b
		}
		return a
	case comm.RedBAnd:
		return a & b
	case comm.RedBOr:
		return a | b
	case comm.RedBXor:
		return a ^ b
	}
	panic("bad int op " + t.String())
}

func refBool(a, b byte, t comm.RedOpType) byte {
	x, y := a != 0, b != 0
	var r bool
	switch t {
	case comm.RedSum, comm.RedMax, comm.RedBOr:
		r = x || y
	case comm.RedProduct, comm.RedMin, comm.RedBAnd:
		r = x && y
	case comm.RedBXor:
		r = x != y
	default:
		panic("bad bool op " + t.String())
	}
	if r {
		return 1
	}
	return 0
}

// refReduce returns op(dst, src) computed one element at a time.
func refReduce(dst, src []byte, dt comm.DType, op comm.ReduceOp) []byte {
	out := make([]byte, len(dst))
	t := op.Type()
	sz := dt.Size()
	for i := 0; i+sz <= len(dst); i += sz {
		a, b, o := dst[i:i+sz], src[i:i+sz], out[i:i+sz]
		switch dt {
		case comm.Float32:
			r := refFloat32(math.Float32frombits(ne.Uint32(a)), math.Float32frombits(ne.Uint32(b)), t)
			ne.PutUint32(o, math.Float32bits(r))
		case comm.Float64:
			r := refFloat64(math.Float64frombits(ne.Uint64(a)), math.Float64frombits(ne.Uint64(b)), t)
			ne.PutUint64(o, math.Float64bits(r))
		case comm.Float16:
			r := refFloat32(float16.Frombits(ne.Uint16(a)).Float32(), float16.Frombits(ne.Uint16(b)).Float32(), t)
			ne.PutUint16(o, float16.Fromfloat32(r).Bits())
		case comm.BFloat16:
			r := refFloat32(comm.BFloat16Value(ne.Uint16(a)).Float32(), comm.BFloat16Value(ne.Uint16(b)).Float32(), t)
			ne.PutUint16(o, uint16(comm.BFloat16FromFloat32(r)))
		case comm.Int8:
			o[0] = byte(refInt(int8(a[0]), int8(b[0]), t))
		case comm.Uint8:
			o[0] = refInt(a[0], b[0], t)
		case comm.Int32:
			ne.PutUint32(o, uint32(refInt(int32(ne.Uint32(a)), int32(ne.Uint32(b)), t)))
		case comm.Int64:
			ne.PutUint64(o, uint64(refInt(int64(ne.Uint64(a)), int64(ne.Uint64(b)), t)))
		case comm.Bool:
			o[0] = refBool(a[0], b[0], t)
		case comm.Complex64, comm.Complex128:
			// (a+bi) + (c+di) = (a+c) + (b+d)i: each part on its own.
			copy(o, refReduce(a, b, dt.Real(), op))
		}
	}
	return out
}

// isNaNAt reports whether element i (byte offset) of a floating buffer is NaN.
func isNaNAt(b []byte, dt comm.DType) bool {
	switch dt {
	case comm.Float32:
		return ne.Uint32(b)&0x7fffffff > 0x7f800000
	case comm.Float64:
		return ne.Uint64(b)&(1<<63-1) > 0x7ff0000000000000
	case comm.Float16:
		return ne.Uint16(b)&0x7fff > 0x7c00
	case comm.BFloat16:
		return ne.Uint16(b)&0x7fff > 0x7f80
	}
	return false
}

// firstDiff returns the byte offset of the first element where got and want
// differ, treating any two NaNs as equal (payloads are not specified), or -1.
// Complex elements compare part by part.
func firstDiff(got, want []byte, dt comm.DType) int {
	if dt.IsComplex() {
		if i := firstDiff(got, want, dt.Real()); i >= 0 {
			return i / dt.Size() * dt.Size()
		}
		return -1
	}
	sz := dt.Size()
	for i := 0; i+sz <= len(want); i += sz {
		g, w := got[i:i+sz], want[i:i+sz]
		if dt.IsFloating() && isNaNAt(g, dt) && isNaNAt(w, dt) {
			continue
		}
		if string(g) != string(w) {
			return i
		}
	}
	return -1
}

// alignedBytes returns n zero bytes starting on an 8-byte boundary plus off.
func alignedBytes(n, off int) []byte {
	words := make([]uint64, (n+off+7)/8+1)
	b := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8)
	return b[off : off+n : off+n]
}

// randomElems fills b with random bytes; for floating types every few
// elements is replaced by a special value (NaN, ±Inf, ±0, max, denormal) so
// each run exercises them.
func randomElems(r *rand.Rand, b []byte, dt comm.DType) {
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	dt = dt.Real() // a complex element's parts get specials on their own
	sz := dt.Size()
	if !dt.IsFloating() {
		return
	}
	for i := 0; i+sz <= len(b); i += sz {
		if r.IntN(4) != 0 {
			continue
		}
		v := []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, math.Copysign(0, -1), 1, -2.5, 3e38, 1e-40}[r.IntN(9)]
		putFloat(b[i:i+sz], dt, v)
	}
}

func putFloat(b []byte, dt comm.DType, v float64) {
	switch dt {
	case comm.Float32:
		ne.PutUint32(b, math.Float32bits(float32(v)))
	case comm.Float64:
		ne.PutUint64(b, math.Float64bits(v))
	case comm.Float16:
		ne.PutUint16(b, float16.Fromfloat32(float32(v)).Bits())
	case comm.BFloat16:
		ne.PutUint16(b, uint16(comm.BFloat16FromFloat32(float32(v))))
	}
}

func getFloat(b []byte, dt comm.DType) float64 {
	switch dt {
	case comm.Float32:
		return float64(math.Float32frombits(ne.Uint32(b)))
	case comm.Float64:
		return math.Float64frombits(ne.Uint64(b))
	case comm.Float16:
		return float64(float16.Frombits(ne.Uint16(b)).Float32())
	case comm.BFloat16:
		return float64(comm.BFloat16Value(ne.Uint16(b)).Float32())
	}
	panic("not floating")
}
