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

// OUTT computes the output transform Aᵀ·m·A of 8 neighbouring tiles whose
// 16 points lie at SI (ξ = 0..3), R8 (4..7), R9 (8..11) and R10 (12..15),
// each row's points CX bytes apart (R12 = 3·CX): the rows pass
// p_c = (m0c + m1c) + m2c, q_c = (m1c − m2c) − m3c, then the columns pass
// y00 = (p0 + p1) + p2 (Y8), y01 = (p1 − p2) − p3 (Y9), y10 = (q0 + q1) + q2
// (Y10), y11 = (q1 − q2) − q3 (Y11), as outputTile does. Y0..Y7 and Y12
// are clobbered. OUTCOL is the rows pass of one column c, whose points
// are at A0..A3: P = p_c, Q = q_c.
#define OUTCOL(A0, A1, A2, A3, P, Q) \
	VMOVUPS A0, P; \
	VMOVUPS A1, Q; \
	VMOVUPS A2, Y12; \
	VADDPS Q, P, P; \
	VADDPS Y12, P, P; \
	VSUBPS Y12, Q, Q; \
	VSUBPS A3, Q, Q

#define OUTT \
	OUTCOL((SI), (R8), (R9), (R10), Y0, Y4); \
	OUTCOL((SI)(CX*1), (R8)(CX*1), (R9)(CX*1), (R10)(CX*1), Y1, Y5); \
	OUTCOL((SI)(CX*2), (R8)(CX*2), (R9)(CX*2), (R10)(CX*2), Y2, Y6); \
	OUTCOL((SI)(R12*1), (R8)(R12*1), (R9)(R12*1), (R10)(R12*1), Y3, Y7); \
	VADDPS Y1, Y0, Y8; \
	VADDPS Y2, Y8, Y8; \
	VSUBPS Y2, Y1, Y9; \
	VSUBPS Y3, Y9, Y9; \
	VADDPS Y5, Y4, Y10; \
	VADDPS Y6, Y10, Y10; \
	VSUBPS Y6, Y5, Y11; \
	VSUBPS Y7, Y11, Y11

// GOMIN sets D to Go's min(X, Y) as the compiler lowers it on amd64:
// T = MIN(X, Y), D = MIN(T, X) | T (NaNs propagate, min(−0, +0) = −0).
#define GOMIN(X, Y, D, T) \
	VMINPS Y, X, T; \
	VMINPS X, T, D; \
	VORPS T, D, D

// RELU sets V to Go's max(V, 0) = −min(−V, −0) (Y14: −0 in every lane;
// Y12, Y13 clobbered).
#define RELU(V) \
	VXORPS Y14, V, Y13; \
	GOMIN(Y13, Y14, V, Y12); \
	VXORPS Y14, V, V

// POINTS sets the point pointers R8, R9, R10 (ξ = 4, 8, 12) from SI
// (ξ = 0) and the point stride s in CX: CX = s·4 bytes, R12 = 3·CX, and
// Y14 = −0 in every lane.
#define POINTS \
	SHLQ $2, CX; \
	LEAQ (CX)(CX*2), R12; \
	LEAQ (SI)(CX*4), R8; \
	LEAQ (R8)(CX*4), R9; \
	LEAQ (R9)(CX*4), R10; \
	MOVL $0x80000000, BX; \
	VMOVD BX, X14; \
	VPBROADCASTD X14, Y14

// func winoOutputRows(y *float32, ow int, m *float32, s, n, rows, mskip int, b float32, relu bool)
TEXT ·winoOutputRows(SB), NOSPLIT, $0-61
	MOVQ y+0(FP), DI
	MOVQ ow+8(FP), R11
	SHLQ $2, R11
	MOVQ m+16(FP), SI
	MOVQ s+24(FP), CX
	POINTS
	VBROADCASTSS b+56(FP), Y15
	MOVBLZX relu+60(FP), R13
	MOVQ rows+40(FP), AX

