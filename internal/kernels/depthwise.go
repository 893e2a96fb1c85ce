package kernels

import "fmt"

// Depthwise convolution (torch.nn.Conv2d with groups = in_channels =
// out_channels): every channel of the input is convolved with its own
// KH×KW filter, so there is no sum over channels and nothing for a GEMM
// to gain — an im2col would copy KH·KW values to multiply each by one
// weight. These kernels are direct loops instead, one channel plane at a
// time: for a kernel row ki and output row oh they walk one input row and
// one output row together, over the range of output columns whose input
// column lies inside the image (validCols), so no padding test runs in
// the inner loop. 3×3 stride-1 kernels (MobileNet's) take all nine taps
// in one pass over the interior of each output row (one store per
// output); with stride 1 the input gradient is the forward convolution
// of dy with the flipped kernel and padding K−1−pad, so it takes the same
// path, and the filter gradient sums a kernel row's three taps in one
// pass.
//
// x is (batch, C, H, W), y and dy are (batch, C, OutH, OutW), w and dw are
// (C, KH, KW) (PyTorch's (C, 1, KH, KW)), all row-major.

func checkDepthwise(op string, g ConvGeom, batch, nx, ny, nw int) {
	g.check(op)
	if batch < 1 || nx != batch*g.C*g.H*g.W || ny != batch*g.C*g.OutH()*g.OutW() || nw != g.C*g.KH*g.KW {
		panic(fmt.Sprintf("kernels: %s: batch %d, len(x)=%d len(y)=%d len(w)=%d do not fit %+v", op, batch, nx, ny, nw, g))
	}
}

// Depthwise sets dst = the depthwise convolution of x with w (no bias).
func Depthwise(dst, x, w []float32, g ConvGeom, batch int) {
	checkDepthwise("Depthwise", g, batch, len(x), len(dst), len(w))
	if depthwiseFast(dst, x, w, g, batch) {
		return
	}
	hw, ohw, k := g.H*g.W, g.OutH()*g.OutW(), g.KH*g.KW
	cols := g.colRanges()
	for p := range batch * g.C {
		c := p % g.C
		dwPlane(dst[p*ohw:(p+1)*ohw], x[p*hw:(p+1)*hw], w[c*k:(c+1)*k], g, &cols)
	}
}

// dwPlane sets yp to one channel plane's convolution of xp with wc.
func dwPlane(yp, xp, wc []float32, g ConvGeom, cols *colRanges) {
	oh, ow := g.OutH(), g.OutW()
	clear(yp)
	// interior rows and columns, where all nine taps of a 3×3 stride-1
	// kernel are inside: i − pad ≥ 0 and i − pad + 2 < H
	rlo, rhi := max(0, g.PadH), min(oh, g.H-2+g.PadH)
	a, b := max(0, g.PadW), min(ow, g.W-2+g.PadW)
	fast := g.KH == 3 && g.KW == 3 && g.StrideH == 1 && g.StrideW == 1 && rlo < rhi && a < b
	for i := range oh {
		yr := yp[i*ow : (i+1)*ow]
		if fast && i >= rlo && i < rhi {
			r := (i - g.PadH) * g.W
			dw3Row(yr[a:b], xp[r:r+g.W], xp[r+g.W:r+2*g.W], xp[r+2*g.W:r+3*g.W], wc, a-g.PadW)
			for ki := range 3 {
				xr := xp[r+ki*g.W : r+(ki+1)*g.W]
				dwEdges(yr, xr, wc[3*ki:3*ki+3], g, cols, a, b)
			}
			continue
		}
		for ki := range g.KH {
			ih := i*g.StrideH - g.PadH + ki
			if ih < 0 || ih >= g.H {
				continue
			}
			dwRow(yr, xp[ih*g.W:(ih+1)*g.W], wc[ki*g.KW:(ki+1)*g.KW], g, cols)
		}
	}
}

// dw3Row sets y[j] = Σ_ki,kj w[3ki+kj]·x_ki[off+j+kj] for the three input
// rows x0, x1, x2 of an output row's interior.
func dw3Row(y, x0, x1, x2, w []float32, off int) {
	w = w[:9]
	w0, w1, w2, w3, w4, w5, w6, w7, w8 := w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8]
	n := len(y)
	// nine shifted views of length n, so that the loop has no bounds checks
	a0, a1, a2 := x0[off:off+n], x0[off+1:off+1+n], x0[off+2:off+2+n]
	b0, b1, b2 := x1[off:off+n], x1[off+1:off+1+n], x1[off+2:off+2+n]
	c0, c1, c2 := x2[off:off+n], x2[off+1:off+1+n], x2[off+2:off+2+n]
	for j := range y {
		y[j] = w0*a0[j] + w1*a1[j] + w2*a2[j] +
			w3*b0[j] + w4*b1[j] + w5*b2[j] +
			w6*c0[j] + w7*c1[j] + w8*c2[j]
	}
}

