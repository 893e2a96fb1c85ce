//go:build amd64

#include "textflag.h"

// func unscale16(p *float32, n int, inv float32, mul bool) (finite bool)
TEXT ·unscale16(SB), NOSPLIT, $0-25
	MOVQ p+0(FP), DI
	MOVQ n+8(FP), CX
	MOVSS inv+16(FP), X1
	VBROADCASTSS X1, Z1
	MOVBLZX mul+20(FP), AX
	KXORW K2, K2, K2 // lanes that held an inf or a NaN

u16_loop:
	VMOVUPS (DI), Z0
	VFPCLASSPSZ $0x99, Z0, K1 // QNaN, +Inf, −Inf, SNaN
	KORW K1, K2, K2
	TESTL AX, AX
	JZ u16_next
	VMULPS Z1, Z0, Z0
	VMOVUPS Z0, (DI)

u16_next:
	ADDQ $64, DI
	SUBQ $16, CX
	JNZ u16_loop
	KORTESTW K2, K2
	SETEQ finite+24(FP)
	VZEROUPPER
	RET

// func unscale8(p *float32, n int, inv float32, mul bool) (finite bool)
TEXT ·unscale8(SB), NOSPLIT, $0-25
	MOVQ p+0(FP), DI
	MOVQ n+8(FP), CX
	MOVSS inv+16(FP), X1
	VBROADCASTSS X1, Y1
	MOVBLZX mul+20(FP), AX
	MOVL $0x7f800000, DX
	MOVL DX, X2
	VPBROADCASTD X2, Y2 // the exponent mask
	VPXOR Y3, Y3, Y3    // lanes whose exponent is all ones: inf or NaN

u8_loop:
	VMOVUPS (DI), Y0
	VPAND Y2, Y0, Y4
	VPCMPEQD Y2, Y4, Y4
	VPOR Y4, Y3, Y3
	TESTL AX, AX
	JZ u8_next
	VMULPS Y1, Y0, Y0
	VMOVUPS Y0, (DI)

u8_next:
	ADDQ $32, DI
	SUBQ $8, CX
	JNZ u8_loop
	VPTEST Y3, Y3
	SETEQ finite+24(FP)
	VZEROUPPER
	RET
