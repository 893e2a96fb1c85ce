package kernels

import "fmt"

// ConvGeom describes a 2-D convolution window over one (C,H,W) image:
// kernel KH×KW, strides and zero padding per side. Strides must be ≥ 1 and
// padding ≥ 0.
type ConvGeom struct {
	C, H, W          int // input channels, height, width
	KH, KW           int // kernel height, width
	StrideH, StrideW int
	PadH, PadW       int
}

// OutH is the output height: (H + 2·PadH − KH)/StrideH + 1.
func (g ConvGeom) OutH() int { return (g.H+2*g.PadH-g.KH)/g.StrideH + 1 }

// OutW is the output width: (W + 2·PadW − KW)/StrideW + 1.
func (g ConvGeom) OutW() int { return (g.W+2*g.PadW-g.KW)/g.StrideW + 1 }

// ColRows is the number of rows of the column matrix: C·KH·KW.
func (g ConvGeom) ColRows() int { return g.C * g.KH * g.KW }

// ColCols is the number of columns of the column matrix: OutH·OutW.
func (g ConvGeom) ColCols() int { return g.OutH() * g.OutW() }

func (g ConvGeom) check(op string) {
	if g.C < 1 || g.H < 1 || g.W < 1 || g.KH < 1 || g.KW < 1 || g.StrideH < 1 || g.StrideW < 1 || g.PadH < 0 || g.PadW < 0 {
		panic(fmt.Sprintf("kernels: %s: invalid geometry %+v", op, g))
	}
	if g.H+2*g.PadH < g.KH || g.W+2*g.PadW < g.KW {
		panic(fmt.Sprintf("kernels: %s: kernel %d×%d larger than padded input in %+v", op, g.KH, g.KW, g))
	}
}

// Im2col writes the column matrix of one image: src is (C,H,W) row-major
// and dst is (C·KH·KW, OutH·OutW) row-major, where row (c,ki,kj) holds
// src[c, oh·StrideH − PadH + ki, ow·StrideW − PadW + kj] for every output
// position (oh,ow), and 0 where that falls in the padding. A convolution is
// then weight (F, C·KH·KW) · dst. Every element of dst is written.
func Im2col(dst, src []float32, g ConvGeom) {
	g.check("Im2col")
	outH, outW := g.OutH(), g.OutW()
	if len(dst) != g.ColRows()*outH*outW {
		panic(fmt.Sprintf("kernels: Im2col: len(dst)=%d, want %d×%d", len(dst), g.ColRows(), outH*outW))
	}
	im2col(dst, outH*outW, src, g)
}

// Im2colStrided is Im2col with the column matrix's rows ld ≥ OutH·OutW
// values apart in dst (a batch's matrices side by side: sample n's at
// dst[n·OutH·OutW:], ld = batch·OutH·OutW); the values between rows are
// left alone.
func Im2colStrided(dst []float32, ld int, src []float32, g ConvGeom) {
	g.check("Im2colStrided")
	p := g.OutH() * g.OutW()
	if ld < p || len(dst) < (g.ColRows()-1)*ld+p {
		panic(fmt.Sprintf("kernels: Im2colStrided: len(dst)=%d, ld=%d for %d rows of %d", len(dst), ld, g.ColRows(), p))
	}
	im2col(dst, ld, src, g)
}

func im2col(dst []float32, ld int, src []float32, g ConvGeom) {
	outH, outW := g.OutH(), g.OutW()
	if len(src) != g.C*g.H*g.W {
		panic(fmt.Sprintf("kernels: Im2col: len(src)=%d, want C·H·W=%d", len(src), g.C*g.H*g.W))
	}
	cols := g.colRanges()
	block := outH * outW // one (c,ki,kj) row of the column matrix
	d := 0
	for c := range g.C {
		img := src[c*g.H*g.W : (c+1)*g.H*g.W]
		for ki := range g.KH {
			ohLo, ohHi := g.validRows(ki, outH)
			for kj := range g.KW {
				lo, hi := cols.get(g, kj, outW)
				blk := dst[d : d+block]
				d += ld
				if ohLo >= ohHi || lo >= hi {
					clear(blk)
					continue
				}
				clear(blk[:ohLo*outW])
				clear(blk[ohHi*outW:])
				n := hi - lo
				for oh := ohLo; oh < ohHi; oh++ {
					row := blk[oh*outW : (oh+1)*outW]
					for i := range row[:lo] {
						row[i] = 0
					}
					for i := hi; i < len(row); i++ {
						row[i] = 0
					}
					ih := oh*g.StrideH - g.PadH + ki
					iw := ih*g.W + lo*g.StrideW - g.PadW + kj
					if g.StrideW == 1 {
						copy(row[lo:hi], img[iw:iw+n])
						continue
					}
					for ow := lo; ow < hi; ow++ {
						row[ow] = img[iw]
						iw += g.StrideW
					}
				}
			}
		}
	}
}

