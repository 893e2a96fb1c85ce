//go:build amd64

#include "textflag.h"

// func convSmallRowAVX(y *float32, ys int, x *float32, offs *int, k int, wb, bb *float32, f, n, relu int, mask *uint8, ms int)
//
// AX: position of the current vector; SI = x + pos, DI = y + pos (moving
// by ys per filter); R8 = offs, R13 = k, R9 / R10 walk wb / bb; DX: the
// filters left; CX: tap index; R11: tap offset; R12 = n; BX = ys; R15:
// the vector's index in the row, R14 its gate byte (moving by ms per
// filter).
TEXT ·convSmallRowAVX(SB), NOSPLIT, $0-96
	MOVQ ys+8(FP), BX
	MOVQ offs+24(FP), R8
	MOVQ k+32(FP), R13
	MOVQ n+64(FP), R12
	VXORPS Y15, Y15, Y15
	XORQ AX, AX

vec:
	MOVQ AX, R15
	SHRQ $3, R15
	LEAQ 8(AX), R11
	CMPQ R11, R12
	JLE  vecok
	MOVQ R12, AX
	SUBQ $8, AX

vecok:
	MOVQ mask+80(FP), R14
	ADDQ R15, R14
	MOVQ x+16(FP), SI
	LEAQ (SI)(AX*4), SI
	MOVQ y+0(FP), DI
	LEAQ (DI)(AX*4), DI
	MOVQ wb+40(FP), R9
	MOVQ bb+48(FP), R10
	MOVQ f+56(FP), DX
	CMPQ DX, $8
	JLT  single

group8:
	VMOVUPS 0(R10), Y0
	VMOVUPS 32(R10), Y1
	VMOVUPS 64(R10), Y2
	VMOVUPS 96(R10), Y3
	VMOVUPS 128(R10), Y4
	VMOVUPS 160(R10), Y5
	VMOVUPS 192(R10), Y6
	VMOVUPS 224(R10), Y7
	ADDQ    $256, R10
	XORQ    CX, CX

tap8:
	MOVQ        (R8)(CX*8), R11
	VMOVUPS     (SI)(R11*1), Y8
	VFMADD231PS 0(R9), Y8, Y0
	VFMADD231PS 32(R9), Y8, Y1
	VFMADD231PS 64(R9), Y8, Y2
	VFMADD231PS 96(R9), Y8, Y3
	VFMADD231PS 128(R9), Y8, Y4
	VFMADD231PS 160(R9), Y8, Y5
	VFMADD231PS 192(R9), Y8, Y6
	VFMADD231PS 224(R9), Y8, Y7
	ADDQ        $256, R9
	INCQ        CX
	CMPQ        CX, R13
	JLT         tap8

	CMPQ relu+72(FP), $0
	JEQ  store8
	// max(0, acc), returning acc when it is a NaN
	VMAXPS Y0, Y15, Y0
	VMAXPS Y1, Y15, Y1
	VMAXPS Y2, Y15, Y2
	VMAXPS Y3, Y15, Y3
	VMAXPS Y4, Y15, Y4
	VMAXPS Y5, Y15, Y5
	VMAXPS Y6, Y15, Y6
	VMAXPS Y7, Y15, Y7
	// the gate bytes: lane l set when the output is > 0 as an int32
	VPCMPGTD  Y15, Y0, Y8
	VMOVMSKPS Y8, R11
	MOVB      R11, (R14)
	ADDQ      ms+88(FP), R14
	VPCMPGTD  Y15, Y1, Y8
	VMOVMSKPS Y8, R11
	MOVB      R11, (R14)
	ADDQ      ms+88(FP), R14
	VPCMPGTD  Y15, Y2, Y8
	VMOVMSKPS Y8, R11
	MOVB      R11, (R14)
	ADDQ      ms+88(FP), R14
	VPCMPGTD  Y15, Y3, Y8
	VMOVMSKPS Y8, R11
	MOVB      R11, (R14)
	ADDQ      ms+88(FP), R14
	VPCMPGTD  Y15, Y4, Y8
	VMOVMSKPS Y8, R11
	MOVB      R11, (R14)
	ADDQ      ms+88(FP), R14
	VPCMPGTD  Y15, Y5, Y8
	VMOVMSKPS Y8, R11
	MOVB      R11, (R14)
	ADDQ      ms+88(FP), R14
	VPCMPGTD  Y15, Y6, Y8
	VMOVMSKPS Y8, R11
	MOVB      R11, (R14)
	ADDQ      ms+88(FP), R14
	VPCMPGTD  Y15, Y7, Y8
	VMOVMSKPS Y8, R11
	MOVB      R11, (R14)
	ADDQ      ms+88(FP), R14

