//go:build amd64

package kernels

import "golang.org/x/sys/cpu"

// The conversion kernels in use (variables so that tests can run the Go
// code, or the F16C one, on the same machine).
var (
	// VFPCLASSPS (the subnormal fix-up) is AVX512DQ.
	halfBF16AVX512 = cpu.X86.HasAVX512BF16 && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512DQ
	halfAVX512     = cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW
	// x/sys/cpu does not report F16C; every x86 CPU with AVX2 has it
	// (Intel since Ivy Bridge, AMD since Piledriver).
	halfF16C = cpu.X86.HasAVX2
)

// narrowBF16x16 converts n (a multiple of 16) float32s at src to bf16 at
// dst with VCVTNEPS2BF16, redoing the blocks that hold subnormal inputs
// (which the instruction flushes to zero) with ToBF16's integer rounding.
//
//go:noescape
func narrowBF16x16(dst *BF16, src *float32, n int)

// widenBF16x16 widens n (a multiple of 16) bf16s at src to dst.
//
//go:noescape
func widenBF16x16(dst *float32, src *BF16, n int)

// narrowFP16x16 converts n (a multiple of 16) float32s at src to fp16 at
// dst with VCVTPS2PH (imm8 0: round to nearest even).
//
//go:noescape
func narrowFP16x16(dst *FP16, src *float32, n int)

// widenFP16x16 widens n (a multiple of 16) fp16s at src to dst with
// VCVTPH2PS.
//
//go:noescape
func widenFP16x16(dst *float32, src *FP16, n int)

// narrowFP16x8 and widenFP16x8 are the F16C (256-bit) forms, n a
// multiple of 8.
//
//go:noescape
func narrowFP16x8(dst *FP16, src *float32, n int)

//go:noescape
func widenFP16x8(dst *float32, src *FP16, n int)

// The …SIMD functions convert a prefix of src with the CPU's kernel and
// return its length (0 without one); the callers finish the rest.

func narrowBF16SIMD(dst []BF16, src []float32) int {
	n := len(src) &^ 15
	if !halfBF16AVX512 || n == 0 {
		return 0
	}
	narrowBF16x16(&dst[0], &src[0], n)
	return n
}

func widenBF16SIMD(dst []float32, src []BF16) int {
	n := len(src) &^ 15
	if !halfAVX512 || n == 0 {
		return 0
	}
	widenBF16x16(&dst[0], &src[0], n)
	return n
}

func narrowFP16SIMD(dst []FP16, src []float32) int {
	switch {
	case halfAVX512 && len(src) >= 16:
		n := len(src) &^ 15
		narrowFP16x16(&dst[0], &src[0], n)
		return n
	case halfF16C && len(src) >= 8:
		n := len(src) &^ 7
		narrowFP16x8(&dst[0], &src[0], n)
		return n
	}
	return 0
}

func widenFP16SIMD(dst []float32, src []FP16) int {
	switch {
	case halfAVX512 && len(src) >= 16:
		n := len(src) &^ 15
		widenFP16x16(&dst[0], &src[0], n)
		return n
	case halfF16C && len(src) >= 8:
		n := len(src) &^ 7
		widenFP16x8(&dst[0], &src[0], n)
		return n
	}
	return 0
}
