package kernels

import (
	"fmt"
	"math"
)

// Direct convolution for few input channels (the first layer of an image
// network: C·KH·KW of 9 to 75). im2col + GEMM spends most of its time
// there on the column matrix and on GEMM calls with K = C·KH·KW that are
// too thin to amortise OpenBLAS's packing; here each output vector of 8
// positions is C·KH·KW fused multiply-adds of shifted input vectors with
// broadcast weights, written once with the bias (and ReLU) applied, and
// the weight gradient reads dy once, summing dy·x for every tap in
// registers. With a fused ReLU, Forward keeps one bit per output (set
// where the output is > 0) for Grad's gate, so Grad does not read y.
//
// Only stride 1 (after zero padding into a scratch image) and output rows
// of at least 8 values are handled: a row's last vector of 8 overlaps the
// one before it instead of running past the row.

// smallConvMaxK is the largest C·KH·KW of SmallConvOK.
const smallConvMaxK = 75

// SmallConvOK reports whether ConvSmallForward and ConvSmallGrad handle
// g (and are fast: they need AVX2 and FMA; without them the caller should
// use im2col).
func SmallConvOK(g ConvGeom) bool {
	return convSmallSIMD && g.StrideH == 1 && g.StrideW == 1 && g.ColRows() <= smallConvMaxK &&
		g.OutW() >= 8 && g.OutH() >= 1 && g.H+2*g.PadH >= g.KH && g.W+2*g.PadW >= g.KW && g.C >= 1
}

// ConvSmall is the scratch of the direct small-channel convolution of one
// geometry and output count: weights broadcast to 8 lanes, tap offsets,
// a padded image and the weight-gradient accumulators. The zero value is
// ready to use; it is not safe for concurrent use.
type ConvSmall struct {
	wb   []float32 // weights, 8 lanes each: groups of 8 filters as [K][8 filters][8], then single filters as [K][8]
	bb   []float32 // bias per filter, 8 lanes
	offs []int     // byte offset of each tap (c, ki, kj) in the padded image
	pad  []float32 // one zero-padded sample (C, H+2·PadH, W+2·PadW)
	acc  []float32 // weight-gradient lanes: per filter and chunk of 12 taps, 12 tap vectors + 1 bias vector
	mask []uint8   // ReLU gate of the last Forward with relu: per sample, filter, output row and vector of 8, bit l for lane l
	// tail[0:8]: the lane mask of a row's last, overlapping vector in
	// Grad; tail[8:16]: the int32 bit values 1, 2, …, 128 (the lanes of
	// a mask byte)
	tail [16]float32
}

// gradChunk is the number of taps ConvSmallGrad sums per pass over dy.
const gradChunk = 12

func (s *ConvSmall) setup(g ConvGeom, f int) {
	k := g.ColRows()
	wp, hp := g.W+2*g.PadW, g.H+2*g.PadH
	if len(s.offs) != k {
		s.offs = make([]int, k)
	}
	t := 0
	for c := range g.C {
		for ki := range g.KH {
			for kj := range g.KW {
				s.offs[t] = 4 * (c*hp*wp + ki*wp + kj)
				t++
			}
		}
	}
	if g.PadH > 0 || g.PadW > 0 {
		s.pad = growF(s.pad, g.C*hp*wp)
		clear(s.pad)
	}
}

func growF(buf []float32, n int) []float32 {
	if cap(buf) < n {
		return make([]float32, n)
	}
	return buf[:n]
}

// padded returns sample x (C, H, W) as the kernels read it: x itself
// without padding, else copied into the zero border of s.pad (whose
// border stays zero between calls).
func (s *ConvSmall) padded(x []float32, g ConvGeom) []float32 {
	if g.PadH == 0 && g.PadW == 0 {
		return x
	}
	wp, hp := g.W+2*g.PadW, g.H+2*g.PadH
	for c := range g.C {
		for i := range g.H {
			copy(s.pad[c*hp*wp+(i+g.PadH)*wp+g.PadW:], x[(c*g.H+i)*g.W:(c*g.H+i+1)*g.W])
		}
	}
	return s.pad
}

func (s *ConvSmall) check(op string, g ConvGeom, f, batch int, x []float32) {
	if !(g.StrideH == 1 && g.StrideW == 1 && g.ColRows() <= smallConvMaxK && g.OutW() >= 8) {
		panic(fmt.Sprintf("kernels: %s: geometry %+v not handled", op, g))
	}
	g.check(op)
	if f < 1 || batch < 1 || len(x) != batch*g.C*g.H*g.W {
		panic(fmt.Sprintf("kernels: %s: len(x)=%d, want batch %d × %d×%d×%d", op, len(x), batch, g.C, g.H, g.W))
	}
}