store8:
	VMOVUPS Y0, (DI)
	ADDQ    BX, DI
	VMOVUPS Y1, (DI)
	ADDQ    BX, DI
	VMOVUPS Y2, (DI)
	ADDQ    BX, DI
	VMOVUPS Y3, (DI)
	ADDQ    BX, DI
	VMOVUPS Y4, (DI)
	ADDQ    BX, DI
	VMOVUPS Y5, (DI)
	ADDQ    BX, DI
	VMOVUPS Y6, (DI)
	ADDQ    BX, DI
	VMOVUPS Y7, (DI)
	ADDQ    BX, DI
	SUBQ    $8, DX
	CMPQ    DX, $8
	JGE     group8

single:
	CMPQ DX, $0
	JEQ  nextvec
	VMOVUPS (R10), Y0
	VXORPS  Y1, Y1, Y1
	ADDQ    $32, R10
	XORQ    CX, CX

tap1:
	// two accumulators for even and odd taps, to halve the FMA chain
	MOVQ        (R8)(CX*8), R11
	VMOVUPS     (SI)(R11*1), Y8
	VFMADD231PS (R9), Y8, Y0
	ADDQ        $32, R9
	INCQ        CX
	CMPQ        CX, R13
	JGE         tap1done
	MOVQ        (R8)(CX*8), R11
	VMOVUPS     (SI)(R11*1), Y9
	VFMADD231PS (R9), Y9, Y1
	ADDQ        $32, R9
	INCQ        CX
	CMPQ        CX, R13
	JLT         tap1

tap1done:
	VADDPS Y1, Y0, Y0
	CMPQ   relu+72(FP), $0
	JEQ    store1
	VMAXPS    Y0, Y15, Y0
	VPCMPGTD  Y15, Y0, Y8
	VMOVMSKPS Y8, R11
	MOVB      R11, (R14)
	ADDQ      ms+88(FP), R14

store1:
	VMOVUPS Y0, (DI)
	ADDQ    BX, DI
	DECQ    DX
	JMP     single

nextvec:
	ADDQ $8, AX
	CMPQ AX, R12
	JLT  vec
	VZEROUPPER
	RET

// GTAP(i, Y) adds dy·x of tap i (k > i) into Y, or jumps to gdone when
// k ≤ i.
#define GTAP(i, off, Y) \
	CMPQ        R13, $(i+1); \
	JLT         gdone; \
	MOVQ        off(R8), R11; \
	VFMADD231PS (R14)(R11*1), Y13, Y

// func convSmallGradAVX(acc, dy *float32, mask *uint8, x *float32, offs *int, k, outH, outW, rowStride int, tail *float32)
//
// Y0..Y11: Σ dy·x per tap, Y12: Σ dy, Y13: the current dy vector, Y15:
// the lane bits 1..128 (tail[8:16]). DX / R9: dy / gate bytes of the
// current row (R9 nil: no gate); SI: x of the current row; AX: position
// in the row, R15 the vector's index; R10: rows left; R12 = outW; R13 =
// k; CX = gate bytes per row; DI = rowStride; BX = tail.
TEXT ·convSmallGradAVX(SB), NOSPLIT, $0-80
	MOVQ   dy+8(FP), DX
	MOVQ   mask+16(FP), R9
	MOVQ   x+24(FP), SI
	MOVQ   offs+32(FP), R8
	MOVQ   k+40(FP), R13
	MOVQ   outH+48(FP), R10
	MOVQ   outW+56(FP), R12
	MOVQ   rowStride+64(FP), DI
	MOVQ   tail+72(FP), BX
	MOVQ   R12, CX
	ADDQ   $7, CX
	SHRQ   $3, CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	VXORPS Y12, Y12, Y12
	VMOVUPS 32(BX), Y15

grow:
	XORQ AX, AX

gvec:
	LEAQ    8(AX), R11
	CMPQ    R11, R12
	JLE     gfull
	// the row's last vector overlaps the previous one: keep only its new lanes
	MOVQ    AX, R15
	SHRQ    $3, R15
	MOVQ    R12, AX
	SUBQ    $8, AX
	VMOVUPS (DX)(AX*4), Y13
	VANDPS  (BX), Y13, Y13
	JMP     gload