outrow:
	MOVQ n+32(FP), DX

outloop:
	CMPQ DX, $8
	JLT  outtail

outbody:
	OUTT
	VADDPS Y15, Y8, Y8
	VADDPS Y15, Y9, Y9
	VADDPS Y15, Y10, Y10
	VADDPS Y15, Y11, Y11
	TESTQ  R13, R13
	JZ     outstore
	RELU(Y8)
	RELU(Y9)
	RELU(Y10)
	RELU(Y11)

outstore:
	// interleave (y00, y01) into the first row, (y10, y11) into the second
	VUNPCKLPS  Y9, Y8, Y0
	VUNPCKHPS  Y9, Y8, Y1
	VPERM2F128 $0x20, Y1, Y0, Y2
	VPERM2F128 $0x31, Y1, Y0, Y3
	VMOVUPS    Y2, (DI)
	VMOVUPS    Y3, 32(DI)
	VUNPCKLPS  Y11, Y10, Y0
	VUNPCKHPS  Y11, Y10, Y1
	VPERM2F128 $0x20, Y1, Y0, Y2
	VPERM2F128 $0x31, Y1, Y0, Y3
	VMOVUPS    Y2, (DI)(R11*1)
	VMOVUPS    Y3, 32(DI)(R11*1)
	ADDQ       $32, SI
	ADDQ       $32, R8
	ADDQ       $32, R9
	ADDQ       $32, R10
	ADDQ       $64, DI
	SUBQ       $8, DX
	JMP        outloop

outtail:
	// the last n%8 tiles: back up to end the block at the last tile
	TESTQ DX, DX
	JZ    outnext
	MOVQ  $8, BX
	SUBQ  DX, BX
	SHLQ  $2, BX
	SUBQ  BX, SI
	SUBQ  BX, R8
	SUBQ  BX, R9
	SUBQ  BX, R10
	SUBQ  BX, DI
	SUBQ  BX, DI
	MOVQ  $8, DX
	JMP   outbody

outnext:
	// the next row of tiles: m skips mskip tiles, y moves to the start of
	// its next pair of rows
	MOVQ mskip+48(FP), BX
	SHLQ $2, BX
	ADDQ BX, SI
	ADDQ BX, R8
	ADDQ BX, R9
	ADDQ BX, R10
	ADDQ R11, DI
	ADDQ R11, DI
	MOVQ n+32(FP), BX
	SHLQ $3, BX
	SUBQ BX, DI
	DECQ AX
	JNZ  outrow
	VZEROUPPER
	RET

// func winoOutputPool8(y *float32, arg *uint8, m *float32, s, n int, b float32, relu bool)
TEXT ·winoOutputPool8(SB), NOSPLIT, $0-45
	MOVQ y+0(FP), DI
	MOVQ arg+8(FP), AX
	MOVQ m+16(FP), SI
	MOVQ s+24(FP), CX
	POINTS
	VBROADCASTSS b+40(FP), Y15
	MOVBLZX relu+44(FP), R13
	MOVQ n+32(FP), DX
	MOVL $3, BX
	VMOVD BX, X13
	VPBROADCASTD X13, Y13 // 3

poolloop:
	CMPQ DX, $8
	JLT  pooltail

