package kernels

import "fmt"

// GemmChain is the engine's own float32 product for the shapes of a
// convolution's per-sample and Winograd products: few rows (output or
// input channels), a short inner dimension (channels) and many columns
// (pixels or tiles). OpenBLAS runs these as many small calls, each paying
// a cgo call and the packing of B; this kernel reads B in place and keeps
// a 4×32 block of C in AVX-512 registers.
//
// Each element of C is one fused multiply-add chain over p = 0, 1, …, k−1
// from 0, then stored (or added to C's value with acc): its bits depend on
// its row of A and column of B only, never on m, n or where a call starts.
// So a sample's output is the same whether its columns are computed alone
// or beside other samples', and whatever the thread split of a batch.
// That is not OpenBLAS's rounding: layers that use it (Conv2D.Chain)
// give different last bits from the OpenBLAS path.

// ChainOK reports whether GemmChain has its vector kernel on this
// machine; without it GemmChain runs the Go code, which is much slower
// than Gemm, so callers should keep to Gemm then.
func ChainOK() bool { return chainSIMD }

// GemmChain sets C (m×n at row stride ldc) to A·B, or adds A·B to it
// when acc is set. A is m×k with element (i, p) at a[i·rsA + p·csA]
// (rsA = k, csA = 1 for a row-major A; rsA = 1, csA = m' for the
// transpose of a row-major (k, m') matrix); B is k×n row-major at row
// stride ldb.
func GemmChain(m, n, k int, a []float32, rsA, csA int, b []float32, ldb int, acc bool, c []float32, ldc int) {
	if m < 0 || n < 0 || k < 0 || rsA < 0 || csA < 0 || ldb < n || ldc < n {
		panic(fmt.Sprintf("kernels: GemmChain: bad sizes m=%d n=%d k=%d rsA=%d csA=%d ldb=%d ldc=%d", m, n, k, rsA, csA, ldb, ldc))
	}
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		if !acc {
			for i := range m {
				clear(c[i*ldc : i*ldc+n])
			}
		}
		return
	}
	if need := (m-1)*rsA + (k-1)*csA + 1; len(a) < need {
		panic(fmt.Sprintf("kernels: GemmChain: len(a)=%d, want ≥ %d", len(a), need))
	}
	if need := (k-1)*ldb + n; len(b) < need {
		panic(fmt.Sprintf("kernels: GemmChain: len(b)=%d, want ≥ %d", len(b), need))
	}
	if need := (m-1)*ldc + n; len(c) < need {
		panic(fmt.Sprintf("kernels: GemmChain: len(c)=%d, want ≥ %d", len(c), need))
	}
	if !chainSIMD {
		gemmChainGo(m, n, k, a, rsA, csA, b, ldb, acc, c, ldc)
		return
	}
	gemmChainSIMD(m, n, k, a, rsA, csA, b, ldb, acc, c, ldc)
}

// gemmChainGo is GemmChain in Go with each multiply-add rounded twice
// (Go does not promise a fused one): the same sums, not the same bits.
func gemmChainGo(m, n, k int, a []float32, rsA, csA int, b []float32, ldb int, acc bool, c []float32, ldc int) {
	for i := range m {
		row := c[i*ldc : i*ldc+n]
		for j := range row {
			var s float32
			for p := range k {
				s += a[i*rsA+p*csA] * b[p*ldb+j]
			}
			if acc {
				row[j] += s
			} else {
				row[j] = s
			}
		}
	}
}
