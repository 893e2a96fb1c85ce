package kernels

import "fmt"

// Depthwise convolution (torch.nn.Conv2d with groups = in_channels =
// out_channels): every channel of the input is convolved with its own
// KH×KW filter, so there is no sum over channels and nothing for a GEMM
// to gain — an im2col would copy KH·KW values to multiply each by one
// weight. These kernels are direct loops instead, one (channel, row,
// kernel tap) at a time: for a kernel row ki and output row oh they
// walk one input row and one output row together, over the range of
// output columns whose input column lies inside the image (validCols),
// so no padding test runs in the inner loop. With stride 1 that inner
// loop is a contiguous multiply-add; a 3-wide kernel row (MobileNet's
// 3×3) takes its three taps in one pass over the row's interior.
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
	oh, ow := g.OutH(), g.OutW()
	hw, ohw, k := g.H*g.W, oh*ow, g.KH*g.KW
	cols := g.colRanges()
	for p := range batch * g.C {
		xp, yp := x[p*hw:(p+1)*hw], dst[p*ohw:(p+1)*ohw]
		wc := w[(p%g.C)*k : (p%g.C+1)*k]
		clear(yp)
		for ki := range g.KH {
			lo, hi := g.validRows(ki, oh)
			for i := lo; i < hi; i++ {
				ih := i*g.StrideH - g.PadH + ki
				xr, yr := xp[ih*g.W:(ih+1)*g.W], yp[i*ow:(i+1)*ow]
				dwRow(yr, xr, wc[ki*g.KW:(ki+1)*g.KW], g, &cols)
			}
		}
	}
}

// dwRow adds Σ_kj wr[kj]·xr[j·s − pad + kj] into yr[j] for every output
// column j whose tap lies inside the row.
func dwRow(yr, xr, wr []float32, g ConvGeom, cols *colRanges) {
	ow := len(yr)
	if g.StrideW == 1 && g.KW == 3 {
		// the interior, where all three taps are inside: j − pad ≥ 0 and
		// j − pad + 2 < W
		a, b := max(0, g.PadW), min(ow, g.W-2+g.PadW)
		if a < b {
			w0, w1, w2 := wr[0], wr[1], wr[2]
			x0 := xr[a-g.PadW : b-g.PadW]
			x1 := xr[a-g.PadW+1 : b-g.PadW+1]
			x2 := xr[a-g.PadW+2 : b-g.PadW+2]
			y := yr[a:b]
			x0, x1, x2 = x0[:len(y)], x1[:len(y)], x2[:len(y)]
			for j := range y {
				y[j] += w0*x0[j] + w1*x1[j] + w2*x2[j]
			}
			// the edges, tap by tap
			for kj := range 3 {
				lo, hi := cols.get(g, kj, ow)
				off := kj - g.PadW
				for j := lo; j < min(hi, a); j++ {
					yr[j] += wr[kj] * xr[j+off]
				}
				for j := max(lo, b); j < hi; j++ {
					yr[j] += wr[kj] * xr[j+off]
				}
			}
			return
		}
	}
	for kj, wv := range wr {
		lo, hi := cols.get(g, kj, ow)
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

// DepthwiseInputGrad sets dx = the gradient of Depthwise's output with
// respect to x for output gradient dy: every dy[j] goes back, times the
// weight, to each input value its window read.
func DepthwiseInputGrad(dx, dy, w []float32, g ConvGeom, batch int) {
	checkDepthwise("DepthwiseInputGrad", g, batch, len(dx), len(dy), len(w))
	oh, ow := g.OutH(), g.OutW()
	hw, ohw, k := g.H*g.W, oh*ow, g.KH*g.KW
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
	oh, ow := g.OutH(), g.OutW()
	hw, ohw, k := g.H*g.W, oh*ow, g.KH*g.KW
	cols := g.colRanges()
	for c := range g.C {
		dwc := dw[c*k : (c+1)*k]
		for ki := range g.KH {
			lo, hi := g.validRows(ki, oh)
			for kj := range g.KW {
				jlo, jhi := cols.get(g, kj, ow)
				if lo >= hi || jlo >= jhi {
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
