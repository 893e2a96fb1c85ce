//go:build amd64

#include "textflag.h"

// DEINT loads the 18 values at R and splits them into the even and odd
// elements of R[0..15] (E0, O0) and of R[2..17] (E1, O1).
#define DEINT(R, E0, O0, E1, O1) \
	VMOVUPS 0(R), Y14; \
	VMOVUPS 32(R), Y15; \
	VSHUFPS $0x88, Y15, Y14, E0; \
	VSHUFPS $0xDD, Y15, Y14, O0; \
	VPERMPD $0xD8, E0, E0; \
	VPERMPD $0xD8, O0, O0; \
	VMOVUPS 8(R), Y14; \
	VMOVUPS 40(R), Y15; \
	VSHUFPS $0x88, Y15, Y14, E1; \
	VSHUFPS $0xDD, Y15, Y14, O1; \
	VPERMPD $0xD8, E1, E1; \
	VPERMPD $0xD8, O1, O1

// COLS is the column pass of one row of 8 tiles, t = (a, b, c, d) per
// tile with a = E0, b = O0, c = E1, d = O1: it stores a−c, b+c, c−b, b−d
// at P, P+s, P+2s, P+3s (CX = s, R12 = 3s in bytes).
#define COLS(E0, O0, E1, O1, P) \
	VSUBPS E1, E0, Y12; \
	VMOVUPS Y12, (P); \
	VADDPS E1, O0, Y12; \
	VMOVUPS Y12, (P)(CX*1); \
	VSUBPS O0, E1, Y12; \
	VMOVUPS Y12, (P)(CX*2); \
	VSUBPS O1, O0, Y12; \
	VMOVUPS Y12, (P)(R12*1)

// func winoInput8(dst *float32, s int, r0, r1, r2, r3 *float32)
TEXT ·winoInput8(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ s+8(FP), CX
	SHLQ $2, CX
	LEAQ (CX)(CX*2), R12
	MOVQ r0+16(FP), R8
	MOVQ r1+24(FP), R9
	MOVQ r2+32(FP), R10
	MOVQ r3+40(FP), R11
	LEAQ (DI)(CX*4), R13 // row 1 of the output points: ξ = 4..7

	DEINT(R9, Y0, Y1, Y2, Y3)  // r1
	DEINT(R10, Y4, Y5, Y6, Y7) // r2

	// t1 = r1 + r2
	VADDPS Y4, Y0, Y8
	VADDPS Y5, Y1, Y9
	VADDPS Y6, Y2, Y10
	VADDPS Y7, Y3, Y11
	COLS(Y8, Y9, Y10, Y11, R13)
	LEAQ (R13)(CX*4), R13

	// t2 = r2 − r1
	VSUBPS Y0, Y4, Y8
	VSUBPS Y1, Y5, Y9
	VSUBPS Y2, Y6, Y10
	VSUBPS Y3, Y7, Y11
	COLS(Y8, Y9, Y10, Y11, R13)
	LEAQ (R13)(CX*4), R13

	// t0 = r0 − r2
	DEINT(R8, Y8, Y9, Y10, Y11)
	VSUBPS Y4, Y8, Y8
	VSUBPS Y5, Y9, Y9
	VSUBPS Y6, Y10, Y10
	VSUBPS Y7, Y11, Y11
	COLS(Y8, Y9, Y10, Y11, DI)

	// t3 = r1 − r3
	DEINT(R11, Y8, Y9, Y10, Y11)
	VSUBPS Y8, Y0, Y8
	VSUBPS Y9, Y1, Y9
	VSUBPS Y10, Y2, Y10
	VSUBPS Y11, Y3, Y11
	COLS(Y8, Y9, Y10, Y11, R13)

	VZEROUPPER
	RET
