//go:build !amd64

package kernels

var chainSIMD = false

func gemmChainSIMD(m, n, k int, a []float32, rsA, csA int, b []float32, ldb int, acc bool, c []float32, ldc int) {
	panic("kernels: gemmChainSIMD without its kernel")
}
