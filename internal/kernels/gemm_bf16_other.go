//go:build !amd64

package kernels

// gemmBF16AVX512 is false: there is no vector kernel for this architecture.
var gemmBF16AVX512 = false

func gemmBF16SIMD(transA, transB bool, m, n, k int, alpha float32, a []BF16, lda int, b []BF16, ldb int, beta float32, c []float32, ldc int) bool {
	return false
}
