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

// ROWT adds the adjoint of the column pass of one row of 8 tiles into the
// strip row at T: with q0..q3 the row's dv (at P, P+s, P+2s, P+3s, masked
// by Y15), t[2k] += q0, t[2k+1] += (q1−q2)+q3, t[2k+2] += (q1+q2)−q0 and
// t[2k+3] += 0−q3 for tile k, each position's two contributions summed
// first (Y14 = 0).
#define ROWT(P, T) \
	VANDPS (P), Y15, Y0; \
	VANDPS (P)(CX*1), Y15, Y1; \
	VANDPS (P)(CX*2), Y15, Y2; \
	VANDPS (P)(R12*1), Y15, Y3; \
	VSUBPS Y2, Y1, Y4; \
	VADDPS Y3, Y4, Y4; \
	VADDPS Y2, Y1, Y5; \
	VSUBPS Y0, Y5, Y5; \
	VSUBPS Y3, Y14, Y6; \
	VUNPCKLPS Y4, Y0, Y7; \
	VUNPCKHPS Y4, Y0, Y8; \
	VPERM2F128 $0x20, Y8, Y7, Y9; \
	VPERM2F128 $0x31, Y8, Y7, Y10; \
	VUNPCKLPS Y6, Y5, Y7; \
	VUNPCKHPS Y6, Y5, Y8; \
	VPERM2F128 $0x20, Y8, Y7, Y11; \
	VPERM2F128 $0x31, Y8, Y7, Y12; \
	VPERMQ $0x93, Y11, Y11; \
	VPERMQ $0x93, Y12, Y12; \
	VPBLENDD $0x03, Y14, Y11, Y13; \
	VADDPS Y13, Y9, Y9; \
	VPBLENDD $0x03, Y11, Y12, Y13; \
	VADDPS Y13, Y10, Y10; \
	VADDPS (T), Y9, Y9; \
	VMOVUPS Y9, (T); \
	VADDPS 32(T), Y10, Y10; \
	VMOVUPS Y10, 32(T); \
	VMOVSD 64(T), X9; \
	VADDPS X12, X9, X9; \
	VMOVSD X9, 64(T)

// func winoInputGrad8(t0, t1, t2, t3, dv *float32, s int, mask *float32)
TEXT ·winoInputGrad8(SB), NOSPLIT, $0-56
	MOVQ t0+0(FP), R8
	MOVQ t1+8(FP), R9
	MOVQ t2+16(FP), R10
	MOVQ t3+24(FP), R11
	MOVQ dv+32(FP), DI
	MOVQ s+40(FP), CX
	SHLQ $2, CX
	LEAQ (CX)(CX*2), R12
	MOVQ mask+48(FP), AX
	VMOVUPS (AX), Y15
	VXORPS Y14, Y14, Y14

	ROWT(DI, R8)
	LEAQ (DI)(CX*4), DI
	ROWT(DI, R9)
	LEAQ (DI)(CX*4), DI
	ROWT(DI, R10)
	LEAQ (DI)(CX*4), DI
	ROWT(DI, R11)

	VZEROUPPER
	RET

// func winoRowT(r0, r1, r2, r3, t0, t1, t2, t3 *float32, n int)
TEXT ·winoRowT(SB), NOSPLIT, $0-72
	MOVQ r0+0(FP), R8
	MOVQ r1+8(FP), R9
	MOVQ r2+16(FP), R10
	MOVQ r3+24(FP), R11
	MOVQ t0+32(FP), AX
	MOVQ t1+40(FP), BX
	MOVQ t2+48(FP), CX
	MOVQ t3+56(FP), DX
	MOVQ n+64(FP), SI
	XORQ DI, DI
	SHRQ $3, SI
	JZ   done

loop:
	VMOVUPS (AX)(DI*1), Y0 // a
	VMOVUPS (BX)(DI*1), Y1 // b
	VMOVUPS (CX)(DI*1), Y2 // c
	VMOVUPS (DX)(DI*1), Y3 // d
	VADDPS  (R8)(DI*1), Y0, Y4
	VMOVUPS Y4, (R8)(DI*1) // r0 += a
	VSUBPS  Y2, Y1, Y5
	VADDPS  Y3, Y5, Y5
	VADDPS  (R9)(DI*1), Y5, Y5
	VMOVUPS Y5, (R9)(DI*1) // r1 += (b−c)+d
	VADDPS  Y2, Y1, Y6
	VSUBPS  Y0, Y6, Y6
	VADDPS  (R10)(DI*1), Y6, Y6
	VMOVUPS Y6, (R10)(DI*1) // r2 += (b+c)−a
	VMOVUPS (R11)(DI*1), Y7
	VSUBPS  Y3, Y7, Y7
	VMOVUPS Y7, (R11)(DI*1) // r3 −= d
	ADDQ    $32, DI
	DECQ    SI
	JNZ     loop
	VZEROUPPER

done:
	RET