// dwEdges adds a kernel row's taps into the output columns outside the
// interior [a, b).
func dwEdges(yr, xr, wr []float32, g ConvGeom, cols *colRanges, a, b int) {
	for kj, wv := range wr {
		lo, hi := cols.get(g, kj, len(yr))
		off := kj - g.PadW
		for j := lo; j < min(hi, a); j++ {
			yr[j] += wv * xr[j+off]
		}
		for j := max(lo, b); j < hi; j++ {
			yr[j] += wv * xr[j+off]
		}
	}
}

// dwRow adds Σ_kj wr[kj]·xr[j·s − pad + kj] into yr[j] for every output
// column j whose tap lies inside the row.
func dwRow(yr, xr, wr []float32, g ConvGeom, cols *colRanges) {
	for kj, wv := range wr {
		lo, hi := cols.get(g, kj, len(yr))
		if lo >= hi {
			continue
		}
		off := kj - g.PadW
		if g.StrideW == 1 {
			axpyTo(yr[lo:hi], wv, xr[lo+off:hi+off])
			continue
		}
		iw := lo*g.StrideW + off
		for j := lo; j < hi; j++ {
			yr[j] += wv * xr[iw]
			iw += g.StrideW
		}
	}
}

// maxFlip is the largest kernel (KH·KW) whose flipped copy DepthwiseInputGrad
// keeps on the stack.
const maxFlip = 49

// DepthwiseInputGrad sets dx = the gradient of Depthwise's output with
// respect to x for output gradient dy: every dy[j] goes back, times the
// weight, to each input value its window read.
func DepthwiseInputGrad(dx, dy, w []float32, g ConvGeom, batch int) {
	checkDepthwise("DepthwiseInputGrad", g, batch, len(dx), len(dy), len(w))
	if depthwiseInputGradFast(dx, dy, w, g, batch) {
		return
	}
	oh, ow := g.OutH(), g.OutW()
	hw, ohw, k := g.H*g.W, oh*ow, g.KH*g.KW
	if g.StrideH == 1 && g.StrideW == 1 && g.PadH < g.KH && g.PadW < g.KW && k <= maxFlip {
		// a stride-1 correlation's adjoint is the correlation of dy with
		// the flipped kernel over dy padded by K−1−pad
		t := ConvGeom{C: g.C, H: oh, W: ow, KH: g.KH, KW: g.KW, StrideH: 1, StrideW: 1, PadH: g.KH - 1 - g.PadH, PadW: g.KW - 1 - g.PadW}
		cols := t.colRanges()
		var flip [maxFlip]float32
		for p := range batch * g.C {
			wc := w[(p%g.C)*k : (p%g.C+1)*k]
			for i, v := range wc {
				flip[k-1-i] = v
			}
			dwPlane(dx[p*hw:(p+1)*hw], dy[p*ohw:(p+1)*ohw], flip[:k], t, &cols)
		}
		return
	}
	cols := g.colRanges()
	for p := range batch * g.C {
		dxp, dyp := dx[p*hw:(p+1)*hw], dy[p*ohw:(p+1)*ohw]
		wc := w[(p%g.C)*k : (p%g.C+1)*k]
		clear(dxp)
		for ki := range g.KH {
			lo, hi := g.validRows(ki, oh)
			for i := lo; i < hi; i++ {
				ih := i*g.StrideH - g.PadH + ki
				dxr, dyr := dxp[ih*g.W:(ih+1)*g.W], dyp[i*ow:(i+1)*ow]
				for kj, wv := range wc[ki*g.KW : (ki+1)*g.KW] {
					lo, hi := cols.get(g, kj, ow)
					if lo >= hi {
						continue
					}
					off := kj - g.PadW
					if g.StrideW == 1 {
						axpyTo(dxr[lo+off:hi+off], wv, dyr[lo:hi])
						continue
					}
					iw := lo*g.StrideW + off
					for j := lo; j < hi; j++ {
						dxr[iw] += wv * dyr[j]
						iw += g.StrideW
					}
				}
			}
		}
	}
}