poolbody:
	OUTT
	VADDPS Y15, Y8, Y8   // a0
	VADDPS Y15, Y9, Y9   // a1
	VADDPS Y15, Y10, Y10 // b0
	VADDPS Y15, Y11, Y11 // b1

	// mx = max(max(a0, a1), max(b0, b1)) = −min(min(−a0, −a1), min(−b0, −b1))
	VXORPS Y14, Y8, Y0
	VXORPS Y14, Y9, Y1
	VXORPS Y14, Y10, Y2
	VXORPS Y14, Y11, Y3
	GOMIN(Y0, Y1, Y4, Y12)
	GOMIN(Y2, Y3, Y5, Y12)
	GOMIN(Y4, Y5, Y6, Y12) // −mx
	VXORPS Y14, Y6, Y7     // mx

	// arg: 0 if a0 == mx, else 1 if a1 == mx, else 2 if b0 == mx, else 3
	VCMPPS    $0, Y7, Y10, Y0
	VCMPPS    $0, Y7, Y9, Y1
	VCMPPS    $0, Y7, Y8, Y2
	VPSRLD    $1, Y13, Y4   // 1
	VPADDD    Y0, Y13, Y3   // 3, or 2 where b0 == mx
	VBLENDVPS Y1, Y4, Y3, Y3
	VPANDN    Y3, Y2, Y3

	TESTQ R13, R13
	JZ    poolstore
	// max(mx, 0) = −min(−mx, −0)
	GOMIN(Y6, Y14, Y5, Y12)
	VXORPS Y14, Y5, Y7

poolstore:
	VMOVUPS      Y7, (DI)
	VEXTRACTI128 $1, Y3, X4
	VPACKSSDW    X4, X3, X3
	VPACKUSWB    X3, X3, X3
	VMOVQ        X3, (AX)
	ADDQ         $32, SI
	ADDQ         $32, R8
	ADDQ         $32, R9
	ADDQ         $32, R10
	ADDQ         $32, DI
	ADDQ         $8, AX
	SUBQ         $8, DX
	JMP          poolloop

pooltail:
	TESTQ DX, DX
	JZ    pooldone
	MOVQ  $8, BX
	SUBQ  DX, BX
	SUBQ  BX, AX
	SHLQ  $2, BX
	SUBQ  BX, SI
	SUBQ  BX, R8
	SUBQ  BX, R9
	SUBQ  BX, R10
	SUBQ  BX, DI
	MOVQ  $8, DX
	JMP   poolbody

pooldone:
	VZEROUPPER
	RET

// GROW stores one row of the output gradient transform, h·Aᵀ for the
// row's (H0, H1): H0, H0 + H1, H0 − H1 and −H1 at P, P + CX, P + 2·CX and
// P + R12 (Y14: −0 in every lane; Y12 clobbered).
#define GROW(H0, H1, P) \
	VMOVUPS H0, (P); \
	VADDPS H1, H0, Y12; \
	VMOVUPS Y12, (P)(CX*1); \
	VSUBPS H1, H0, Y12; \
	VMOVUPS Y12, (P)(CX*2); \
	VXORPS Y14, H1, Y12; \
	VMOVUPS Y12, (P)(R12*1)

// GRADT stores A·g·Aᵀ of 8 tiles with g00, g01, g10, g11 in Y0..Y3 to the
// 16 points at SI, R8, R9, R10 (as OUTT reads them): the rows
// h0 = g0, h1 = g0 + g1, h2 = g0 − g1, h3 = −g1, then GROW, as
// outputGradTile does. Y4, Y5, Y12 are clobbered.
#define GRADT \
	GROW(Y0, Y1, SI); \
	VADDPS Y2, Y0, Y4; \
	VADDPS Y3, Y1, Y5; \
	GROW(Y4, Y5, R8); \
	VSUBPS Y2, Y0, Y4; \
	VSUBPS Y3, Y1, Y5; \
	GROW(Y4, Y5, R9); \
	VXORPS Y14, Y2, Y4; \
	VXORPS Y14, Y3, Y5; \
	GROW(Y4, Y5, R10)

// DEINT16 splits the 16 values at R into their even (E) and odd (O)
// elements (Y12, Y13 clobbered).
#define DEINT16(R, E, O) \
	VMOVUPS 0(R), Y12; \
	VMOVUPS 32(R), Y13; \
	VSHUFPS $0x88, Y13, Y12, E; \
	VSHUFPS $0xDD, Y13, Y12, O; \
	VPERMPD $0xD8, E, E; \
	VPERMPD $0xD8, O, O

