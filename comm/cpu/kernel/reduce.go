package kernel

import (
	"github.com/ranktree/ranktree/comm"
)

// Reduce combines src into dst elementwise: dst[i] = op(dst[i], src[i]) for
// the len(dst)/dt.Size() elements of dt, on the calling goroutine. It is the
// reduction step of Gloo's ring and halving-doubling allreduce and of NCCL's
// reduce kernels. Avg and PreMulSum reduce as Sum (apply the factor with
// Scale); on bool, Sum and Max are logical or, Product and Min logical and.
// See the package documentation for NaN, rounding and wrapping rules.
//
// Errors (an *Error wrapping comm.ErrInvalidArgument, dst untouched): op not
// valid for dt (op.Check), len(dst) != len(src), a length that is not a whole
// number of elements, or dst and src partially overlapping.
func Reduce(dst, src []byte, dt comm.DType, op comm.ReduceOp) error {
	t, err := validate("Reduce", dst, src, dt, op)
	if err != nil {
		return err
	}
	reduce(dst, src, dt, t)
	return nil
}

// validate checks a Reduce call and returns the reduction the loops run:
// op mapped with ForDType, and Avg/PreMulSum as Sum.
func validate(fn string, dst, src []byte, dt comm.DType, op comm.ReduceOp) (comm.RedOpType, error) {
	fail := func(msg string, err error) error {
		return &Error{Func: fn, DType: dt, Op: op, DstBytes: len(dst), SrcBytes: len(src), Msg: msg, Err: err}
	}
	if err := op.Check(dt); err != nil {
		return 0, fail("reduction not valid for this dtype", err)
	}
	if len(dst) != len(src) {
		return 0, fail("dst and src lengths differ", nil)
	}
	if len(dst)%dt.Size() != 0 {
		return 0, fail("length is not a whole number of elements", nil)
	}
	if _, partial := overlap(dst, src); partial {
		return 0, fail("dst and src partially overlap", nil)
	}
	t := op.ForDType(dt).Type()
	if t == comm.RedAvg || t == comm.RedPreMulSum {
		t = comm.RedSum
	}
	return t, nil
}

// reduce runs a validated reduction. Aligned, disjoint buffers go straight to
// the typed loops; misaligned or aliased ones are staged through scratch.
func reduce(dst, src []byte, dt comm.DType, t comm.RedOpType) {
	if len(dst) == 0 {
		return
	}
	size := dt.Real().Size() // complex elements need their parts' alignment only
	same, _ := overlap(dst, src)
	if same || !isAligned(dst, size) || !isAligned(src, size) {
		reduceStaged(dst, src, dt, t)
		return
	}
	reduceAligned(dst, src, dt, t)
}

// reduceStaged copies blocks of dst and src into aligned scratch, reduces
// them there and copies the result back. src's block is read before dst's is
// written, so an exact alias (src == dst) reduces each element with itself.
func reduceStaged(dst, src []byte, dt comm.DType, t comm.RedOpType) {
	sc := getScratch()
	defer putScratch(sc)
	a, b := stage(&sc.sa), stage(&sc.sb)
	for off := 0; off < len(dst); off += stageBytes {
		n := min(stageBytes, len(dst)-off)
		copy(a[:n], dst[off:off+n])
		copy(b[:n], src[off:off+n])
		reduceAligned(a[:n], b[:n], dt, t)
		copy(dst[off:off+n], a[:n])
	}
}

// reduceAligned dispatches on dtype; dst and src are aligned and disjoint.
func reduceAligned(dst, src []byte, dt comm.DType, t comm.RedOpType) {
	switch dt {
	case comm.Float32:
		reduceF32(view[float32](dst), view[float32](src), t)
	case comm.Float64:
		reduceF64(view[float64](dst), view[float64](src), t)
	case comm.Float16:
		reduceHalf(view[uint16](dst), view[uint16](src), t, f16ToF32, f32ToF16)
	case comm.BFloat16:
		reduceHalf(view[uint16](dst), view[uint16](src), t, bf16ToF32, f32ToBF16)
	case comm.Int8:
		reduceIntBytes[int8](dst, src, t, hiBytes)
	case comm.Uint8:
		reduceIntBytes[uint8](dst, src, t, hiBytes)
	case comm.Int32:
		reduceIntBytes[int32](dst, src, t, hiLanes)
	case comm.Int64:
		reduceIntBytes[int64](dst, src, t, 0) // 64-bit adds are native already
	case comm.Bool:
		reduceBoolBytes(dst, src, t)
	case comm.Complex64:
		// A complex sum is the sum of the real and imaginary parts: a
		// float32 sum over twice the elements (torch.view_as_real).
		reduceF32(view[float32](dst), view[float32](src), t)
	case comm.Complex128:
		reduceF64(view[float64](dst), view[float64](src), t)
	default:
		panic("kernel: unreachable: dtype validated by ReduceOp.Check")
	}
}