// DepthwiseFilterGrad adds into dw the gradient of Depthwise's output
// with respect to w for output gradient dy: dw[c, ki, kj] += Σ over the
// batch and output positions of dy·(the input value that tap read).
func DepthwiseFilterGrad(dw, dy, x []float32, g ConvGeom, batch int) {
	checkDepthwise("DepthwiseFilterGrad", g, batch, len(x), len(dy), len(dw))
	if depthwiseFilterGradFast(dw, dy, x, g, batch) {
		return
	}
	oh, ow := g.OutH(), g.OutW()
	hw, ohw, k := g.H*g.W, oh*ow, g.KH*g.KW
	cols := g.colRanges()
	// the interior columns of a 3-wide stride-1 kernel row
	a, b := max(0, g.PadW), min(ow, g.W-2+g.PadW)
	fast := g.KW == 3 && g.StrideW == 1 && a < b
	for c := range g.C {
		dwc := dw[c*k : (c+1)*k]
		for ki := range g.KH {
			lo, hi := g.validRows(ki, oh)
			if lo >= hi {
				continue
			}
			if fast {
				dwc0 := dwc[ki*3 : ki*3+3]
				s := dw3Grad(dy, x, g, c, batch, ki, lo, hi, a, b, &cols)
				dwc0[0] += s[0]
				dwc0[1] += s[1]
				dwc0[2] += s[2]
				continue
			}
			for kj := range g.KW {
				jlo, jhi := cols.get(g, kj, ow)
				if jlo >= jhi {
					continue
				}
				off := kj - g.PadW
				var s float32
				for n := range batch {
					p := n*g.C + c
					xp, dyp := x[p*hw:(p+1)*hw], dy[p*ohw:(p+1)*ohw]
					for i := lo; i < hi; i++ {
						ih := i*g.StrideH - g.PadH + ki
						xr, dyr := xp[ih*g.W:(ih+1)*g.W], dyp[i*ow:(i+1)*ow]
						if g.StrideW == 1 {
							s += dotTo(dyr[jlo:jhi], xr[jlo+off:jhi+off])
							continue
						}
						iw := jlo*g.StrideW + off
						for j := jlo; j < jhi; j++ {
							s += dyr[j] * xr[iw]
							iw += g.StrideW
						}
					}
				}
				dwc[ki*g.KW+kj] += s
			}
		}
	}
}

// dw3Grad is DepthwiseFilterGrad's sums for kernel row ki of channel c
// of a 3-wide stride-1 kernel: the three taps in one pass over each
// output row's interior [a, b), the edges tap by tap.
func dw3Grad(dy, x []float32, g ConvGeom, c, batch, ki, lo, hi, a, b int, cols *colRanges) [3]float32 {
	oh, ow := g.OutH(), g.OutW()
	hw, ohw := g.H*g.W, oh*ow
	var s0, s1, s2 float32
	var e [3]float32
	for n := range batch {
		p := n*g.C + c
		xp, dyp := x[p*hw:(p+1)*hw], dy[p*ohw:(p+1)*ohw]
		for i := lo; i < hi; i++ {
			ih := i*g.StrideH - g.PadH + ki
			xr, dyr := xp[ih*g.W:(ih+1)*g.W], dyp[i*ow:(i+1)*ow]
			d := dyr[a:b]
			o := a - g.PadW
			x0, x1, x2 := xr[o:o+len(d)], xr[o+1:o+1+len(d)], xr[o+2:o+2+len(d)]
			for j, v := range d {
				s0 += v * x0[j]
				s1 += v * x1[j]
				s2 += v * x2[j]
			}
			for kj := range 3 {
				jlo, jhi := cols.get(g, kj, ow)
				off := kj - g.PadW
				for j := jlo; j < min(jhi, a); j++ {
					e[kj] += dyr[j] * xr[j+off]
				}
				for j := max(jlo, b); j < jhi; j++ {
					e[kj] += dyr[j] * xr[j+off]
				}
			}
		}
	}
	return [3]float32{s0 + e[0], s1 + e[1], s2 + e[2]}
}

// axpyTo sets y[i] += a·x[i] for i < len(y), four at a time.
func axpyTo(y []float32, a float32, x []float32) {
	x = x[:len(y)]
	i := 0
	for ; i+4 <= len(y); i += 4 {
		d, s := y[i:i+4:i+4], x[i:i+4:i+4]
		d[0] += a * s[0]
		d[1] += a * s[1]
		d[2] += a * s[2]
		d[3] += a * s[3]
	}
	for ; i < len(y); i++ {
		y[i] += a * x[i]
	}
}

// dotTo returns Σ a[i]·b[i] over len(a) in four float32 lanes.
func dotTo(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		x, y := a[i:i+4:i+4], b[i:i+4:i+4]
		s0 += x[0] * y[0]
		s1 += x[1] * y[1]
		s2 += x[2] * y[2]
		s3 += x[3] * y[3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}
