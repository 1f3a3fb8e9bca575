#include "textflag.h"

// func streamCopy128(dst, src *byte, n int)
//
// Copies n bytes (a multiple of 128) from src to dst (16-byte aligned)
// with non-temporal stores (MOVNTDQ), then orders them before any later
// store (SFENCE). See streamCopy in ntcopy_amd64.go.
TEXT ·streamCopy128(SB), NOSPLIT, $0-24
	MOVQ	dst+0(FP), DI
	MOVQ	src+8(FP), SI
	MOVQ	n+16(FP), CX
	SHRQ	$7, CX
	JZ	done
loop:
	MOVOU	0(SI), X0
	MOVOU	16(SI), X1
	MOVOU	32(SI), X2
	MOVOU	48(SI), X3
	MOVOU	64(SI), X4
	MOVOU	80(SI), X5
	MOVOU	96(SI), X6
	MOVOU	112(SI), X7
	MOVNTO	X0, 0(DI)
	MOVNTO	X1, 16(DI)
	MOVNTO	X2, 32(DI)
	MOVNTO	X3, 48(DI)
	MOVNTO	X4, 64(DI)
	MOVNTO	X5, 80(DI)
	MOVNTO	X6, 96(DI)
	MOVNTO	X7, 112(DI)
	ADDQ	$128, SI
	ADDQ	$128, DI
	DECQ	CX
	JNZ	loop
	SFENCE
done:
	RET