// colRanges caches validCols per kernel column for kernels up to 16 wide,
// so the divisions run KW times per call rather than C·KH·KW times.
type colRanges struct {
	n      int // kernel columns cached; 0 if KW is too large
	lo, hi [16]int
}

func (g ConvGeom) colRanges() (r colRanges) {
	if g.KW > len(r.lo) {
		return r
	}
	outW := g.OutW()
	r.n = g.KW
	for kj := range g.KW {
		r.lo[kj], r.hi[kj] = g.validCols(kj, outW)
	}
	return r
}

func (r *colRanges) get(g ConvGeom, kj, outW int) (lo, hi int) {
	if kj < r.n {
		return r.lo[kj], r.hi[kj]
	}
	return g.validCols(kj, outW)
}

// validRows is validCols for the rows: the output rows oh in [lo, hi)
// whose input row oh·StrideH − PadH + ki lies inside the image.
func (g ConvGeom) validRows(ki, outH int) (lo, hi int) {
	t := ConvGeom{W: g.H, StrideW: g.StrideH, PadW: g.PadH}
	return t.validCols(ki, outH)
}

// validCols returns the range [lo, hi) of output columns ow whose input
// column ow·StrideW − PadW + kj lies inside the image (lo ≥ hi when none).
func (g ConvGeom) validCols(kj, outW int) (lo, hi int) {
	// smallest ow with ow·s ≥ PadW − kj, and smallest ow with ow·s > W−1+PadW−kj
	lo = max(0, ceilDiv(g.PadW-kj, g.StrideW))
	hi = min(outW, max(0, (g.W-1+g.PadW-kj)/g.StrideW+1))
	if g.W-1+g.PadW-kj < 0 {
		hi = 0
	}
	return lo, hi
}

// ceilDiv is ⌈a/b⌉ for b > 0 and any sign of a.
func ceilDiv(a, b int) int {
	if a <= 0 {
		return -((-a) / b)
	}
	return (a + b - 1) / b
}

// Col2im is the adjoint of Im2col: it adds every element of the column
// matrix src (C·KH·KW, OutH·OutW) into the image position it was read from
// in dst (C,H,W); entries that came from padding are dropped. It
// accumulates, so clear dst first to get the plain input gradient.
func Col2im(dst, src []float32, g ConvGeom) {
	g.check("Col2im")
	outH, outW := g.OutH(), g.OutW()
	if len(dst) != g.C*g.H*g.W {
		panic(fmt.Sprintf("kernels: Col2im: len(dst)=%d, want C·H·W=%d", len(dst), g.C*g.H*g.W))
	}
	if len(src) != g.ColRows()*outH*outW {
		panic(fmt.Sprintf("kernels: Col2im: len(src)=%d, want %d×%d", len(src), g.ColRows(), outH*outW))
	}
	cols := g.colRanges()
	block := outH * outW
	s := 0
	for c := range g.C {
		img := dst[c*g.H*g.W : (c+1)*g.H*g.W]
		for ki := range g.KH {
			ohLo, ohHi := g.validRows(ki, outH)
			for kj := range g.KW {
				lo, hi := cols.get(g, kj, outW)
				blk := src[s : s+block]
				s += block
				if ohLo >= ohHi || lo >= hi {
					continue
				}
				n := hi - lo
				for oh := ohLo; oh < ohHi; oh++ {
					row := blk[oh*outW+lo : oh*outW+hi]
					ih := oh*g.StrideH - g.PadH + ki
					iw := ih*g.W + lo*g.StrideW - g.PadW + kj
					if g.StrideW == 1 {
						addTo(img[iw:iw+n], row)
						continue
					}
					for _, v := range row {
						img[iw] += v
						iw += g.StrideW
					}
				}
			}
		}
	}
}

// addTo sets dst[i] += src[i] for i < len(dst), four at a time.
func addTo(dst, src []float32) {
	src = src[:len(dst)]
	i := 0
	for ; i+4 <= len(dst); i += 4 {
		d, s := dst[i:i+4:i+4], src[i:i+4:i+4]
		d[0] += s[0]
		d[1] += s[1]
		d[2] += s[2]
		d[3] += s[3]
	}
	for ; i < len(dst); i++ {
		dst[i] += src[i]
	}
}
