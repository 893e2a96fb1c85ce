//go:build amd64

package kernels

import "golang.org/x/sys/cpu"

// convSmallSIMD reports AVX2 and FMA, which the direct small-channel
// convolution needs to beat im2col.
var convSmallSIMD = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// convSmallAsm selects the assembly kernels (a variable so that tests can
// run the Go code on the same machine).
var convSmallAsm = convSmallSIMD

// convSmallRow writes one output row of every filter: see convSmallRowGo.
func convSmallRow(y []float32, ys int, x []float32, offs []int, wb, bb []float32, f, n, relu int, mask []uint8, ms int) {
	if !convSmallAsm {
		convSmallRowGo(y, ys, x, offs, wb, bb, f, n, relu, mask, ms)
		return
	}
	_ = y[(f-1)*ys+n-1]
	_ = x[offs[len(offs)-1]/4+n-1]
	var mp *uint8
	if relu != 0 {
		_ = mask[(f-1)*ms+(n+7)/8-1]
		mp = &mask[0]
	}
	convSmallRowAVX(&y[0], 4*ys, &x[0], &offs[0], len(offs), &wb[0], &bb[0], f, n, relu, mp, ms)
}

// convSmallGrad sums one output plane's weight and bias gradient lanes:
// see convSmallGradGo.
func convSmallGrad(acc, dy []float32, mask []uint8, x []float32, offs []int, outH, outW, rowStride int, tail *[16]float32) {
	if !convSmallAsm {
		convSmallGradGo(acc, dy, mask, x, offs, outH, outW, rowStride, tail)
		return
	}
	_ = acc[(gradChunk+1)*8-1]
	_ = dy[outH*outW-1]
	_ = x[offs[len(offs)-1]/4+(outH-1)*rowStride+outW-1]
	var mp *uint8
	if mask != nil {
		_ = mask[outH*((outW+7)/8)-1]
		mp = &mask[0]
	}
	convSmallGradAVX(&acc[0], &dy[0], mp, &x[0], &offs[0], len(offs), outH, outW, 4*rowStride, &tail[0])
}

// convSmallGradTaps is convSmallGrad for the taps offs, which for kernels
// kw = 3 or 5 wide are whole kernel rows (gradTaps): those run the
// assembly kernels that take the rows' offsets in registers.
func convSmallGradTaps(acc, dy []float32, mask []uint8, x []float32, offs []int, kw, outH, outW, rowStride int, tail *[16]float32) {
	if !convSmallAsm || (kw != 3 && kw != 5) || len(offs)%kw != 0 {
		convSmallGrad(acc, dy, mask, x, offs, outH, outW, rowStride, tail)
		return
	}
	_ = acc[(gradChunk+1)*8-1]
	_ = dy[outH*outW-1]
	_ = x[offs[len(offs)-1]/4+(outH-1)*rowStride+outW-1]
	var mp *uint8
	if mask != nil {
		_ = mask[outH*((outW+7)/8)-1]
		mp = &mask[0]
	}
	var rows [4]int
	n := len(offs) / kw
	for r := range n {
		rows[r] = offs[r*kw]
	}
	if kw == 3 {
		convSmallGrad3AVX(&acc[0], &dy[0], mp, &x[0], &rows[0], n, outH, outW, 4*rowStride, &tail[0])
	} else {
		convSmallGrad5AVX(&acc[0], &dy[0], mp, &x[0], &rows[0], n, outH, outW, 4*rowStride, &tail[0])
	}
}

// convSmallGrad3AVX and convSmallGrad5AVX are convSmallGradAVX for
// kernels 3 and 5 wide: the taps are (row r < nrows, column j) at byte
// offset rows[r] + 4j, nrows ≤ 4 and 2, held in registers; mask as for
// convSmallGradAVX.
//
//go:noescape
func convSmallGrad3AVX(acc, dy *float32, mask *uint8, x *float32, rows *int, nrows, outH, outW, rowStride int, tail *float32)

//go:noescape
func convSmallGrad5AVX(acc, dy *float32, mask *uint8, x *float32, rows *int, nrows, outH, outW, rowStride int, tail *float32)

// convSmallRowAVX is convSmallRowGo on pointers, with ys in bytes: for
// each vector of 8 output positions (the row's last one overlapping the
// one before it when n%8 ≠ 0), 8 filters at a time then one at a time,
// acc = bias + Σ_t w·x(offs[t]) by FMAs, max(0, acc) when relu ≠ 0 (and
// then its gate byte at mask + filter·ms + vector).
//
//go:noescape
func convSmallRowAVX(y *float32, ys int, x *float32, offs *int, k int, wb, bb *float32, f, n, relu int, mask *uint8, ms int)

// convSmallGradAVX is convSmallGradGo on pointers, with rowStride in
// bytes and k = len(offs) ≤ 12; mask may be nil (no ReLU gate); tail
// points to ConvSmall.tail.
//
//go:noescape
func convSmallGradAVX(acc, dy *float32, mask *uint8, x *float32, offs *int, k, outH, outW, rowStride int, tail *float32)
