//go:build !amd64

package kernels

// No vector depthwise kernels off amd64: the Go code runs.
var dwSIMD, dwAVX512 = false, false

func dwPlanes(y, x, w []float32, c, batch, hw, width int, p *dwPlan, flip bool) {
	panic("kernels: dwPlanes without SIMD")
}

func dwGradPlanes(dw, dy, x []float32, c, batch, hw, width int, p *dwPlan) {
	panic("kernels: dwGradPlanes without SIMD")
}
