//go:build amd64

package kernels

import "golang.org/x/sys/cpu"

// chainSIMD selects GemmChain's AVX-512 kernel (a variable so that
// tests can run the Go code on the same machine).
var chainSIMD = cpu.X86.HasAVX512F

// gemmChain4 computes rows 0..3 of C (n ≥ 1 columns) as GemmChain
// does, A's rows at a, a+rsA, a+2rsA, a+3rsA (strides in elements); the
// last n%32 columns go through the lane masks mlo and mhi (the low and
// high 16 columns of the last block of 32).
//
//go:noescape
func gemmChain4(a *float32, rsA, csA int, b *float32, ldb int, c *float32, ldc, n, k int, acc bool, mlo, mhi uint64)

// gemmChain1 is gemmChain4 for one row.
//
//go:noescape
func gemmChain1(a *float32, csA int, b *float32, c *float32, n, k, ldb int, acc bool, mlo, mhi uint64)

func gemmChainSIMD(m, n, k int, a []float32, rsA, csA int, b []float32, ldb int, acc bool, c []float32, ldc int) {
	t := n % 32
	var mlo, mhi uint64 = 0xffff, 0xffff
	if t != 0 {
		mlo = (1 << min(t, 16)) - 1
		mhi = (1 << max(t-16, 0)) - 1
	}
	i := 0
	for ; i+4 <= m; i += 4 {
		gemmChain4(&a[i*rsA], rsA, csA, &b[0], ldb, &c[i*ldc], ldc, n, k, acc, mlo, mhi)
	}
	for ; i < m; i++ {
		gemmChain1(&a[i*rsA], csA, &b[0], &c[i*ldc], n, k, ldb, acc, mlo, mhi)
	}
}
