// Package kernel holds the CPU engine's reduction kernels: the elementwise
// loops that combine a received chunk into a local one during reduce,
// allreduce and reduce-scatter, and the scaling that finishes Avg and
// PreMulSum. They play the part of Gloo's gloo/math.h (sum, product, min, max
// over raw pointers) and of the reduction step of NCCL's device kernels.
//
// Buffers are raw bytes plus a comm.DType, exactly as they travel on the wire:
//
//	Reduce(dst, src, dt, op)         dst[i] = op(dst[i], src[i])   (one goroutine)
//	ReduceParallel(dst, src, dt, op) the same, split across GOMAXPROCS goroutines
//	                                 when len(dst) >= ParallelThreshold
//	Scale(buf, dt, f)                buf[i] *= f                    (floating and complex types)
//	ToFloat32 / FromFloat32          bulk float16/bfloat16 <-> float32 conversion
//
// How each dtype is reduced:
//
//   - float32, float64: Sum and Product with github.com/viterin/vek (AVX2
//     when the CPU has AVX2 and FMA, a pure-Go loop otherwise). Min and Max
//     follow Go's builtin min/max, which match torch.minimum/torch.maximum: a
//     NaN in either operand gives NaN, and -0 is below +0 whichever side it
//     is on, so the result never depends on which rank's data was dst. They
//     run as builtin loops.
//   - float16, bfloat16: blocks of blockElems elements are widened to float32
//     scratch, reduced with the float32 kernel and rounded back (ties to even),
//     as torch's CPU kernels compute half types through float. The
//     conversions use x448/float16 (float16) and comm.BFloat16FromFloat32
//     (bfloat16).
//   - int8, uint8, int32, int64: wrapping (two's complement) arithmetic, as
//     torch's integer tensors wrap. Bitwise ops, and Sum of int8/uint8/int32,
//     work on 8-byte words (SWAR: lane-wise adds that do not carry across
//     lanes); the rest are plain element loops.
//   - complex64, complex128: Sum only (with Avg and PreMulSum, which reduce
//     as Sum; torch refuses the other ops on complex tensors). A complex
//     element is two floats, so the sum is the float32 (float64) kernel over
//     twice the elements, as torch reduces view_as_real; Scale multiplies
//     both parts by the real factor. Buffers need only their parts'
//     alignment (4 or 8 bytes) for the fast path.
//   - bool: one byte per element; any non-zero byte is true and results are
//     0 or 1. Sum and Max are logical or, Product and Min logical and (c10d's
//     mapping), BAnd/BOr/BXor are and/or/xor; all on 8-byte words.
//
// Avg and PreMulSum reduce as Sum: the engine applies the factor with Scale
// (Avg: 1/n after the reduction; PreMulSum: the factor before it), as NCCL's
// ncclAvg and ncclRedOpCreatePreMulSum do.
//
// Caller's duties:
//
//  1. Pass dst and src of equal length, a whole number of elements of dt.
//     Anything else returns an *Error wrapping comm.ErrInvalidArgument.
//  2. Check the op against the dtype once per collective with op.Check(dt); the
//     kernels check again and return the same error.
//  3. Do not let dst and src partially overlap (an *Error); the same slice as
//     both is allowed and means dst[i] = op(dst[i], dst[i]).
//  4. Alignment is not required: buffers from comm.Buffer are 8-byte aligned
//     and take the fast path; a misaligned view is staged through aligned
//     scratch blocks, which is correct but slower.
//
// The kernels hold no state beyond pooled scratch blocks, start no goroutine
// (except ReduceParallel, which joins all it starts before returning) and are
// safe for concurrent use on disjoint buffers.
package kernel
