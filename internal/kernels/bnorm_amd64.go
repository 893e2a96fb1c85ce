//go:build amd64

package kernels

import "golang.org/x/sys/cpu"

// bnSIMD selects the AVX-512 batch-norm kernels (a variable so that
// tests can run the Go code on the same machine).
var bnSIMD = bnAVX512

var bnAVX512 = cpu.X86.HasAVX512F

// accSumAVX adds x (n values, a multiple of 16) into the lanes of a.
//
//go:noescape
func accSumAVX(a *Acc64, x *float32, n int)

// accSqDevAVX adds (x − mu)² into the lanes of a.
//
//go:noescape
func accSqDevAVX(a *Acc64, x *float32, n int, mu float64)

// accDotAVX adds dy into a and dy·x into b.
//
//go:noescape
func accDotAVX(a, b *Acc64, dy, x *float32, n int)

// bnNormalizeAVX is BNNormalize on n values, a multiple of 16.
//
//go:noescape
func bnNormalizeAVX(xhat, y, x *float32, n int, mean, inv, gamma, beta float32)

// bnInputGradAVX is BNInputGrad on n values, a multiple of 16.
//
//go:noescape
func bnInputGradAVX(dx, dy, xhat *float32, n int, k, meanDy, meanDyx float32)

func accSum(a *Acc64, x []float32) {
	if !bnSIMD {
		accSumGo(a, x)
		return
	}
	accSumAVX(a, &x[0], len(x))
}

func accSqDev(a *Acc64, x []float32, mu float64) {
	if !bnSIMD {
		accSqDevGo(a, x, mu)
		return
	}
	accSqDevAVX(a, &x[0], len(x), mu)
}

func accDot(a, b *Acc64, dy, x []float32) {
	if !bnSIMD {
		accDotGo(a, b, dy, x)
		return
	}
	_ = x[len(dy)-1]
	accDotAVX(a, b, &dy[0], &x[0], len(dy))
}

func bnNormalizeSIMD(xhat, y, x []float32, mean, inv, g, b float32) bool {
	if !bnSIMD {
		return false
	}
	bnNormalizeAVX(&xhat[0], &y[0], &x[0], len(x), mean, inv, g, b)
	return true
}

func bnInputGradSIMD(dx, dy, xhat []float32, k, meanDy, meanDyx float32) bool {
	if !bnSIMD {
		return false
	}
	bnInputGradAVX(&dx[0], &dy[0], &xhat[0], len(dx), k, meanDy, meanDyx)
	return true
}

// bnNormalizeYAVX is BNNormalize without xhat.
//
//go:noescape
func bnNormalizeYAVX(y, x *float32, n int, mean, inv, gamma, beta float32)

// accDotNormAVX is accDotAVX on x̂ = (x − mean)·inv.
//
//go:noescape
func accDotNormAVX(a, b *Acc64, dy, x *float32, n int, mean, inv float32)

// bnInputGradNormAVX is bnInputGradAVX on x̂ = (x − mean)·inv.
//
//go:noescape
func bnInputGradNormAVX(dx, dy, x *float32, n int, mean, inv, k, meanDy, meanDyx float32)

func bnNormalizeYSIMD(y, x []float32, mean, inv, g, b float32) bool {
	if !bnSIMD {
		return false
	}
	bnNormalizeYAVX(&y[0], &x[0], len(x), mean, inv, g, b)
	return true
}

func accDotNorm(a, b *Acc64, dy, x []float32, mean, inv float32) {
	if !bnSIMD {
		accDotNormGo(a, b, dy, x, mean, inv)
		return
	}
	_ = x[len(dy)-1]
	accDotNormAVX(a, b, &dy[0], &x[0], len(dy), mean, inv)
}

func bnInputGradNormSIMD(dx, dy, x []float32, mean, inv, k, meanDy, meanDyx float32) bool {
	if !bnSIMD {
		return false
	}
	bnInputGradNormAVX(&dx[0], &dy[0], &x[0], len(dx), mean, inv, k, meanDy, meanDyx)
	return true
}