// func winoOutputGradRows(dm *float32, s int, dy *float32, ow, n, rows, mskip int)
TEXT ·winoOutputGradRows(SB), NOSPLIT, $0-56
	MOVQ dm+0(FP), SI
	MOVQ s+8(FP), CX
	POINTS
	MOVQ dy+16(FP), DI
	MOVQ ow+24(FP), R11
	SHLQ $2, R11
	MOVQ rows+40(FP), AX

gradrow:
	MOVQ n+32(FP), DX

gradloop:
	CMPQ DX, $8
	JLT  gradtail

gradbody:
	DEINT16(DI, Y0, Y1)
	LEAQ (DI)(R11*1), BX
	DEINT16(BX, Y2, Y3)
	GRADT
	ADDQ $32, SI
	ADDQ $32, R8
	ADDQ $32, R9
	ADDQ $32, R10
	ADDQ $64, DI
	SUBQ $8, DX
	JMP  gradloop

gradtail:
	TESTQ DX, DX
	JZ    gradnext
	MOVQ  $8, BX
	SUBQ  DX, BX
	SHLQ  $2, BX
	SUBQ  BX, SI
	SUBQ  BX, R8
	SUBQ  BX, R9
	SUBQ  BX, R10
	SUBQ  BX, DI
	SUBQ  BX, DI
	MOVQ  $8, DX
	JMP   gradbody

gradnext:
	MOVQ mskip+48(FP), BX
	SHLQ $2, BX
	ADDQ BX, SI
	ADDQ BX, R8
	ADDQ BX, R9
	ADDQ BX, R10
	ADDQ R11, DI
	ADDQ R11, DI
	MOVQ n+32(FP), BX
	SHLQ $3, BX
	SUBQ BX, DI
	DECQ AX
	JNZ  gradrow
	VZEROUPPER
	RET

// func winoOutputPoolGrad8(dm *float32, s int, dy *float32, arg *uint8, y *float32, n int, sum *[4]float32)
TEXT ·winoOutputPoolGrad8(SB), NOSPLIT, $0-56
	MOVQ dm+0(FP), SI
	MOVQ s+8(FP), CX
	POINTS
	MOVQ dy+16(FP), DI
	MOVQ arg+24(FP), AX
	MOVQ y+32(FP), R11
	MOVQ n+40(FP), DX
	MOVQ sum+48(FP), R13
	VMOVUPS (R13), X15
	MOVL $3, BX
	VMOVD BX, X13
	VPBROADCASTD X13, Y11 // 3
	VPSRLD $1, Y11, Y9    // 1
	VPSUBD Y9, Y11, Y10   // 2
	VPXOR  Y8, Y8, Y8     // 0
	SHRQ   $3, DX
	JZ     pgdone

pgloop:
	VMOVUPS (DI), Y7
	TESTQ   R11, R11
	JZ      pgsum
	// the ReLU's gate, as the models' reluGate: d where −bits(y) < 0 as an
	// int32 (y > 0, +Inf, a NaN; also −0, which ReLU never outputs), 0
	// where y is +0 or negative
	VMOVUPS  (R11), Y13
	VPSUBD   Y13, Y8, Y13
	VPSRAD   $31, Y13, Y13
	VANDPS   Y13, Y7, Y7
	ADDQ     $32, R11

pgsum:
	// sum lanes j += d[j], then += d[4+j]: sum32's order
	VADDPS       X7, X15, X15
	VEXTRACTF128 $1, Y7, X13
	VADDPS       X13, X15, X15

	// g = the tile's d at its arg, 0 elsewhere
	VPMOVZXBD (AX), Y6
	VPAND     Y11, Y6, Y6
	VPCMPEQD  Y8, Y6, Y0
	VANDPS    Y7, Y0, Y0
	VPCMPEQD  Y9, Y6, Y1
	VANDPS    Y7, Y1, Y1
	VPCMPEQD  Y10, Y6, Y2
	VANDPS    Y7, Y2, Y2
	VPCMPEQD  Y11, Y6, Y3
	VANDPS    Y7, Y3, Y3
	GRADT
	ADDQ      $32, SI
	ADDQ      $32, R8
	ADDQ      $32, R9
	ADDQ      $32, R10
	ADDQ      $32, DI
	ADDQ      $8, AX
	DECQ      DX
	JNZ       pgloop

