#include "textflag.h"

// func widenF16C(dst *float32, src *uint16, n int)
// Widens n binary16 values (n > 0, a multiple of 8) to float32 with F16C's
// VCVTPH2PS (exact).
TEXT ·widenF16C(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

loop:
	VCVTPH2PS (SI), Y0
	VMOVUPS   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	SUBQ      $8, CX
	JNZ       loop
	VZEROUPPER
	RET

// func narrowF16C(dst *uint16, src *float32, n int)
// Rounds n float32 values (n > 0, a multiple of 8) to binary16 with F16C's
// VCVTPS2PH, immediate 0: round to nearest, ties to even, whatever MXCSR says.
TEXT ·narrowF16C(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

loop:
	VMOVUPS   (SI), Y0
	VCVTPS2PH $0, Y0, (DI)
	ADDQ      $32, SI
	ADDQ      $16, DI
	SUBQ      $8, CX
	JNZ       loop
	VZEROUPPER
	RET

// func widenBF16AVX2(dst *float32, src *uint16, n int)
// Widens n bfloat16 values (n > 0, a multiple of 8) to float32: zero-extend
// each to 32 bits and shift left by 16 (exact).
TEXT ·widenBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

loop:
	VPMOVZXWD (SI), Y0
	VPSLLD    $16, Y0, Y0
	VMOVDQU   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	SUBQ      $8, CX
	JNZ       loop
	VZEROUPPER
	RET

// func narrowBF16AVX2(dst *uint16, src *float32, n int)
// Rounds n float32 values (n > 0, a multiple of 8) to bfloat16 exactly as
// comm.BFloat16FromFloat32: u += 0x7fff + (u>>16)&1, keep the upper half;
// a NaN keeps its upper half with the quiet bit (0x40) set.
TEXT ·narrowBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVL $0x7fff, AX
	MOVD AX, X7
	VPBROADCASTD X7, Y7 // rounding bias
	MOVL $1, AX
	MOVD AX, X6
	VPBROADCASTD X6, Y6 // lsb mask
	MOVL $0x7fffffff, AX
	MOVD AX, X5
	VPBROADCASTD X5, Y5 // abs mask
	MOVL $0x7f800000, AX
	MOVD AX, X4
	VPBROADCASTD X4, Y4 // +Inf bits
	MOVL $0x00400000, AX
	MOVD AX, X3
	VPBROADCASTD X3, Y3 // quiet bit, before the shift

loop:
	VMOVDQU      (SI), Y0         // u
	VPSRLD       $16, Y0, Y1
	VPAND        Y6, Y1, Y1       // (u>>16)&1
	VPADDD       Y7, Y1, Y1
	VPADDD       Y0, Y1, Y1       // u + 0x7fff + lsb
	VPAND        Y5, Y0, Y2
	VPCMPGTD     Y4, Y2, Y2       // NaN: |u| > +Inf bits
	VPOR         Y3, Y0, Y8       // u | quiet bit
	VPBLENDVB    Y2, Y8, Y1, Y1   // NaN lanes take u | quiet bit
	VPSRLD       $16, Y1, Y1
	VEXTRACTI128 $1, Y1, X2
	VPACKUSDW    X2, X1, X1       // 8 × uint16, in order
	VMOVDQU      X1, (DI)
	ADDQ         $32, SI
	ADDQ         $16, DI
	SUBQ         $8, CX
	JNZ          loop
	VZEROUPPER
	RET

// Min and max with torch's rules (as Go's builtin min/max): NaN in either
// operand gives NaN; -0 is below +0. VMINPS/VMAXPS return their second
// source when either is NaN or both are zero, so each is computed both
// ways round: for min, or-ing the two results keeps -0 and any NaN; for
// max, and-ing them keeps +0, and an unordered-compare mask (all ones, a
// NaN) is or-ed in.

// func minF32AVX(d, s *float32, n int)   n > 0, a multiple of 8
TEXT ·minF32AVX(SB), NOSPLIT, $0-24
	MOVQ d+0(FP), DI
	MOVQ s+8(FP), SI
	MOVQ n+16(FP), CX

loop:
	VMOVUPS (DI), Y0
	VMOVUPS (SI), Y1
	VMINPS  Y1, Y0, Y2
	VMINPS  Y0, Y1, Y3
	VORPS   Y3, Y2, Y2
	VMOVUPS Y2, (DI)
	ADDQ    $32, DI
	ADDQ    $32, SI
	SUBQ    $8, CX
	JNZ     loop
	VZEROUPPER
	RET

// func maxF32AVX(d, s *float32, n int)   n > 0, a multiple of 8
TEXT ·maxF32AVX(SB), NOSPLIT, $0-24
	MOVQ d+0(FP), DI
	MOVQ s+8(FP), SI
	MOVQ n+16(FP), CX

loop:
	VMOVUPS (DI), Y0
	VMOVUPS (SI), Y1
	VMAXPS  Y1, Y0, Y2
	VMAXPS  Y0, Y1, Y3
	VANDPS  Y3, Y2, Y2
	VCMPPS  $3, Y1, Y0, Y4 // unordered: either is NaN
	VORPS   Y4, Y2, Y2
	VMOVUPS Y2, (DI)
	ADDQ    $32, DI
	ADDQ    $32, SI
	SUBQ    $8, CX
	JNZ     loop
	VZEROUPPER
	RET

// func minF64AVX(d, s *float64, n int)   n > 0, a multiple of 4
TEXT ·minF64AVX(SB), NOSPLIT, $0-24
	MOVQ d+0(FP), DI
	MOVQ s+8(FP), SI
	MOVQ n+16(FP), CX

loop:
	VMOVUPD (DI), Y0
	VMOVUPD (SI), Y1
	VMINPD  Y1, Y0, Y2
	VMINPD  Y0, Y1, Y3
	VORPD   Y3, Y2, Y2
	VMOVUPD Y2, (DI)
	ADDQ    $32, DI
	ADDQ    $32, SI
	SUBQ    $4, CX
	JNZ     loop
	VZEROUPPER
	RET

// func maxF64AVX(d, s *float64, n int)   n > 0, a multiple of 4
TEXT ·maxF64AVX(SB), NOSPLIT, $0-24
	MOVQ d+0(FP), DI
	MOVQ s+8(FP), SI
	MOVQ n+16(FP), CX

loop:
	VMOVUPD (DI), Y0
	VMOVUPD (SI), Y1
	VMAXPD  Y1, Y0, Y2
	VMAXPD  Y0, Y1, Y3
	VANDPD  Y3, Y2, Y2
	VCMPPD  $3, Y1, Y0, Y4
	VORPD   Y4, Y2, Y2
	VMOVUPD Y2, (DI)
	ADDQ    $32, DI
	ADDQ    $32, SI
	SUBQ    $4, CX
	JNZ     loop
	VZEROUPPER
	RET

// func sumF16C(d, s *uint16, n int)   n > 0, a multiple of 8
// d[i] = round16(float32(d[i]) + float32(s[i])) for binary16, fused: widen
// both with VCVTPH2PS, add in float32, round back with VCVTPS2PH (nearest
// even) — the same result as the blocked widen/add/narrow path.
TEXT ·sumF16C(SB), NOSPLIT, $0-24
	MOVQ d+0(FP), DI
	MOVQ s+8(FP), SI
	MOVQ n+16(FP), CX

loop:
	VCVTPH2PS (DI), Y0
	VCVTPH2PS (SI), Y1
	VADDPS    Y1, Y0, Y0
	VCVTPS2PH $0, Y0, (DI)
	ADDQ      $16, DI
	ADDQ      $16, SI
	SUBQ      $8, CX
	JNZ       loop
	VZEROUPPER
	RET

// func sumBF16AVX2(d, s *uint16, n int)   n > 0, a multiple of 8
// The bfloat16 counterpart of sumF16C: widen by shifting, add in float32,
// round as narrowBF16AVX2 does.
TEXT ·sumBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ d+0(FP), DI
	MOVQ s+8(FP), SI
	MOVQ n+16(FP), CX
	MOVL $0x7fff, AX
	MOVD AX, X7
	VPBROADCASTD X7, Y7 // rounding bias
	MOVL $1, AX
	MOVD AX, X6
	VPBROADCASTD X6, Y6 // lsb mask
	MOVL $0x7fffffff, AX
	MOVD AX, X5
	VPBROADCASTD X5, Y5 // abs mask
	MOVL $0x7f800000, AX
	MOVD AX, X4
	VPBROADCASTD X4, Y4 // +Inf bits
	MOVL $0x00400000, AX
	MOVD AX, X3
	VPBROADCASTD X3, Y3 // quiet bit, before the shift

loop:
	VPMOVZXWD    (DI), Y0
	VPSLLD       $16, Y0, Y0
	VPMOVZXWD    (SI), Y1
	VPSLLD       $16, Y1, Y1
	VADDPS       Y1, Y0, Y0       // u = bits of the float32 sum
	VPSRLD       $16, Y0, Y1
	VPAND        Y6, Y1, Y1
	VPADDD       Y7, Y1, Y1
	VPADDD       Y0, Y1, Y1       // u + 0x7fff + lsb
	VPAND        Y5, Y0, Y2
	VPCMPGTD     Y4, Y2, Y2       // NaN lanes
	VPOR         Y3, Y0, Y8
	VPBLENDVB    Y2, Y8, Y1, Y1
	VPSRLD       $16, Y1, Y1
	VEXTRACTI128 $1, Y1, X2
	VPACKUSDW    X2, X1, X1
	VMOVDQU      X1, (DI)
	ADDQ         $16, DI
	ADDQ         $16, SI
	SUBQ         $8, CX
	JNZ          loop
	VZEROUPPER
	RET
