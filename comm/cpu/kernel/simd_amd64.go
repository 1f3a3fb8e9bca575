// Assembly kernels for amd64 (simd_amd64.s) and the CPU-feature switches
// that select them; simd_other.go stubs them out elsewhere.

package kernel

import "golang.org/x/sys/cpu"

// useF16C selects the F16C instructions (VCVTPH2PS/VCVTPS2PH) for bulk
// float16 conversion; they need AVX enabled by the OS. Tests switch it off
// to check the portable loops against the same expectations.
var useF16C = cpu.X86.HasAVX && cpu.X86.HasF16C

// widenF16C widens n binary16 values at src to float32 at dst; n > 0 and a
// multiple of 8. Implemented in simd_amd64.s.
//
//go:noescape
func widenF16C(dst *float32, src *uint16, n int)

// narrowF16C rounds n float32 values at src to binary16 at dst (nearest,
// ties to even); n > 0 and a multiple of 8. Implemented in simd_amd64.s.
//
//go:noescape
func narrowF16C(dst *uint16, src *float32, n int)

// useAVX2BF16 selects the AVX2 loops for bulk bfloat16 conversion.
var useAVX2BF16 = cpu.X86.HasAVX2

// widenBF16AVX2 widens n bfloat16 values at src to float32 at dst; n > 0 and
// a multiple of 8. Implemented in simd_amd64.s.
//
//go:noescape
func widenBF16AVX2(dst *float32, src *uint16, n int)

// narrowBF16AVX2 rounds n float32 values at src to bfloat16 at dst, exactly
// as comm.BFloat16FromFloat32; n > 0 and a multiple of 8. Implemented in
// simd_amd64.s.
//
//go:noescape
func narrowBF16AVX2(dst *uint16, src *float32, n int)

// useAVXMinMax selects the AVX loops for float32/float64 Min and Max.
var useAVXMinMax = cpu.X86.HasAVX

// minF32AVX sets d[i] = min(d[i], s[i]) with Go's builtin min semantics for
// n float32 values; n > 0 and a multiple of 8. Implemented in simd_amd64.s,
// as are maxF32AVX, minF64AVX and maxF64AVX (float64: n a multiple of 4).
//
//go:noescape
func minF32AVX(d, s *float32, n int)

//go:noescape
func maxF32AVX(d, s *float32, n int)

//go:noescape
func minF64AVX(d, s *float64, n int)

//go:noescape
func maxF64AVX(d, s *float64, n int)

// sumF16C adds n binary16 values at s into d through float32 (one rounding,
// nearest even); n > 0 and a multiple of 8. Needs useF16C.
//
//go:noescape
func sumF16C(d, s *uint16, n int)

// sumBF16AVX2 is sumF16C for bfloat16. Needs useAVX2BF16.
//
//go:noescape
func sumBF16AVX2(d, s *uint16, n int)