// Forward sets y (batch, f, OutH, OutW) to the convolution of x (batch,
// C, H, W) with w (f, C, KH, KW) plus b (f values, or nil for none), and
// to max(0, ·) of that when relu is set (and then keeps the ReLU gate for
// Grad). g must satisfy the geometry conditions of SmallConvOK.
func (s *ConvSmall) Forward(y, x, w, b []float32, g ConvGeom, f, batch int, relu bool) {
	s.check("ConvSmall.Forward", g, f, batch, x)
	k, p := g.ColRows(), g.ColCols()
	if len(w) != f*k || (b != nil && len(b) != f) || len(y) != batch*f*p {
		panic(fmt.Sprintf("kernels: ConvSmall.Forward: len(w)=%d len(b)=%d len(y)=%d for %d filters of %+v, batch %d",
			len(w), len(b), len(y), f, g, batch))
	}
	s.setup(g, f)
	// broadcast weights: groups of 8 filters as [K][8][8], the rest as [K][8]
	s.wb = growF(s.wb, f*k*8)
	i := 0
	f8 := f &^ 7
	for f0 := 0; f0 < f8; f0 += 8 {
		for t := range k {
			for j := range 8 {
				fill8(s.wb[i:i+8], w[(f0+j)*k+t])
				i += 8
			}
		}
	}
	for fi := f8; fi < f; fi++ {
		for t := range k {
			fill8(s.wb[i:i+8], w[fi*k+t])
			i += 8
		}
	}
	s.bb = growF(s.bb, f*8)
	for fi := range f {
		var v float32
		if b != nil {
			v = b[fi]
		}
		fill8(s.bb[fi*8:fi*8+8], v)
	}
	in := g.C * g.H * g.W
	outH, outW := g.OutH(), g.OutW()
	wp := g.W + 2*g.PadW
	r := 0
	if relu {
		r = 1
	}
	v := (outW + 7) / 8
	var mask []uint8
	if relu {
		if cap(s.mask) < batch*f*outH*v {
			s.mask = make([]uint8, batch*f*outH*v)
		}
		s.mask = s.mask[:batch*f*outH*v]
	} else {
		s.mask = s.mask[:0]
	}
	for n := range batch {
		xp := s.padded(x[n*in:(n+1)*in], g)
		yn := y[n*f*p : (n+1)*f*p]
		for oh := range outH {
			if relu {
				mask = s.mask[(n*f*outH+oh)*v:]
			}
			convSmallRow(yn[oh*outW:], p, xp[oh*wp:], s.offs, s.wb, s.bb, f, outW, r, mask, outH*v)
		}
	}
}

func fill8(dst []float32, v float32) {
	dst = dst[:8]
	for i := range dst {
		dst[i] = v
	}
}

// Grad adds to dw (f, C, KH, KW) the weight gradient Σ dy·x and to db (f
// values, or nil) Σ dy, over the batch, for the convolution of x whose
// output gradient is dy (batch, f, OutH, OutW). With relu set, dy counts
// only where the output y of the last Forward (which must have had relu
// set, on this x) was > 0 as an int32 (positive, +Inf or a positive NaN),
// as the fused ReLU's gradient.
func (s *ConvSmall) Grad(dw, db, dy, x []float32, g ConvGeom, f, batch int, relu bool) {
	s.check("ConvSmall.Grad", g, f, batch, x)
	k, p := g.ColRows(), g.ColCols()
	outH, outW := g.OutH(), g.OutW()
	v := (outW + 7) / 8
	if len(dw) != f*k || (db != nil && len(db) != f) || len(dy) != batch*f*p || (relu && len(s.mask) != batch*f*outH*v) {
		panic(fmt.Sprintf("kernels: ConvSmall.Grad: len(dw)=%d len(db)=%d len(dy)=%d (ReLU gate %v, %d bytes) for %d filters of %+v, batch %d",
			len(dw), len(db), len(dy), relu, len(s.mask), f, g, batch))
	}
	s.setup(g, f)
	T := gradTaps(g.KW)
	chunks := (k + T - 1) / T
	per := chunks * (gradChunk + 1) * 8
	s.acc = growF(s.acc, f*per)
	clear(s.acc)
	rem := outW % 8
	for i := range 8 {
		s.tail[i] = 0
		if rem == 0 || i >= 8-rem {
			s.tail[i] = allOnes
		}
		s.tail[8+i] = math.Float32frombits(1 << i)
	}
	in := g.C * g.H * g.W
	wp := g.W + 2*g.PadW
	for n := range batch {
		xp := s.padded(x[n*in:(n+1)*in], g)
		for fi := range f {
			o := (n*f + fi) * p
			var mp []uint8
			if relu {
				mp = s.mask[(n*f+fi)*outH*v : (n*f+fi+1)*outH*v]
			}
			for c := range chunks {
				t0 := c * T
				convSmallGradTaps(s.acc[fi*per+c*(gradChunk+1)*8:], dy[o:o+p], mp, xp, s.offs[t0:min(k, t0+T)],
					g.KW, outH, outW, wp, &s.tail)
			}
		}
	}
	for fi := range f {
		a := s.acc[fi*per:]
		for t := range k {
			c, j := t/T, t%T
			dw[fi*k+t] += sum8(a[(c*(gradChunk+1)+j)*8:])
		}
		if db != nil {
			db[fi] += sum8(a[gradChunk*8:])
		}
	}
}