gfull:
	MOVQ    AX, R15
	SHRQ    $3, R15
	VMOVUPS (DX)(AX*4), Y13

gload:
	TESTQ        R9, R9
	JEQ          gnorelu
	// the ReLU gate: lane l of the vector's byte, spread to a lane mask
	MOVBLZX      (R9)(R15*1), R11
	VMOVD        R11, X14
	VPBROADCASTD X14, Y14
	VPAND        Y15, Y14, Y14
	VPCMPEQD     Y15, Y14, Y14
	VANDPS       Y14, Y13, Y13

gnorelu:
	VADDPS Y13, Y12, Y12
	LEAQ   (SI)(AX*4), R14
	GTAP(0, 0, Y0)
	GTAP(1, 8, Y1)
	GTAP(2, 16, Y2)
	GTAP(3, 24, Y3)
	GTAP(4, 32, Y4)
	GTAP(5, 40, Y5)
	GTAP(6, 48, Y6)
	GTAP(7, 56, Y7)
	GTAP(8, 64, Y8)
	GTAP(9, 72, Y9)
	GTAP(10, 80, Y10)
	GTAP(11, 88, Y11)

gdone:
	ADDQ $8, AX
	CMPQ AX, R12
	JLT  gvec
	LEAQ  (DX)(R12*4), DX
	TESTQ R9, R9
	JEQ   gnomask
	ADDQ  CX, R9

gnomask:
	ADDQ DI, SI
	DECQ R10
	JNZ  grow

	MOVQ    acc+0(FP), DI
	VADDPS  0(DI), Y0, Y0
	VMOVUPS Y0, 0(DI)
	VADDPS  32(DI), Y1, Y1
	VMOVUPS Y1, 32(DI)
	VADDPS  64(DI), Y2, Y2
	VMOVUPS Y2, 64(DI)
	VADDPS  96(DI), Y3, Y3
	VMOVUPS Y3, 96(DI)
	VADDPS  128(DI), Y4, Y4
	VMOVUPS Y4, 128(DI)
	VADDPS  160(DI), Y5, Y5
	VMOVUPS Y5, 160(DI)
	VADDPS  192(DI), Y6, Y6
	VMOVUPS Y6, 192(DI)
	VADDPS  224(DI), Y7, Y7
	VMOVUPS Y7, 224(DI)
	VADDPS  256(DI), Y8, Y8
	VMOVUPS Y8, 256(DI)
	VADDPS  288(DI), Y9, Y9
	VMOVUPS Y9, 288(DI)
	VADDPS  320(DI), Y10, Y10
	VMOVUPS Y10, 320(DI)
	VADDPS  352(DI), Y11, Y11
	VMOVUPS Y11, 352(DI)
	VADDPS  384(DI), Y12, Y12
	VMOVUPS Y12, 384(DI)
	VZEROUPPER
	RET

// func convSmallGrad3AVX(acc, dy *float32, mask *uint8, x *float32, rows *int, nrows, outH, outW, rowStride int, tail *float32)
//
// convSmallGradAVX for kernels 3 wide: the taps are (row r, column j)
// for r < nrows ≤ 4, at byte offset rows[r] + 4j, summed into Y(r·3 + j).
// The FMAs address base + displacement (R11 per kernel row): an indexed
// memory operand would cost a second front-end µop each.
TEXT ·convSmallGrad3AVX(SB), NOSPLIT, $0-80
	MOVQ dy+8(FP), DX
	MOVQ mask+16(FP), R9
	MOVQ x+24(FP), SI
	MOVQ rows+32(FP), R8
	MOVQ nrows+40(FP), R13
	MOVQ outH+48(FP), R10
	MOVQ outW+56(FP), R12
	MOVQ 0(R8), R15
	MOVQ 8(R8), CX
	MOVQ 16(R8), DI
	MOVQ 24(R8), BX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	VXORPS Y12, Y12, Y12
	MOVQ tail+72(FP), R11
	VMOVUPS 32(R11), Y15
	// R8: gate bytes per row
	MOVQ R12, R8
	ADDQ $7, R8
	SHRQ $3, R8

convSmallGrad3AVX_row:
	XORQ AX, AX

