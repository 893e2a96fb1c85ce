package kernels

import (
	"fmt"
	"math"
)

// BF16 is a bfloat16 value: the upper 16 bits of an IEEE 754 binary32
// (1 sign, 8 exponent and 7 mantissa bits), the storage type of bf16
// mixed precision.
type BF16 uint16

// FP16 is an IEEE 754 binary16 value (1 sign, 5 exponent and 10 mantissa
// bits), the storage type of fp16 mixed precision.
type FP16 uint16

// ToBF16 rounds f to the nearest bfloat16, ties to even, as PyTorch's
// c10::BFloat16 does: subnormals round like any other value (the integer
// addition below carries into the exponent exactly when IEEE rounding
// would), values that round past the largest finite bf16 become ±Inf, and
// a NaN stays a NaN, made quiet, with the top of its payload kept.
func ToBF16(f float32) BF16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return BF16(b>>16 | 0x40)
	}
	return BF16((b + 0x7fff + (b>>16)&1) >> 16)
}

// Float32 widens h to float32, exactly: every bf16 is a float32 with 16
// zero bits appended (a signalling NaN stays signalling, as in PyTorch).
func (h BF16) Float32() float32 { return math.Float32frombits(uint32(h) << 16) }

// ToFP16 rounds f to the nearest binary16, ties to even, as IEEE 754 and
// VCVTPS2PH with imm8 0 do: results below the smallest normal are
// subnormal (or ±0), results beyond the largest finite value (65504; from
// 65520 on) are ±Inf, and a NaN stays a NaN, made quiet, with the top 10
// bits of its payload kept.
func ToFP16(f float32) FP16 {
	b := math.Float32bits(f)
	sign := FP16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00 | FP16(mant>>13)
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15 // the binary16 biased exponent of f's leading bit
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Subnormal result: shift the full significand right by the
		// 13 mantissa bits binary16 lacks plus 1−e more; the values
		// below 2^-25 (e < −10) round to ±0. A float32 subnormal has
		// e = −112, so the implicit bit set here never matters.
		if e < -10 {
			return sign
		}
		return sign | FP16(roundShift(mant|0x800000, uint(14-e)))
	}
	// A carry out of the mantissa moves into the exponent, up to Inf:
	// the right result in both cases.
	return sign | FP16(roundShift(uint32(e)<<23|mant, 13))
}

// roundShift returns x >> s rounded to nearest, ties to even (1 ≤ s < 32).
func roundShift(x uint32, s uint) uint32 {
	q := x >> s
	rem := x & (1<<s - 1)
	half := uint32(1) << (s - 1)
	if rem > half || rem == half && q&1 == 1 {
		q++
	}
	return q
}

// Float32 widens h to float32, exactly; a NaN stays a NaN, made quiet
// (as VCVTPH2PS does), with its payload kept.
func (h FP16) Float32() float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f && mant != 0:
		return math.Float32frombits(sign | 0x7fc00000 | mant<<13)
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000)
	case exp != 0:
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal: normalise, the leading bit becoming the implicit one.
	e := uint32(127 - 15 + 1)
	for mant&0x400 == 0 {
		mant <<= 1
		e--
	}
	return math.Float32frombits(sign | e<<23 | (mant&0x3ff)<<13)
}

// NarrowBF16 sets dst[i] = ToBF16(src[i]); len(dst) must equal len(src).
// It uses VCVTNEPS2BF16 where the CPU has AVX512-BF16 (fixing up the
// subnormal inputs the instruction flushes to zero), so the results are
// ToBF16's on every CPU.
func NarrowBF16(dst []BF16, src []float32) {
	checkHalf("NarrowBF16", len(dst), len(src))
	i := narrowBF16SIMD(dst, src)
	for ; i < len(src); i++ {
		dst[i] = ToBF16(src[i])
	}
}

// WidenBF16 sets dst[i] = src[i].Float32(); len(dst) must equal len(src).
func WidenBF16(dst []float32, src []BF16) {
	checkHalf("WidenBF16", len(dst), len(src))
	i := widenBF16SIMD(dst, src)
	for ; i < len(src); i++ {
		dst[i] = src[i].Float32()
	}
}

// NarrowFP16 sets dst[i] = ToFP16(src[i]); len(dst) must equal len(src).
// It uses VCVTPS2PH (round to nearest even) where the CPU has AVX-512 or
// F16C.
func NarrowFP16(dst []FP16, src []float32) {
	checkHalf("NarrowFP16", len(dst), len(src))
	i := narrowFP16SIMD(dst, src)
	for ; i < len(src); i++ {
		dst[i] = ToFP16(src[i])
	}
}

// WidenFP16 sets dst[i] = src[i].Float32(); len(dst) must equal len(src).
// It uses VCVTPH2PS where the CPU has AVX-512 or F16C.
func WidenFP16(dst []float32, src []FP16) {
	checkHalf("WidenFP16", len(dst), len(src))
	i := widenFP16SIMD(dst, src)
	for ; i < len(src); i++ {
		dst[i] = src[i].Float32()
	}
}

func checkHalf(what string, nd, ns int) {
	if nd != ns {
		panic(fmt.Sprintf("kernels: %s: len(dst)=%d != len(src)=%d", what, nd, ns))
	}
}
