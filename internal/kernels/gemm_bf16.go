package kernels

import (
	"math"
)

// GemmBF16 computes c = alpha·op(a)·op(b) + beta·c like Gemm, with a and b
// in bf16 and the products accumulated in float32: the matrix product of
// bf16 autocast. Shapes, strides, transposition and beta == 0 (c is
// overwritten without being read) are as for Gemm.
//
// The sums are those of AVX512-BF16's VDPBF16PS, which GemmBF16 runs where
// the CPU has it and the Go code reproduces elsewhere, so that the bits
// are the same on every CPU (the order is Intel's pseudo-code for the
// instruction, checked on AMD Zen 5 by TestGemmBF16KernelMatchesGo): along K in blocks of bf16KC (256), K-pair by
// K-pair, each pair adding its odd then its even product, exact, to a
// float32 accumulator with one rounding each (to nearest even), subnormal
// inputs and sums taken as zero (DAZ and FTZ; an odd K is padded with a
// zero pair element); then c = alpha·acc + beta·c for the first block and
// c = alpha·acc + c for the others, unfused and without the flushing. The
// error of each element is within (k+2)·2⁻²⁴·(|alpha|·Σ|a·b| + |beta·c|),
// the bound of any order of float32 sums, plus 2⁻¹²⁶ per flushed sum.
func GemmBF16(transA, transB bool, m, n, k int, alpha float32, a []BF16, lda int, b []BF16, ldb int, beta float32, c []float32, ldc int) {
	checkGemmShapes("GemmBF16", transA, transB, m, n, k, len(a), lda, len(b), ldb, len(c), ldc)
	if m == 0 || n == 0 {
		return
	}
	if k == 0 || alpha == 0 {
		scale(c, m, n, ldc, beta)
		return
	}
	if gemmBF16SIMD(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) {
		return
	}
	gemmBF16Go(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// bf16KC is the K block of GemmBF16's sums (even: blocks hold whole
// K-pairs).
const bf16KC = 256

// gemmBF16Go is GemmBF16's Go code: VDPBF16PS's sums one row of c at a
// time, in the order GemmBF16 documents.
func gemmBF16Go(transA, transB bool, m, n, k int, alpha float32, a []BF16, lda int, b []BF16, ldb int, beta float32, c []float32, ldc int) {
	acc := make([]float32, n)
	be, bo := make([]float32, n), make([]float32, n) // rows 2p and 2p+1 of op(b), widened with DAZ
	opB := func(dst []float32, p int) {
		for j := range dst {
			if p >= k {
				dst[j] = 0
			} else if transB {
				dst[j] = bf16DAZ(b[j*ldb+p])
			} else {
				dst[j] = bf16DAZ(b[p*ldb+j])
			}
		}
	}
	opA := func(i, p int) float32 {
		switch {
		case p >= k:
			return 0
		case transA:
			return bf16DAZ(a[p*lda+i])
		}
		return bf16DAZ(a[i*lda+p])
	}
	for k0 := 0; k0 < k; k0 += bf16KC {
		kc := min(bf16KC, k-k0)
		for i := range m {
			clear(acc)
			for p := k0; p < k0+kc; p += 2 {
				// Rows of b are widened again for every row of a:
				// this is the slow path.
				opB(be, p)
				opB(bo, p+1)
				ae, ao := float64(opA(i, p)), float64(opA(i, p+1))
				for j := range acc {
					acc[j] = ftz(float32(float64(acc[j]) + ao*float64(bo[j])))
					acc[j] = ftz(float32(float64(acc[j]) + ae*float64(be[j])))
				}
			}
			row := c[i*ldc : i*ldc+n]
			for j, s := range acc {
				switch {
				case k0 > 0:
					row[j] = float32(alpha*s) + row[j]
				case beta == 0:
					row[j] = alpha * s
				default:
					row[j] = float32(alpha*s) + float32(beta*row[j])
				}
			}
		}
	}
}

// bf16DAZ widens h, subnormals as signed zeros.
func bf16DAZ(h BF16) float32 {
	if h&0x7f80 == 0 {
		h &= 0x8000
	}
	return h.Float32()
}

// ftz returns x, or a zero of its sign when x is subnormal.
//
// The sums above are computed in float64 and rounded once to float32: a
// product of two bf16 (8-bit significands) is exact in float64, and so is
// its sum with a float32 unless the two are 2³⁰ or more apart, where the
// float64 rounding cannot move the sum onto a float32 rounding boundary
// (the small term lies wholly below the float32 one's half ulp).
func ftz(x float32) float32 {
	if b := math.Float32bits(x); b&0x7f800000 == 0 {
		return math.Float32frombits(b & 0x80000000)
	}
	return x
}