// gradTaps is the number of taps Grad sums per pass over dy for kernels
// kw wide: whole kernel rows for the assembly kernels of 3- and 5-wide
// kernels (4 and 2 rows), else gradChunk.
func gradTaps(kw int) int {
	switch kw {
	case 3:
		return 12
	case 5:
		return 10
	}
	return gradChunk
}

// sum8 returns the sum of v[0:8] pairwise.
func sum8(v []float32) float32 {
	v = v[:8]
	return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]))
}

// allOnes is the float32 whose bits are all set (a NaN), the lane mask
// for "keep".
var allOnes = math.Float32frombits(0xffffffff)

// convSmallRowGo is convSmallRow in Go: output row y (filter stride ys
// values) from the taps at x[offs[t]/4 + ow] (x starts at the input row),
// weights wb and biases bb laid out as ConvSmall.Forward does, for the f
// filters and ow < n. With relu set it also writes, for filter fi,
// mask[fi·ms + j] = the ReLU gate bits of vector j of the row (the one at
// min(8j, n−8)): bit l set when that output is > 0 as an int32.
func convSmallRowGo(y []float32, ys int, x []float32, offs []int, wb, bb []float32, f, n, relu int, mask []uint8, ms int) {
	k := len(offs)
	f8 := f &^ 7
	for fi := range f {
		var wbase, wstep int
		if fi < f8 {
			wbase, wstep = (fi/8)*k*64+(fi%8)*8, 64
		} else {
			wbase, wstep = f8*k*8+(fi-f8)*k*8, 8
		}
		row := y[fi*ys : fi*ys+n]
		for ow := range row {
			acc := bb[fi*8]
			for t, off := range offs {
				acc = float32(math.FMA(float64(wb[wbase+t*wstep]), float64(x[off/4+ow]), float64(acc)))
			}
			if relu != 0 {
				acc = max(acc, 0)
			}
			row[ow] = acc
		}
		if relu != 0 {
			for j := range (n + 7) / 8 {
				pos := min(8*j, n-8)
				var m uint8
				for l := range 8 {
					if int32(math.Float32bits(row[pos+l])) > 0 {
						m |= 1 << l
					}
				}
				mask[fi*ms+j] = m
			}
		}
	}
}

// convSmallGradGo is convSmallGrad in Go: x is the padded image, whose
// rows are rowStride values apart; it adds into acc[t·8 + lane]
// (t < len(offs)) the products dy·x of tap t and into acc[12·8 + lane]
// dy itself, for the plane dy (OutH, OutW) gated by the bits of mask
// (as Forward writes them for the plane) when mask is non-nil, lane =
// ow%8 for full vectors of 8 and the lane of the row's last, overlapping
// vector for the rest.
func convSmallGradGo(acc, dy []float32, mask []uint8, x []float32, offs []int, outH, outW, rowStride int, tail *[16]float32) {
	v := (outW + 7) / 8
	for oh := range outH {
		for ow := range outW {
			d := dy[oh*outW+ow]
			lane, j := ow%8, ow/8
			if ow >= outW&^7 {
				lane, j = ow-(outW-8), v-1
			}
			if mask != nil && mask[oh*v+j]>>lane&1 == 0 {
				d = 0
			}
			acc[gradChunk*8+lane] += d
			for t, off := range offs {
				acc[t*8+lane] = float32(math.FMA(float64(d), float64(x[oh*rowStride+off/4+ow]), float64(acc[t*8+lane])))
			}
		}
	}
}