pgdone:
	VMOVUPS X15, (R13)
	VZEROUPPER
	RET

// func winoTranspose(dst *float32, ldd int, src *float32, lds, rb, cb int)
// dst[j·ldd + i] = src[i·lds + j] for i < 8·rb, j < 8·cb, in 8×8 blocks.
TEXT ·winoTranspose(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DX
	MOVQ ldd+8(FP), R9
	SHLQ $2, R9
	MOVQ src+16(FP), CX
	MOVQ lds+24(FP), R8
	SHLQ $2, R8
	LEAQ (R8)(R8*2), R10
	LEAQ (R9)(R9*2), R12
	MOVQ rb+32(FP), AX

trow:
	MOVQ CX, SI
	MOVQ DX, DI
	MOVQ cb+40(FP), BX

tblock:
	LEAQ      (SI)(R8*4), R11
	VMOVUPS   (SI), Y0
	VMOVUPS   (SI)(R8*1), Y1
	VMOVUPS   (SI)(R8*2), Y2
	VMOVUPS   (SI)(R10*1), Y3
	VMOVUPS   (R11), Y4
	VMOVUPS   (R11)(R8*1), Y5
	VMOVUPS   (R11)(R8*2), Y6
	VMOVUPS   (R11)(R10*1), Y7
	VUNPCKLPS Y1, Y0, Y8
	VUNPCKHPS Y1, Y0, Y9
	VUNPCKLPS Y3, Y2, Y10
	VUNPCKHPS Y3, Y2, Y11
	VUNPCKLPS Y5, Y4, Y12
	VUNPCKHPS Y5, Y4, Y13
	VUNPCKLPS Y7, Y6, Y14
	VUNPCKHPS Y7, Y6, Y15
	VSHUFPS   $0x44, Y10, Y8, Y0
	VSHUFPS   $0xEE, Y10, Y8, Y1
	VSHUFPS   $0x44, Y11, Y9, Y2
	VSHUFPS   $0xEE, Y11, Y9, Y3
	VSHUFPS   $0x44, Y14, Y12, Y4
	VSHUFPS   $0xEE, Y14, Y12, Y5
	VSHUFPS   $0x44, Y15, Y13, Y6
	VSHUFPS   $0xEE, Y15, Y13, Y7
	LEAQ      (DI)(R9*4), R13
	VPERM2F128 $0x20, Y4, Y0, Y8
	VMOVUPS   Y8, (DI)
	VPERM2F128 $0x20, Y5, Y1, Y8
	VMOVUPS   Y8, (DI)(R9*1)
	VPERM2F128 $0x20, Y6, Y2, Y8
	VMOVUPS   Y8, (DI)(R9*2)
	VPERM2F128 $0x20, Y7, Y3, Y8
	VMOVUPS   Y8, (DI)(R12*1)
	VPERM2F128 $0x31, Y4, Y0, Y8
	VMOVUPS   Y8, (R13)
	VPERM2F128 $0x31, Y5, Y1, Y8
	VMOVUPS   Y8, (R13)(R9*1)
	VPERM2F128 $0x31, Y6, Y2, Y8
	VMOVUPS   Y8, (R13)(R9*2)
	VPERM2F128 $0x31, Y7, Y3, Y8
	VMOVUPS   Y8, (R13)(R12*1)
	ADDQ      $32, SI
	LEAQ      (R13)(R9*4), DI
	DECQ      BX
	JNZ       tblock

	LEAQ (CX)(R8*8), CX
	ADDQ $32, DX
	DECQ AX
	JNZ  trow
	VZEROUPPER
	RET
