package kernels

import (
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// gonumGemm is the pure-Go backend. It is always available but about an
// order of magnitude slower than OpenBLAS on convolution-sized products.
// gonum parallelises large products over GOMAXPROCS goroutines.
type gonumGemm struct{}

func (gonumGemm) name() string { return "gonum" }

func (gonumGemm) gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	gonum.Implementation{}.Sgemm(gonumTrans(transA), gonumTrans(transB), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

func gonumTrans(t bool) blas.Transpose {
	if t {
		return blas.Trans
	}
	return blas.NoTrans
}