convSmallGrad3AVX_vec:
	LEAQ 8(AX), R11
	CMPQ R11, R12
	JLE  convSmallGrad3AVX_full
	MOVQ AX, R14
	SHRQ $3, R14
	MOVQ R12, AX
	SUBQ $8, AX
	VMOVUPS (DX)(AX*4), Y13
	MOVQ tail+72(FP), R11
	VANDPS (R11), Y13, Y13
	JMP  convSmallGrad3AVX_load

convSmallGrad3AVX_full:
	MOVQ AX, R14
	SHRQ $3, R14
	VMOVUPS (DX)(AX*4), Y13

convSmallGrad3AVX_load:
	TESTQ R9, R9
	JEQ   convSmallGrad3AVX_gated
	MOVBLZX      (R9)(R14*1), R11
	VMOVD        R11, X14
	VPBROADCASTD X14, Y14
	VPAND        Y15, Y14, Y14
	VPCMPEQD     Y15, Y14, Y14
	VANDPS       Y14, Y13, Y13

convSmallGrad3AVX_gated:
	VADDPS Y13, Y12, Y12
	LEAQ   (SI)(AX*4), R14
	LEAQ (R14)(R15*1), R11
	VFMADD231PS 0(R11), Y13, Y0
	VFMADD231PS 4(R11), Y13, Y1
	VFMADD231PS 8(R11), Y13, Y2
	CMPQ R13, $2
	JLT  convSmallGrad3AVX_done
	LEAQ (R14)(CX*1), R11
	VFMADD231PS 0(R11), Y13, Y3
	VFMADD231PS 4(R11), Y13, Y4
	VFMADD231PS 8(R11), Y13, Y5
	CMPQ R13, $3
	JLT  convSmallGrad3AVX_done
	LEAQ (R14)(DI*1), R11
	VFMADD231PS 0(R11), Y13, Y6
	VFMADD231PS 4(R11), Y13, Y7
	VFMADD231PS 8(R11), Y13, Y8
	CMPQ R13, $4
	JLT  convSmallGrad3AVX_done
	LEAQ (R14)(BX*1), R11
	VFMADD231PS 0(R11), Y13, Y9
	VFMADD231PS 4(R11), Y13, Y10
	VFMADD231PS 8(R11), Y13, Y11

convSmallGrad3AVX_done:
	ADDQ $8, AX
	CMPQ AX, R12
	JLT  convSmallGrad3AVX_vec
	LEAQ (DX)(R12*4), DX
	TESTQ R9, R9
	JEQ  convSmallGrad3AVX_noy
	ADDQ R8, R9

convSmallGrad3AVX_noy:
	ADDQ rowStride+64(FP), SI
	DECQ R10
	JNZ  convSmallGrad3AVX_row
	MOVQ acc+0(FP), R11
	VADDPS  0(R11), Y0, Y0
	VMOVUPS Y0, 0(R11)
	VADDPS  32(R11), Y1, Y1
	VMOVUPS Y1, 32(R11)
	VADDPS  64(R11), Y2, Y2
	VMOVUPS Y2, 64(R11)
	VADDPS  96(R11), Y3, Y3
	VMOVUPS Y3, 96(R11)
	VADDPS  128(R11), Y4, Y4
	VMOVUPS Y4, 128(R11)
	VADDPS  160(R11), Y5, Y5
	VMOVUPS Y5, 160(R11)
	VADDPS  192(R11), Y6, Y6
	VMOVUPS Y6, 192(R11)
	VADDPS  224(R11), Y7, Y7
	VMOVUPS Y7, 224(R11)
	VADDPS  256(R11), Y8, Y8
	VMOVUPS Y8, 256(R11)
	VADDPS  288(R11), Y9, Y9
	VMOVUPS Y9, 288(R11)
	VADDPS  320(R11), Y10, Y10
	VMOVUPS Y10, 320(R11)
	VADDPS  352(R11), Y11, Y11
	VMOVUPS Y11, 352(R11)
	VADDPS  384(R11), Y12, Y12
	VMOVUPS Y12, 384(R11)
	VZEROUPPER
	RET

