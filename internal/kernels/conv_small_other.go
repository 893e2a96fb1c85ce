//go:build !amd64

package kernels

// convSmallSIMD is false: without the assembly kernels, im2col is faster.
const convSmallSIMD = false

// convSmallAsm is false: there are no assembly kernels here (tests set it
// on amd64 to run the Go code).
var convSmallAsm = false

func convSmallRow(y []float32, ys int, x []float32, offs []int, wb, bb []float32, f, n, relu int, mask []uint8, ms int) {
	convSmallRowGo(y, ys, x, offs, wb, bb, f, n, relu, mask, ms)
}

func convSmallGradTaps(acc, dy []float32, mask []uint8, x []float32, offs []int, kw, outH, outW, rowStride int, tail *[16]float32) {
	convSmallGradGo(acc, dy, mask, x, offs, outH, outW, rowStride, tail)
}
