//go:build amd64

#include "textflag.h"

// The AVX-512 depthwise kernels (depthwise_fast.go explains the layout).
// A chunk (dwChunk, 24 bytes) is the int32 flat offset of its first
// output, then nine 16-bit tap masks (ki·3+kj) and the mask of the
// lanes that are outputs. Masked-off lanes of a memory operand are not
// read, so taps that fall before or after the plane cost nothing.

// func dw3x3Planes(y, x, w *float32, planes, hw, width int, chunks *dwChunk, nchunks int, flip bool)
//
// Z16..Z24 hold the plane's nine weights (reversed when flip is set);
// the three kernel rows are summed in Z0, Z1, Z2, then added in order.
TEXT ·dw3x3Planes(SB), NOSPLIT, $0-65
	MOVQ y+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), DX
	MOVQ planes+24(FP), CX
	MOVQ hw+32(FP), R8
	SHLQ $2, R8
	MOVQ width+40(FP), R9
	SHLQ $2, R9
	MOVQ chunks+48(FP), R10
	MOVQ nchunks+56(FP), R11
	IMULQ $24, R11
	ADDQ R10, R11

plane:
	MOVBLZX flip+64(FP), R12
	TESTQ R12, R12
	JNZ flipped
	VBROADCASTSS 0(DX), Z16
	VBROADCASTSS 4(DX), Z17
	VBROADCASTSS 8(DX), Z18
	VBROADCASTSS 12(DX), Z19
	VBROADCASTSS 16(DX), Z20
	VBROADCASTSS 20(DX), Z21
	VBROADCASTSS 24(DX), Z22
	VBROADCASTSS 28(DX), Z23
	VBROADCASTSS 32(DX), Z24
	JMP chunks

flipped:
	VBROADCASTSS 32(DX), Z16
	VBROADCASTSS 28(DX), Z17
	VBROADCASTSS 24(DX), Z18
	VBROADCASTSS 20(DX), Z19
	VBROADCASTSS 16(DX), Z20
	VBROADCASTSS 12(DX), Z21
	VBROADCASTSS 8(DX), Z22
	VBROADCASTSS 4(DX), Z23
	VBROADCASTSS 0(DX), Z24

chunks:
	MOVQ R10, AX

chunk:
	MOVLQSX 0(AX), R13
	SHLQ $2, R13
	LEAQ (SI)(R13*1), R14 // row ki=1 of the window, at the output
	MOVQ R14, R15
	SUBQ R9, R15          // row ki=0
	LEAQ (R14)(R9*1), BX  // row ki=2
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	KMOVW 4(AX), K1
	KMOVW 6(AX), K2
	KMOVW 8(AX), K3
	VFMADD231PS -4(R15), Z16, K1, Z0
	VFMADD231PS 0(R15), Z17, K2, Z0
	VFMADD231PS 4(R15), Z18, K3, Z0
	KMOVW 10(AX), K4
	KMOVW 12(AX), K5
	KMOVW 14(AX), K6
	VFMADD231PS -4(R14), Z19, K4, Z1
	VFMADD231PS 0(R14), Z20, K5, Z1
	VFMADD231PS 4(R14), Z21, K6, Z1
	KMOVW 16(AX), K1
	KMOVW 18(AX), K2
	KMOVW 20(AX), K3
	VFMADD231PS -4(BX), Z22, K1, Z2
	VFMADD231PS 0(BX), Z23, K2, Z2
	VFMADD231PS 4(BX), Z24, K3, Z2
	KMOVW 22(AX), K7
	VADDPS Z1, Z0, Z0
	VADDPS Z2, Z0, Z0
	VMOVUPS Z0, K7, (DI)(R13*1)
	ADDQ $24, AX
	CMPQ AX, R11
	JB chunk

	ADDQ R8, SI
	ADDQ R8, DI
	ADDQ $36, DX
	DECQ CX
	JNZ plane
	VZEROUPPER
	RET

// HSUMADD adds the sum of the sixteen lanes of Z into the float32 at off(DX),
// using Y/X register T as scratch.
#define HSUMADD(Z, Y, X, TY, TX, off) \
	VEXTRACTF64X4 $1, Z, TY \
	VADDPS TY, Y, Y \
	VEXTRACTF128 $1, Y, TX \
	VADDPS TX, X, X \
	VMOVHLPS X, TX, TX \
	VADDPS TX, X, X \
	VMOVSHDUP X, TX \
	VADDSS TX, X, X \
	VADDSS off(DX), X, X \
	VMOVSS X, off(DX)

// func dw3x3GradPlanes(dw, dy, x *float32, planes, hw, width int, chunks *dwChunk, nchunks int)
//
// Z0..Z8 sum dy times tap t's input over the plane's chunks (Z9: dy).
TEXT ·dw3x3GradPlanes(SB), NOSPLIT, $0-64
	MOVQ dw+0(FP), DX
	MOVQ dy+8(FP), DI
	MOVQ x+16(FP), SI
	MOVQ planes+24(FP), CX
	MOVQ hw+32(FP), R8
	SHLQ $2, R8
	MOVQ width+40(FP), R9
	SHLQ $2, R9
	MOVQ chunks+48(FP), R10
	MOVQ nchunks+56(FP), R11
	IMULQ $24, R11
	ADDQ R10, R11

gplane:
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8
	MOVQ R10, AX

gchunk:
	MOVLQSX 0(AX), R13
	SHLQ $2, R13
	KMOVW 22(AX), K7
	VMOVUPS.Z (DI)(R13*1), K7, Z9
	LEAQ (SI)(R13*1), R14
	MOVQ R14, R15
	SUBQ R9, R15
	LEAQ (R14)(R9*1), BX
	KMOVW 4(AX), K1
	KMOVW 6(AX), K2
	KMOVW 8(AX), K3
	VFMADD231PS -4(R15), Z9, K1, Z0
	VFMADD231PS 0(R15), Z9, K2, Z1
	VFMADD231PS 4(R15), Z9, K3, Z2
	KMOVW 10(AX), K4
	KMOVW 12(AX), K5
	KMOVW 14(AX), K6
	VFMADD231PS -4(R14), Z9, K4, Z3
	VFMADD231PS 0(R14), Z9, K5, Z4
	VFMADD231PS 4(R14), Z9, K6, Z5
	KMOVW 16(AX), K1
	KMOVW 18(AX), K2
	KMOVW 20(AX), K3
	VFMADD231PS -4(BX), Z9, K1, Z6
	VFMADD231PS 0(BX), Z9, K2, Z7
	VFMADD231PS 4(BX), Z9, K3, Z8
	ADDQ $24, AX
	CMPQ AX, R11
	JB gchunk

	HSUMADD(Z0, Y0, X0, Y10, X10, 0)
	HSUMADD(Z1, Y1, X1, Y10, X10, 4)
	HSUMADD(Z2, Y2, X2, Y10, X10, 8)
	HSUMADD(Z3, Y3, X3, Y10, X10, 12)
	HSUMADD(Z4, Y4, X4, Y10, X10, 16)
	HSUMADD(Z5, Y5, X5, Y10, X10, 20)
	HSUMADD(Z6, Y6, X6, Y10, X10, 24)
	HSUMADD(Z7, Y7, X7, Y10, X10, 28)
	HSUMADD(Z8, Y8, X8, Y10, X10, 32)

	ADDQ R8, SI
	ADDQ R8, DI
	ADDQ $36, DX
	DECQ CX
	JNZ gplane
	VZEROUPPER
	RET