// func convSmallGrad5AVX(acc, dy *float32, mask *uint8, x *float32, rows *int, nrows, outH, outW, rowStride int, tail *float32)
//
// convSmallGradAVX for kernels 5 wide: the taps are (row r, column j)
// for r < nrows ≤ 2, at byte offset rows[r] + 4j, summed into Y(r·5 + j).
TEXT ·convSmallGrad5AVX(SB), NOSPLIT, $0-80
	MOVQ dy+8(FP), DX
	MOVQ mask+16(FP), R9
	MOVQ x+24(FP), SI
	MOVQ rows+32(FP), R8
	MOVQ nrows+40(FP), R13
	MOVQ outH+48(FP), R10
	MOVQ outW+56(FP), R12
	MOVQ 0(R8), R15
	MOVQ 8(R8), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	VXORPS Y12, Y12, Y12
	MOVQ tail+72(FP), R11
	VMOVUPS 32(R11), Y15
	// R8: gate bytes per row
	MOVQ R12, R8
	ADDQ $7, R8
	SHRQ $3, R8

convSmallGrad5AVX_row:
	XORQ AX, AX

convSmallGrad5AVX_vec:
	LEAQ 8(AX), R11
	CMPQ R11, R12
	JLE  convSmallGrad5AVX_full
	MOVQ AX, R14
	SHRQ $3, R14
	MOVQ R12, AX
	SUBQ $8, AX
	VMOVUPS (DX)(AX*4), Y13
	MOVQ tail+72(FP), R11
	VANDPS (R11), Y13, Y13
	JMP  convSmallGrad5AVX_load

convSmallGrad5AVX_full:
	MOVQ AX, R14
	SHRQ $3, R14
	VMOVUPS (DX)(AX*4), Y13

convSmallGrad5AVX_load:
	TESTQ R9, R9
	JEQ   convSmallGrad5AVX_gated
	MOVBLZX      (R9)(R14*1), R11
	VMOVD        R11, X14
	VPBROADCASTD X14, Y14
	VPAND        Y15, Y14, Y14
	VPCMPEQD     Y15, Y14, Y14
	VANDPS       Y14, Y13, Y13

convSmallGrad5AVX_gated:
	VADDPS Y13, Y12, Y12
	LEAQ   (SI)(AX*4), R14
	LEAQ (R14)(R15*1), R11
	VFMADD231PS 0(R11), Y13, Y0
	VFMADD231PS 4(R11), Y13, Y1
	VFMADD231PS 8(R11), Y13, Y2
	VFMADD231PS 12(R11), Y13, Y3
	VFMADD231PS 16(R11), Y13, Y4
	CMPQ R13, $2
	JLT  convSmallGrad5AVX_done
	LEAQ (R14)(CX*1), R11
	VFMADD231PS 0(R11), Y13, Y5
	VFMADD231PS 4(R11), Y13, Y6
	VFMADD231PS 8(R11), Y13, Y7
	VFMADD231PS 12(R11), Y13, Y8
	VFMADD231PS 16(R11), Y13, Y9

convSmallGrad5AVX_done:
	ADDQ $8, AX
	CMPQ AX, R12
	JLT  convSmallGrad5AVX_vec
	LEAQ (DX)(R12*4), DX
	TESTQ R9, R9
	JEQ  convSmallGrad5AVX_noy
	ADDQ R8, R9

convSmallGrad5AVX_noy:
	ADDQ rowStride+64(FP), SI
	DECQ R10
	JNZ  convSmallGrad5AVX_row
	MOVQ acc+0(FP), R11
	VADDPS  0(R11), Y0, Y0
	VMOVUPS Y0, 0(R11)
	VADDPS  32(R11), Y1, Y1
	VMOVUPS Y1, 32(R11)
	VADDPS  64(R11), Y2, Y2
	VMOVUPS Y2, 64(R11)
	VADDPS  96(R11), Y3, Y3
	VMOVUPS Y3, 96(R11)
	VADDPS  128(R11), Y4, Y4
	VMOVUPS Y4, 128(R11)
	VADDPS  160(R11), Y5, Y5
	VMOVUPS Y5, 160(R11)
	VADDPS  192(R11), Y6, Y6
	VMOVUPS Y6, 192(R11)
	VADDPS  224(R11), Y7, Y7
	VMOVUPS Y7, 224(R11)
	VADDPS  256(R11), Y8, Y8
	VMOVUPS Y8, 256(R11)
	VADDPS  288(R11), Y9, Y9
	VMOVUPS Y9, 288(R11)
	VADDPS  320(R11), Y10, Y10
	VMOVUPS Y10, 320(R11)
	VADDPS  352(R11), Y11, Y11
	VMOVUPS Y11, 352(R11)
	VADDPS  384(R11), Y12, Y12
	VMOVUPS Y12, 384(R11)
	VZEROUPPER
	RET
