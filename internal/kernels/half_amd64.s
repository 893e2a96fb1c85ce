//go:build amd64

#include "textflag.h"

// The Go assembler knows no AVX512-BF16 instructions, so they are spelled
// out as bytes: EVEX.512.F3.0F38.W0 72 /r with ModRM 0xC8 (reg = Y1,
// rm = Z0).
#define VCVTNEPS2BF16_Z0_Y1 BYTE $0x62; BYTE $0xf2; BYTE $0x7e; BYTE $0x48; BYTE $0x72; BYTE $0xc8

// func narrowBF16x16(dst *BF16, src *float32, n int)
TEXT ·narrowBF16x16(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVL $0x7fff, AX
	VPBROADCASTD AX, Z30
	MOVL $1, AX
	VPBROADCASTD AX, Z31

nbf_loop:
	VMOVUPS (SI), Z0
	VCVTNEPS2BF16_Z0_Y1
	VFPCLASSPSZ $0x20, Z0, K1 // subnormal inputs
	KORTESTW K1, K1
	JZ nbf_store

	// ToBF16's rounding, (x + 0x7fff + (x>>16)&1) >> 16, merged into
	// the subnormal lanes only.
	VPSRLD $16, Z0, Z2
	VPANDD Z31, Z2, Z2
	VPADDD Z30, Z2, Z2
	VPADDD Z0, Z2, Z2
	VPSRLD $16, Z2, Z2
	VPMOVDW Z2, Y2
	VMOVDQU16 Y2, K1, Y1

nbf_store:
	VMOVDQU Y1, (DI)
	ADDQ $64, SI
	ADDQ $32, DI
	SUBQ $16, CX
	JNZ nbf_loop
	VZEROUPPER
	RET

// func widenBF16x16(dst *float32, src *BF16, n int)
TEXT ·widenBF16x16(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

wbf_loop:
	VPMOVZXWD (SI), Z0
	VPSLLD $16, Z0, Z0
	VMOVUPS Z0, (DI)
	ADDQ $32, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JNZ wbf_loop
	VZEROUPPER
	RET

// func narrowFP16x16(dst *FP16, src *float32, n int)
TEXT ·narrowFP16x16(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

nfp_loop:
	VMOVUPS (SI), Z0
	VCVTPS2PH $0, Z0, Y1 // imm8 0: round to nearest even, not MXCSR's mode
	VMOVDQU Y1, (DI)
	ADDQ $64, SI
	ADDQ $32, DI
	SUBQ $16, CX
	JNZ nfp_loop
	VZEROUPPER
	RET

// func widenFP16x16(dst *float32, src *FP16, n int)
TEXT ·widenFP16x16(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

wfp_loop:
	VCVTPH2PS (SI), Z0
	VMOVUPS Z0, (DI)
	ADDQ $32, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JNZ wfp_loop
	VZEROUPPER
	RET

// func narrowFP16x8(dst *FP16, src *float32, n int)
TEXT ·narrowFP16x8(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

nfp8_loop:
	VMOVUPS (SI), Y0
	VCVTPS2PH $0, Y0, X1
	VMOVDQU X1, (DI)
	ADDQ $32, SI
	ADDQ $16, DI
	SUBQ $8, CX
	JNZ nfp8_loop
	VZEROUPPER
	RET

// func widenFP16x8(dst *float32, src *FP16, n int)
TEXT ·widenFP16x8(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

wfp8_loop:
	VCVTPH2PS (SI), Y0
	VMOVUPS Y0, (DI)
	ADDQ $16, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JNZ wfp8_loop
	VZEROUPPER
	RET
