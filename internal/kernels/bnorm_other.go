//go:build !amd64

package kernels

var bnSIMD, bnAVX512 = false, false

func accSum(a *Acc64, x []float32)               { accSumGo(a, x) }
func accSqDev(a *Acc64, x []float32, mu float64) { accSqDevGo(a, x, mu) }
func accDot(a, b *Acc64, dy, x []float32)        { accDotGo(a, b, dy, x) }

func bnNormalizeSIMD(xhat, y, x []float32, mean, inv, g, b float32) bool { return false }

func bnInputGradSIMD(dx, dy, xhat []float32, k, meanDy, meanDyx float32) bool { return false }

func bnNormalizeYSIMD(y, x []float32, mean, inv, g, b float32) bool { return false }

func accDotNorm(a, b *Acc64, dy, x []float32, mean, inv float32) {
	accDotNormGo(a, b, dy, x, mean, inv)
}

func bnInputGradNormSIMD(dx, dy, x []float32, mean, inv, k, meanDy, meanDyx float32) bool {
	return false
}
