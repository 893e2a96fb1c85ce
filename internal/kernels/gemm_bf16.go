package kernels

import "fmt"

// GemmBF16 computes c = alpha·op(a)·op(b) + beta·c like Gemm, with a and b
// in bf16 and the products accumulated in float32: the matrix product of
// bf16 autocast. Shapes, strides, transposition and beta == 0 (c is
// overwritten without being read) are as for Gemm.
//
// Where the CPU has AVX512-BF16 it runs a VDPBF16PS kernel, which adds the
// products two at a time (K-pairs) in blocks of 256 along K; elsewhere the
// Go code adds them one at a time. Both give each element within
// (k+2)·2⁻²⁴·(|alpha|·Σ|a·b| + |beta·c|) of the exact value (the bound of
// any order of float32 sums), but not the same bits. VDPBF16PS also
// treats subnormal inputs and results as 0 (the Go code does not), an
// absolute error below 2⁻¹²⁶ per product that the bound leaves out.
func GemmBF16(transA, transB bool, m, n, k int, alpha float32, a []BF16, lda int, b []BF16, ldb int, beta float32, c []float32, ldc int) {
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("kernels: GemmBF16: negative size m=%d n=%d k=%d", m, n, k))
	}
	ar, ac := m, k
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
		br, bc = n, k
	}
	checkMatrixLen("GemmBF16", "a", len(a), ar, ac, lda)
	checkMatrixLen("GemmBF16", "b", len(b), br, bc, ldb)
	checkMatrixLen("GemmBF16", "c", len(c), m, n, ldc)
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

// checkMatrixLen panics unless a slice of length l can hold a rows×cols
// row-major matrix with row stride ld (checkMatrix for any element type).
func checkMatrixLen(fn, what string, l, rows, cols, ld int) {
	if ld < max(1, cols) {
		panic(fmt.Sprintf("kernels: %s: ld%s=%d < max(1, %d columns)", fn, what, ld, cols))
	}
	if rows == 0 || cols == 0 {
		return
	}
	if need := (rows-1)*ld + cols; l < need {
		panic(fmt.Sprintf("kernels: %s: len(%s)=%d < %d for a %d×%d matrix with stride %d", fn, what, l, need, rows, cols, ld))
	}
}

// gemmBF16Go is GemmBF16's Go code: each row of c accumulates the rows of
// op(b) scaled by op(a)'s values in order of k, in float32.
func gemmBF16Go(transA, transB bool, m, n, k int, alpha float32, a []BF16, lda int, b []BF16, ldb int, beta float32, c []float32, ldc int) {
	acc := make([]float32, n)
	brow := make([]float32, n)
	for i := range m {
		clear(acc)
		for p := range k {
			var av BF16
			if transA {
				av = a[p*lda+i]
			} else {
				av = a[i*lda+p]
			}
			if transB {
				for j := range brow {
					brow[j] = b[j*ldb+p].Float32()
				}
			} else {
				WidenBF16(brow, b[p*ldb:p*ldb+n])
			}
			x := av.Float32()
			for j, bv := range brow {
				acc[j] += x * bv
			}
		}
		row := c[i*ldc : i*ldc+n]
		for j, s := range acc {
			if beta == 0 {
				row[j] = alpha * s
			} else {
				row[j] = alpha*s + beta*row[j]
			}
		}
	}
}
