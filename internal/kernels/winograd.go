package kernels

import (
	"fmt"
	"math"
)

// Winograd F(2×2, 3×3) for 3×3 stride-1 convolutions (Lavin & Gray 2015,
// "Fast Algorithms for Convolutional Neural Networks"). The output is cut
// into 2×2 tiles; tile p reads the 4×4 input patch at (2·ty − PadH,
// 2·tx − PadW) and
//
//	y_tile = Aᵀ [ Σ_c (G w_{o,c} Gᵀ) ⊙ (Bᵀ d_{c,p} B) ] A,
//
// so a convolution becomes 16 independent GEMMs, one per point ξ of the
// 4×4 transformed tile: M[ξ] (Out, P) = U[ξ] (Out, C) · V[ξ] (C, P), with
// 2.25× fewer multiplications than im2col + GEMM. The transforms use only
// additions and halvings, so float32 results stay within a few ulps of the
// direct sum.
//
// Layouts: U is (16, Out, C), V is (16, C, P), M is (16, Out, P), all
// row-major; V and M may have a point stride (the distance between the
// matrices of consecutive points) larger than their matrices, see
// WinogradStride. P = batch·TilesH·TilesW is the number of tiles, and
// tile p = (n·TilesH + ty)·TilesW + tx. The backward pass uses the adjoints: dM = A·dy·Aᵀ
// (WinogradOutputGrad), dU[ξ] = dM[ξ]·V[ξ]ᵀ then dw = Gᵀ·dU·G
// (WinogradFilterGrad), dV[ξ] = U[ξ]ᵀ·dM[ξ] then dx += B·dV·Bᵀ
// (WinogradInputGrad).

// WinogradPoints is the number of points (and GEMMs) of F(2×2, 3×3).
const WinogradPoints = 16

// WinogradOK reports whether g is a convolution F(2×2, 3×3) computes: a
// 3×3 kernel with stride 1 (any padding).
func (g ConvGeom) WinogradOK() bool {
	return g.KH == 3 && g.KW == 3 && g.StrideH == 1 && g.StrideW == 1
}

// WinogradTiles is the grid of 2×2 output tiles: ⌈OutH/2⌉ × ⌈OutW/2⌉.
func (g ConvGeom) WinogradTiles() (th, tw int) {
	return (g.OutH() + 1) / 2, (g.OutW() + 1) / 2
}

func (g ConvGeom) checkWinograd(op string) {
	g.check(op)
	if !g.WinogradOK() {
		panic(fmt.Sprintf("kernels: %s: Winograd F(2×2,3×3) needs a 3×3 kernel with stride 1, got %+v", op, g))
	}
}

// WinogradStride is the distance between the point matrices of a (16, n)
// transformed tensor whose matrices hold n values each: n rounded up to a
// cache line, plus one line when that is a multiple of 4 KiB. The
// transforms touch all 16 matrices per tile; 16 streams 4 KiB apart would
// all fall in one L1 set and evict each other (measured 3–5× slower).
func WinogradStride(n int) int {
	s := (n + 15) &^ 15
	if s%1024 == 0 {
		s += 16
	}
	return s
}

// checkPoints panics unless x holds 16 matrices of n values at stride s.
func checkPoints(op, what string, x []float32, s, n int) {
	if s < n || len(x) < 15*s+n {
		panic(fmt.Sprintf("kernels: %s: len(%s)=%d with point stride %d cannot hold 16 matrices of %d values", op, what, len(x), s, n))
	}
}

func checkLen(op, what string, x []float32, want int) {
	if len(x) != want {
		panic(fmt.Sprintf("kernels: %s: len(%s)=%d, want %d", op, what, len(x), want))
	}
}

// WinogradFilter sets u (16, out, C) to G·w·Gᵀ for every (o, c), where w
// is (out, C, 3, 3) in PyTorch's layout.
func WinogradFilter(u, w []float32, out, c int) {
	checkLen("WinogradFilter", "w", w, out*c*9)
	checkLen("WinogradFilter", "u", u, 16*out*c)
	s := out * c
	for i := range s {
		g := w[i*9 : i*9+9 : i*9+9]
		// rows: h = G·g (4×3)
		var h [12]float32
		for j := range 3 {
			g0, g1, g2 := g[j], g[3+j], g[6+j]
			h[j] = g0
			h[3+j] = 0.5 * (g0 + g1 + g2)
			h[6+j] = 0.5 * (g0 - g1 + g2)
			h[9+j] = g2
		}
		// columns: U = h·Gᵀ (4×4)
		for k := range 4 {
			h0, h1, h2 := h[3*k], h[3*k+1], h[3*k+2]
			u[(4*k)*s+i] = h0
			u[(4*k+1)*s+i] = 0.5 * (h0 + h1 + h2)
			u[(4*k+2)*s+i] = 0.5 * (h0 - h1 + h2)
			u[(4*k+3)*s+i] = h2
		}
	}
}

// WinogradFilterGrad adds Gᵀ·du·G into dw (out, C, 3, 3) for every (o, c):
// the adjoint of WinogradFilter, with du (16, out, C).
func WinogradFilterGrad(dw, du []float32, out, c int) {
	checkLen("WinogradFilterGrad", "dw", dw, out*c*9)
	checkLen("WinogradFilterGrad", "du", du, 16*out*c)
	s := out * c
	for i := range s {
		var d [16]float32
		for x := range 16 {
			d[x] = du[x*s+i]
		}
		// rows: e = Gᵀ·d (3×4)
		var e [12]float32
		for l := range 4 {
			d0, d1, d2, d3 := d[l], d[4+l], d[8+l], d[12+l]
			e[l] = d0 + 0.5*(d1+d2)
			e[4+l] = 0.5 * (d1 - d2)
			e[8+l] = 0.5*(d1+d2) + d3
		}
		// columns: dg = e·G (3×3)
		g := dw[i*9 : i*9+9 : i*9+9]
		for k := range 3 {
			e0, e1, e2, e3 := e[4*k], e[4*k+1], e[4*k+2], e[4*k+3]
			g[3*k] += e0 + 0.5*(e1+e2)
			g[3*k+1] += 0.5 * (e1 - e2)
			g[3*k+2] += 0.5*(e1+e2) + e3
		}
	}
}

// WinogradInput sets v (16, C, P) to Bᵀ·d·B for every channel c and tile
// p of the batch x (batch, C, H, W); input outside the image (padding, or
// past the edge for odd output sizes) reads as 0.
func WinogradInput(v []float32, s int, x []float32, g ConvGeom, batch int) {
	g.checkWinograd("WinogradInput")
	th, tw := g.WinogradTiles()
	plane := g.H * g.W
	checkLen("WinogradInput", "x", x, batch*g.C*plane)
	pn := th * tw
	P := batch * pn
	checkPoints("WinogradInput", "v", v, s, g.C*P)
	var t [4][stripMax]float32  // the strip's rows after the row pass
	var rp [4][stripMax]float32 // a strip's rows with the padding made explicit
	vlo, vhi := winoVectorTiles(g)
	wp := 2*tw + 2 // a zero-padded strip's width: every tile's patch lies inside it
	for n := range batch {
		for c := range g.C {
			img := x[(n*g.C+c)*plane : (n*g.C+c+1)*plane]
			for ty := range th {
				iy := 2*ty - g.PadH
				o := c*P + n*pn + ty*tw // tile (ty, 0)
				inside := iy >= 0 && iy+4 <= g.H && g.W <= stripMax
				if (!inside || vlo != 0 || vhi != tw) && wp <= stripMax {
					// Tiles that read padding or past the image: copy the
					// strip's rows into zero-padded rows once, then every tile
					// is an interior one (the same additions on the same
					// values as edgePatch's zeros).
					padStrip(&rp, img, g, iy, wp)
					winoInputStrip(v[o:], s, &rp, &t, tw, wp)
					continue
				}
				if !inside {
					for tx := range tw {
						d := g.edgePatch(img, iy, 2*tx-g.PadW)
						inputTransform(v[o+tx:o+tx+15*s+1], s, &d)
					}
					continue
				}
				r0 := img[iy*g.W : (iy+1)*g.W]
				r1 := img[(iy+1)*g.W : (iy+2)*g.W]
				r2 := img[(iy+2)*g.W : (iy+3)*g.W]
				r3 := img[(iy+3)*g.W : (iy+4)*g.W]
				// Vector kernel: blocks of 8 interior tiles, the last block
				// moved back to end at the last tile it can read (tiles done
				// twice get the same values).
				for tx := vlo; tx < vhi; tx += 8 {
					tx = min(tx, vhi-8)
					ix := 2*tx - g.PadW
					_ = r0[ix+17] // the kernel reads r·[ix : ix+18]
					_ = r3[ix+17]
					_ = v[o+tx+7+15*s]
					winoInput8(&v[o+tx], s, &r0[ix], &r1[ix], &r2[ix], &r3[ix])
				}
				if vlo == 0 && vhi == tw {
					continue
				}
				// Row pass once per column of the 4-row strip (neighbouring
				// tiles share two columns), then the column pass per tile.
				t0, t1, t2, t3 := t[0][:g.W], t[1][:g.W], t[2][:g.W], t[3][:g.W]
				rowPass(t0, t1, t2, t3, r0, r1, r2, r3)
				for tx := range tw {
					if tx >= vlo && tx < vhi {
						continue
					}
					ix := 2*tx - g.PadW
					if ix < 0 || ix+4 > g.W {
						d := g.edgePatch(img, iy, ix)
						inputTransform(v[o+tx:o+tx+15*s+1], s, &d)
						continue
					}
					colPass(v[o+tx:o+tx+15*s+1], s, t0, t1, t2, t3, ix)
				}
			}
		}
	}
}

// padStrip sets rp's rows [0, wp) to the image rows iy … iy+3 of img (one
// plane of g) shifted right by PadW columns, with zeros where a row or
// column falls outside the image.
func padStrip(rp *[4][stripMax]float32, img []float32, g ConvGeom, iy, wp int) {
	for i := range 4 {
		row := rp[i][:wp]
		y := iy + i
		if y < 0 || y >= g.H {
			clear(row)
			continue
		}
		clear(row[:g.PadW])
		copy(row[g.PadW:g.PadW+g.W], img[y*g.W:(y+1)*g.W])
		clear(row[g.PadW+g.W:])
	}
}

// winoInputStrip writes the transforms of the tw tiles of one zero-padded
// strip rp (rows of wp = 2·tw + 2 values; tile tx's patch starts at
// column 2·tx) to v[ξ·s + tx]: with the vector kernel when there are 8
// tiles or more, else by the row pass into t and the column pass per
// tile.
func winoInputStrip(v []float32, s int, rp, t *[4][stripMax]float32, tw, wp int) {
	if winoSIMD && tw >= 8 {
		for tx := 0; tx < tw; tx += 8 {
			tx = min(tx, tw-8)
			_ = v[tx+7+15*s]
			winoInput8(&v[tx], s, &rp[0][2*tx], &rp[1][2*tx], &rp[2][2*tx], &rp[3][2*tx])
		}
		return
	}
	t0, t1, t2, t3 := t[0][:wp], t[1][:wp], t[2][:wp], t[3][:wp]
	rowPass(t0, t1, t2, t3, rp[0][:wp], rp[1][:wp], rp[2][:wp], rp[3][:wp])
	for tx := range tw {
		colPass(v[tx:tx+15*s+1], s, t0, t1, t2, t3, 2*tx)
	}
}

// rowPass sets t0..t3 to Bᵀ applied down the columns of the rows r0..r3:
// r0−r2, r1+r2, r2−r1, r1−r3.
func rowPass(t0, t1, t2, t3, r0, r1, r2, r3 []float32) {
	t0, t1, t2, t3 = t0[:len(r0)], t1[:len(r0)], t2[:len(r0)], t3[:len(r0)]
	r1, r2, r3 = r1[:len(r0)], r2[:len(r0)], r3[:len(r0)]
	for j := range r0 {
		a, b, c, d := r0[j], r1[j], r2[j], r3[j]
		t0[j], t1[j], t2[j], t3[j] = a-c, b+c, c-b, b-d
	}
}

// colPass writes the column pass of the tile whose row-passed patch is
// t·[ix : ix+4] to q[ξ·s], ξ = 0..15.
func colPass(q []float32, s int, t0, t1, t2, t3 []float32, ix int) {
	q = q[:15*s+1]
	a, b, c, d := t0[ix], t0[ix+1], t0[ix+2], t0[ix+3]
	q[0], q[s], q[2*s], q[3*s] = a-c, b+c, c-b, b-d
	a, b, c, d = t1[ix], t1[ix+1], t1[ix+2], t1[ix+3]
	q[4*s], q[5*s], q[6*s], q[7*s] = a-c, b+c, c-b, b-d
	a, b, c, d = t2[ix], t2[ix+1], t2[ix+2], t2[ix+3]
	q[8*s], q[9*s], q[10*s], q[11*s] = a-c, b+c, c-b, b-d
	a, b, c, d = t3[ix], t3[ix+1], t3[ix+2], t3[ix+3]
	q[15*s] = b - d
	q[12*s], q[13*s], q[14*s] = a-c, b+c, c-b
}

// winoVectorTiles returns the tiles [lo, hi) of each row of tiles that
// WinogradInput's vector kernel computes: all of them interior, reading
// 18 input columns from the first, at least 8 of them; lo == hi when
// there is no kernel or too few such tiles.
func winoVectorTiles(g ConvGeom) (lo, hi int) {
	if !winoSIMD || g.W+g.PadW < 18 {
		return 0, 0
	}
	lo = (g.PadW + 1) / 2           // the first tile with ix = 2·tx − PadW ≥ 0
	last := (g.W + g.PadW - 18) / 2 // the last first tile of a block: ix + 18 ≤ W
	if last < lo {
		return 0, 0
	}
	return lo, last + 8
}

// winoMask[8−m:16−m] masks out the first m of 8 tiles for winoInputGrad8.
var winoMask = func() (m [16]float32) {
	for i := 8; i < 16; i++ {
		m[i] = math.Float32frombits(^uint32(0))
	}
	return m
}()

// stripMax is the widest image the strip paths of the input transforms
// handle (their row buffers live on the stack); wider ones go tile by tile.
const stripMax = 256

// edgePatch reads the 4×4 patch at (iy, ix) of one plane with zeros
// outside it.
func (g ConvGeom) edgePatch(img []float32, iy, ix int) (d [16]float32) {
	for i := range 4 {
		if y := iy + i; y >= 0 && y < g.H {
			for j := range 4 {
				if x := ix + j; x >= 0 && x < g.W {
					d[4*i+j] = img[y*g.W+x]
				}
			}
		}
	}
	return d
}

// inputTransform writes Bᵀ·d·B to v[ξ·s] for ξ = 0..15, where
// Bᵀ = [1 0 −1 0; 0 1 1 0; 0 −1 1 0; 0 1 0 −1].
func inputTransform(v []float32, s int, d *[16]float32) {
	// rows
	t00, t01, t02, t03 := d[0]-d[8], d[1]-d[9], d[2]-d[10], d[3]-d[11]
	t10, t11, t12, t13 := d[4]+d[8], d[5]+d[9], d[6]+d[10], d[7]+d[11]
	t20, t21, t22, t23 := d[8]-d[4], d[9]-d[5], d[10]-d[6], d[11]-d[7]
	t30, t31, t32, t33 := d[4]-d[12], d[5]-d[13], d[6]-d[14], d[7]-d[15]
	// columns
	v[15*s] = t31 - t33
	v[0] = t00 - t02
	v[s] = t01 + t02
	v[2*s] = t02 - t01
	v[3*s] = t01 - t03
	v[4*s] = t10 - t12
	v[5*s] = t11 + t12
	v[6*s] = t12 - t11
	v[7*s] = t11 - t13
	v[8*s] = t20 - t22
	v[9*s] = t21 + t22
	v[10*s] = t22 - t21
	v[11*s] = t21 - t23
	v[12*s] = t30 - t32
	v[13*s] = t31 + t32
	v[14*s] = t32 - t31
}

// WinogradInputGrad adds B·dv·Bᵀ of every channel and tile into dx
// (batch, C, H, W): the adjoint of WinogradInput, with dv (16, C, P).
// Contributions that fall outside the image are dropped.
func WinogradInputGrad(dx, dv []float32, s int, g ConvGeom, batch int) {
	g.checkWinograd("WinogradInputGrad")
	th, tw := g.WinogradTiles()
	plane := g.H * g.W
	checkLen("WinogradInputGrad", "dx", dx, batch*g.C*plane)
	pn := th * tw
	P := batch * pn
	checkPoints("WinogradInputGrad", "dv", dv, s, g.C*P)
	var t [4][stripMax]float32 // the strip's gradient before the row pass's adjoint
	lo, hi := winoVectorTiles(g)
	wp := 2*tw + 2 // a zero-padded strip's width, as in WinogradInput
	for n := range batch {
		for c := range g.C {
			img := dx[(n*g.C+c)*plane : (n*g.C+c+1)*plane]
			for ty := range th {
				iy := 2*ty - g.PadH
				o := c*P + n*pn + ty*tw // tile (ty, 0)
				strip := iy >= 0 && iy+4 <= g.H && g.W <= stripMax
				if (!strip || lo != 0 || hi != tw) && wp <= stripMax {
					// Tiles that touch padding: gather the strip's gradient in
					// padded rows (every tile interior), then add the rows'
					// image part. Each position sums its tiles' contributions
					// before it reaches dx, so dx can differ from the per-tile
					// path in the last bits.
					winoInputGradStrip(img, dv[o:], s, &t, g, iy, tw, wp)
					continue
				}
				t0, t1, t2, t3 := t[0][:g.W], t[1][:g.W], t[2][:g.W], t[3][:g.W]
				vlo, vhi := 0, 0
				if strip {
					clear(t0)
					clear(t1)
					clear(t2)
					clear(t3)
					// Vector kernel: blocks of 8 interior tiles; the last block
					// is moved back to end at the last tile it can write, with
					// the tiles already done masked out.
					vlo, vhi = winoVectorTiles(g)
					for tx := vlo; tx < vhi; tx += 8 {
						st := min(tx, vhi-8)
						ix := 2*st - g.PadW
						_ = t0[ix+17] // the kernel updates t·[ix : ix+18]
						_ = t1[ix+17]
						_ = t2[ix+17]
						_ = t3[ix+17]
						_ = dv[o+st+7+15*s]
						winoInputGrad8(&t0[ix], &t1[ix], &t2[ix], &t3[ix], &dv[o+st], s, &winoMask[8-(tx-st)])
						tx = st
					}
				}
				for tx := range tw {
					if tx >= vlo && tx < vhi {
						continue
					}
					ix := 2*tx - g.PadW
					q := dv[o+tx : o+tx+15*s+1]
					if !strip || ix < 0 || ix+4 > g.W {
						d := inputTransformT(q, s)
						g.addEdgePatch(img, iy, ix, &d)
						continue
					}
					colPassT(t0, t1, t2, t3, ix, q, s)
				}
				if !strip {
					continue
				}
				// adjoint of the row pass, once per column
				r0 := img[iy*g.W : (iy+1)*g.W]
				r1 := img[(iy+1)*g.W : (iy+2)*g.W]
				r2 := img[(iy+2)*g.W : (iy+3)*g.W]
				r3 := img[(iy+3)*g.W : (iy+4)*g.W]
				j0 := 0
				if winoSIMD && g.W >= 8 {
					winoRowT(&r0[0], &r1[0], &r2[0], &r3[0], &t0[0], &t1[0], &t2[0], &t3[0], g.W)
					j0 = g.W &^ 7
				}
				for j := j0; j < g.W; j++ {
					a, b, c, d := t0[j], t1[j], t2[j], t3[j]
					r0[j] += a
					r1[j] += b - c + d
					r2[j] += b + c - a
					r3[j] -= d
				}
			}
		}
	}
}

// colPassT adds the adjoint of the column pass of the tile whose dv is
// q[ξ·s] into the strip rows t·[ix : ix+4].
func colPassT(t0, t1, t2, t3 []float32, ix int, q []float32, s int) {
	q = q[:15*s+1]
	v15 := q[15*s]
	a, b, c, d := q[0], q[s], q[2*s], q[3*s]
	t0[ix] += a
	t0[ix+1] += b - c + d
	t0[ix+2] += b + c - a
	t0[ix+3] -= d
	a, b, c, d = q[4*s], q[5*s], q[6*s], q[7*s]
	t1[ix] += a
	t1[ix+1] += b - c + d
	t1[ix+2] += b + c - a
	t1[ix+3] -= d
	a, b, c, d = q[8*s], q[9*s], q[10*s], q[11*s]
	t2[ix] += a
	t2[ix+1] += b - c + d
	t2[ix+2] += b + c - a
	t2[ix+3] -= d
	a, b, c, d = q[12*s], q[13*s], q[14*s], v15
	t3[ix] += a
	t3[ix+1] += b - c + d
	t3[ix+2] += b + c - a
	t3[ix+3] -= d
}

// winoInputGradStrip is WinogradInputGrad for the tw tiles of one strip
// (rows iy … iy+3 of img, one plane of dx) through zero-padded rows of
// wp = 2·tw + 2 values in t, in which tile tx starts at column 2·tx: the
// column pass's adjoint of every tile into t (the vector kernel when
// there are 8 tiles or more), then the row pass's adjoint of t's image
// columns into the image rows that exist.
func winoInputGradStrip(img, dv []float32, s int, t *[4][stripMax]float32, g ConvGeom, iy, tw, wp int) {
	t0, t1, t2, t3 := t[0][:wp], t[1][:wp], t[2][:wp], t[3][:wp]
	clear(t0)
	clear(t1)
	clear(t2)
	clear(t3)
	if winoSIMD && tw >= 8 {
		for tx := 0; tx < tw; tx += 8 {
			st := min(tx, tw-8)
			_ = dv[st+7+15*s]
			winoInputGrad8(&t0[2*st], &t1[2*st], &t2[2*st], &t3[2*st], &dv[st], s, &winoMask[8-(tx-st)])
			tx = st
		}
	} else {
		for tx := range tw {
			colPassT(t0, t1, t2, t3, 2*tx, dv[tx:], s)
		}
	}
	w, pw := g.W, g.PadW
	t0, t1, t2, t3 = t0[pw:pw+w], t1[pw:pw+w], t2[pw:pw+w], t3[pw:pw+w]
	if iy >= 0 && iy+4 <= g.H {
		r0 := img[iy*w : (iy+1)*w]
		r1 := img[(iy+1)*w : (iy+2)*w]
		r2 := img[(iy+2)*w : (iy+3)*w]
		r3 := img[(iy+3)*w : (iy+4)*w]
		j0 := 0
		if winoSIMD && w >= 8 {
			winoRowT(&r0[0], &r1[0], &r2[0], &r3[0], &t0[0], &t1[0], &t2[0], &t3[0], w)
			j0 = w &^ 7
		}
		for j := j0; j < w; j++ {
			a, b, c, d := t0[j], t1[j], t2[j], t3[j]
			r0[j] += a
			r1[j] += b - c + d
			r2[j] += b + c - a
			r3[j] -= d
		}
		return
	}
	// a strip that reaches into the padding rows: the rows outside get
	// nothing
	for i := range 4 {
		y := iy + i
		if y < 0 || y >= g.H {
			continue
		}
		r := img[y*w : (y+1)*w]
		switch i {
		case 0:
			for j, a := range t0 {
				r[j] += a
			}
		case 1:
			for j, b := range t1 {
				r[j] += b - t2[j] + t3[j]
			}
		case 2:
			for j, b := range t1 {
				r[j] += b + t2[j] - t0[j]
			}
		case 3:
			for j, d := range t3 {
				r[j] -= d
			}
		}
	}
}

// addEdgePatch adds the 4×4 patch d at (iy, ix) into one plane, dropping
// what falls outside it.
func (g ConvGeom) addEdgePatch(img []float32, iy, ix int, d *[16]float32) {
	for i := range 4 {
		if y := iy + i; y >= 0 && y < g.H {
			for j := range 4 {
				if x := ix + j; x >= 0 && x < g.W {
					img[y*g.W+x] += d[4*i+j]
				}
			}
		}
	}
}

// inputTransformT returns B·dv·Bᵀ for the 4×4 tile at dv[ξ·s].
func inputTransformT(dv []float32, s int) (d [16]float32) {
	v15 := dv[15*s]
	v0, v1, v2, v3 := dv[0], dv[s], dv[2*s], dv[3*s]
	v4, v5, v6, v7 := dv[4*s], dv[5*s], dv[6*s], dv[7*s]
	v8, v9, v10, v11 := dv[8*s], dv[9*s], dv[10*s], dv[11*s]
	v12, v13, v14 := dv[12*s], dv[13*s], dv[14*s]
	// rows: u = B·dv, B = [1 0 0 0; 0 1 −1 1; −1 1 1 0; 0 0 0 −1]
	u00, u01, u02, u03 := v0, v1, v2, v3
	u10, u11, u12, u13 := v4-v8+v12, v5-v9+v13, v6-v10+v14, v7-v11+v15
	u20, u21, u22, u23 := v4+v8-v0, v5+v9-v1, v6+v10-v2, v7+v11-v3
	u30, u31, u32, u33 := -v12, -v13, -v14, -v15
	// columns: d = u·Bᵀ
	return [16]float32{
		u00, u01 - u02 + u03, u01 + u02 - u00, -u03,
		u10, u11 - u12 + u13, u11 + u12 - u10, -u13,
		u20, u21 - u22 + u23, u21 + u22 - u20, -u23,
		u30, u31 - u32 + u33, u31 + u32 - u30, -u33,
	}
}

// The output transform and its gradient have AVX2 kernels
// (winoOutputRows, winoOutputPool8, winoOutputGradRows, winoOutputPoolGrad8)
// for rows of at least 8 tiles (pooled: 8 tiles per sample and channel),
// with outputTile and outputGradTile, the same arithmetic, for the tiles
// they leave; otherwise, or without AVX2, they run as the GEMMs below.
//
// winoAA is Aᵀ⊗Aᵀ (4×16), Aᵀ = [1 1 1 0; 0 1 −1 −1]: row (i,j) maps the
// 16 points of a tile's M to output (i,j), so that the output transform
// of a whole block is one GEMM, and its transpose (winoAAT, 16×4) the
// output gradient's. Scalar Go code doing the same per tile measured
// 3–5× slower: it reads or writes 16 strided streams per tile with no
// vector instructions.
var winoAA, winoAAT = func() (aa, aat []float32) {
	at := [2][4]float32{{1, 1, 1, 0}, {0, 1, -1, -1}}
	aa, aat = make([]float32, 4*16), make([]float32, 16*4)
	for i := range 2 {
		for j := range 2 {
			for k := range 4 {
				for l := range 4 {
					v := at[i][k] * at[j][l]
					aa[(2*i+j)*16+4*k+l] = v
					aat[(4*k+l)*4+2*i+j] = v
				}
			}
		}
	}
	return aa, aat
}()

// winoChunk is the columns per output-transform GEMM: narrow enough for
// OpenBLAS's small-matrix kernels, which skip packing.
var winoChunk = 4096

// winoOutputVec reports whether WinogradOutput and WinogradOutputGrad use
// the vector kernels for g (rows of at least 8 whole tiles); the tiles
// past them (odd output sizes) go through outputTile and outputGradTile.
func winoOutputVec(g ConvGeom) bool {
	return winoSIMD && g.OutW()/2 >= 8
}

// winoPoolVec reports whether WinogradOutputPool and its gradient use the
// vector kernels for tiles tiles per sample and channel (at least 8).
func winoPoolVec(tiles int) bool {
	return winoSIMD && tiles >= 8
}

// outputTile returns Aᵀ·m·A of the tile whose points are m[ξ·s], in the
// vector kernels' order: p_c = (m0c + m1c) + m2c and
// q_c = (m1c − m2c) − m3c down each column c, then the same across p and
// q. (The GEMM path sums in its backend's order: the same values within
// a few ulps.)
func outputTile(m []float32, s int) (y00, y01, y10, y11 float32) {
	m = m[:15*s+1]
	var p, q [4]float32
	for c := range 4 {
		a, b, d, e := m[c*s], m[(4+c)*s], m[(8+c)*s], m[(12+c)*s]
		p[c] = (a + b) + d
		q[c] = (b - d) - e
	}
	return (p[0] + p[1]) + p[2], (p[1] - p[2]) - p[3], (q[0] + q[1]) + q[2], (q[1] - q[2]) - q[3]
}

// outputGradTile writes A·g·Aᵀ of one tile's output gradient
// (g00, g01; g10, g11) to dm[ξ·s], in the vector kernels' order: rows
// h0 = g0, h1 = g0 + g1, h2 = g0 − g1, h3 = −g1, then the same across
// each row.
func outputGradTile(dm []float32, s int, g00, g01, g10, g11 float32) {
	dm = dm[:15*s+1]
	h := [4][2]float32{{g00, g01}, {g00 + g10, g01 + g11}, {g00 - g10, g01 - g11}, {-g10, -g11}}
	for r, hr := range h {
		dm[4*r*s] = hr[0]
		dm[(4*r+1)*s] = hr[0] + hr[1]
		dm[(4*r+2)*s] = hr[0] - hr[1]
		dm[(4*r+3)*s] = -hr[1]
	}
}

// WinogradOutput sets y (batch, out, OutH, OutW) to Aᵀ·m·A + bias[o] for
// every output channel and tile, then to max(0, ·) when relu is set; m is
// (16, out, P) at point stride s, bias (out) or nil, and tmp scratch of at
// least 4·out·P values. Tile outputs past OutH or OutW (odd sizes) are
// dropped.
func WinogradOutput(y, tmp, m []float32, s int, bias []float32, g ConvGeom, out, batch int, relu bool) {
	g.checkWinograd("WinogradOutput")
	th, tw := g.WinogradTiles()
	oh, ow := g.OutH(), g.OutW()
	plane := oh * ow
	checkLen("WinogradOutput", "y", y, batch*out*plane)
	pn := th * tw
	P := batch * pn
	op := out * P
	checkPoints("WinogradOutput", "m", m, s, op)
	if bias != nil {
		checkLen("WinogradOutput", "bias", bias, out)
	}
	if len(tmp) < 4*op {
		panic(fmt.Sprintf("kernels: WinogradOutput: len(tmp)=%d < %d", len(tmp), 4*op))
	}
	if winoOutputVec(g) {
		winogradOutputVec(y, m, s, bias, g, out, batch, relu)
		return
	}
	for j := 0; j < op; j += winoChunk {
		w := min(winoChunk, op-j)
		Gemm(false, false, 4, w, 16, 1, winoAA, 16, m[j:], s, 0, tmp[j:], op)
	}
	t00, t01, t10, t11 := tmp[:op], tmp[op:2*op], tmp[2*op:3*op], tmp[3*op:4*op]
	for n := range batch {
		for o := range out {
			var b float32
			if bias != nil {
				b = bias[o]
			}
			img := y[(n*out+o)*plane : (n*out+o+1)*plane]
			for ty := range th {
				i0 := o*P + n*pn + ty*tw
				yy := 2 * ty
				for tx := range tw {
					i := i0 + tx
					y00, y01, y10, y11 := t00[i]+b, t01[i]+b, t10[i]+b, t11[i]+b
					if relu {
						y00, y01, y10, y11 = max(y00, 0), max(y01, 0), max(y10, 0), max(y11, 0)
					}
					xx := 2 * tx
					if yy+2 <= oh && xx+2 <= ow {
						r := img[yy*ow+xx:]
						r0, r1 := r[0:2:2], r[ow:ow+2:ow+2]
						r0[0], r0[1], r1[0], r1[1] = y00, y01, y10, y11
						continue
					}
					img[yy*ow+xx] = y00
					if xx+1 < ow {
						img[yy*ow+xx+1] = y01
					}
					if yy+1 < oh {
						img[(yy+1)*ow+xx] = y10
						if xx+1 < ow {
							img[(yy+1)*ow+xx+1] = y11
						}
					}
				}
			}
		}
	}
}

// winogradOutputVec is WinogradOutput with the vector kernel over the
// whole tiles of each sample and channel and outputTile for the rest.
func winogradOutputVec(y, m []float32, s int, bias []float32, g ConvGeom, out, batch int, relu bool) {
	th, tw := g.WinogradTiles()
	oh, ow := g.OutH(), g.OutW()
	plane := oh * ow
	pn := th * tw
	P := batch * pn
	whole, wholeRows := ow/2, oh/2
	for n := range batch {
		for o := range out {
			var b float32
			if bias != nil {
				b = bias[o]
			}
			img := y[(n*out+o)*plane : (n*out+o+1)*plane]
			i0 := o*P + n*pn
			if wholeRows > 0 {
				_ = img[(2*wholeRows-1)*ow+2*whole-1] // the kernel writes 2·wholeRows rows of 2·whole values
				_ = m[i0+(wholeRows-1)*tw+whole-1+15*s]
				winoOutputRows(&img[0], ow, &m[i0], s, whole, wholeRows, tw-whole, b, relu)
			}
			for ty := range th {
				yy := 2 * ty
				tx0 := 0
				if ty < wholeRows {
					tx0 = whole
				}
				for tx := tx0; tx < tw; tx++ {
					y00, y01, y10, y11 := outputTile(m[i0+ty*tw+tx:], s)
					y00, y01, y10, y11 = y00+b, y01+b, y10+b, y11+b
					if relu {
						y00, y01, y10, y11 = max(y00, 0), max(y01, 0), max(y10, 0), max(y11, 0)
					}
					xx := 2 * tx
					img[yy*ow+xx] = y00
					if xx+1 < ow {
						img[yy*ow+xx+1] = y01
					}
					if yy+1 < oh {
						img[(yy+1)*ow+xx] = y10
						if xx+1 < ow {
							img[(yy+1)*ow+xx+1] = y11
						}
					}
				}
			}
		}
	}
}

// WinogradOutputGrad sets dm (16, out, P, point stride s) to A·dy·Aᵀ for
// every output channel and tile of dy (batch, out, OutH, OutW): the
// adjoint of WinogradOutput's linear part (without bias and ReLU); tmp is
// scratch of at least 4·out·P values. Tile positions past OutH or OutW
// read as 0.
func WinogradOutputGrad(dm, tmp []float32, s int, dy []float32, g ConvGeom, out, batch int) {
	g.checkWinograd("WinogradOutputGrad")
	th, tw := g.WinogradTiles()
	oh, ow := g.OutH(), g.OutW()
	plane := oh * ow
	checkLen("WinogradOutputGrad", "dy", dy, batch*out*plane)
	pn := th * tw
	P := batch * pn
	op := out * P
	checkPoints("WinogradOutputGrad", "dm", dm, s, op)
	if len(tmp) < 4*op {
		panic(fmt.Sprintf("kernels: WinogradOutputGrad: len(tmp)=%d < %d", len(tmp), 4*op))
	}
	if winoOutputVec(g) {
		winogradOutputGradVec(dm, s, dy, g, out, batch)
		return
	}
	t00, t01, t10, t11 := tmp[:op], tmp[op:2*op], tmp[2*op:3*op], tmp[3*op:4*op]
	for n := range batch {
		for o := range out {
			img := dy[(n*out+o)*plane : (n*out+o+1)*plane]
			for ty := range th {
				i0 := o*P + n*pn + ty*tw
				yy := 2 * ty
				for tx := range tw {
					i := i0 + tx
					xx := 2 * tx
					if yy+2 <= oh && xx+2 <= ow {
						r := img[yy*ow+xx:]
						r0, r1 := r[0:2:2], r[ow:ow+2:ow+2]
						t00[i], t01[i], t10[i], t11[i] = r0[0], r0[1], r1[0], r1[1]
						continue
					}
					g00, g01, g10, g11 := edgeWindow(img, yy, xx, oh, ow)
					t00[i], t01[i], t10[i], t11[i] = g00, g01, g10, g11
				}
			}
		}
	}
	for j := 0; j < op; j += winoChunk {
		w := min(winoChunk, op-j)
		Gemm(false, false, 16, w, 4, 1, winoAAT, 4, tmp[j:], op, 0, dm[j:], s)
	}
}

// winogradOutputGradVec is WinogradOutputGrad with the vector kernel over
// the whole tiles of each sample and channel and outputGradTile for the
// rest.
func winogradOutputGradVec(dm []float32, s int, dy []float32, g ConvGeom, out, batch int) {
	th, tw := g.WinogradTiles()
	oh, ow := g.OutH(), g.OutW()
	plane := oh * ow
	pn := th * tw
	P := batch * pn
	whole, wholeRows := ow/2, oh/2
	for n := range batch {
		for o := range out {
			img := dy[(n*out+o)*plane : (n*out+o+1)*plane]
			i0 := o*P + n*pn
			if wholeRows > 0 {
				_ = img[(2*wholeRows-1)*ow+2*whole-1] // the kernel reads 2·wholeRows rows of 2·whole values
				_ = dm[i0+(wholeRows-1)*tw+whole-1+15*s]
				winoOutputGradRows(&dm[i0], s, &img[0], ow, whole, wholeRows, tw-whole)
			}
			for ty := range th {
				yy := 2 * ty
				tx0 := 0
				if ty < wholeRows {
					tx0 = whole
				}
				for tx := tx0; tx < tw; tx++ {
					xx := 2 * tx
					g00, g01, g10, g11 := edgeWindow(img, yy, xx, oh, ow)
					outputGradTile(dm[i0+ty*tw+tx:], s, g00, g01, g10, g11)
				}
			}
		}
	}
}

// WinogradPoolOK reports whether the 2×2 output tiles of g are exactly
// the windows of a 2×2 stride-2 max pool over its output: OutH and OutW
// even.
func (g ConvGeom) WinogradPoolOK() bool {
	return g.WinogradOK() && g.OutH()%2 == 0 && g.OutW()%2 == 0
}

func (g ConvGeom) checkWinogradPool(op string) {
	g.checkWinograd(op)
	if !g.WinogradPoolOK() {
		panic(fmt.Sprintf("kernels: %s: a fused 2×2 pool needs even output sizes, got %d×%d", op, g.OutH(), g.OutW()))
	}
}

// WinogradOutputPool is WinogradOutput followed by a 2×2 stride-2 max
// pool, whose windows are the output tiles: it sets y (batch, out,
// OutH/2, OutW/2) to the maximum of each tile of Aᵀ·m·A + bias[o] (then
// to max(0, ·) when relu is set) and arg to the window position of that
// maximum (0 top left, 1 top right, 2 bottom left, 3 bottom right). Ties
// go to the first position in that order; a NaN propagates (arg is then
// 3, as models.MaxPool2D records it). The full-size output is never
// written. tmp is scratch of at least 4·out·P values.
func WinogradOutputPool(y []float32, arg []uint8, tmp, m []float32, s int, bias []float32, g ConvGeom, out, batch int, relu bool) {
	g.checkWinogradPool("WinogradOutputPool")
	th, tw := g.WinogradTiles()
	pn := th * tw
	P := batch * pn
	op := out * P
	checkLen("WinogradOutputPool", "y", y, op)
	if len(arg) != op {
		panic(fmt.Sprintf("kernels: WinogradOutputPool: len(arg)=%d, want %d", len(arg), op))
	}
	checkPoints("WinogradOutputPool", "m", m, s, op)
	if bias != nil {
		checkLen("WinogradOutputPool", "bias", bias, out)
	}
	if len(tmp) < 4*op {
		panic(fmt.Sprintf("kernels: WinogradOutputPool: len(tmp)=%d < %d", len(tmp), 4*op))
	}
	if winoPoolVec(pn) {
		for n := range batch {
			for o := range out {
				var b float32
				if bias != nil {
					b = bias[o]
				}
				i0, k0 := o*P+n*pn, (n*out+o)*pn
				_ = m[i0+pn-1+15*s]
				_ = y[k0+pn-1]
				_ = arg[k0+pn-1]
				winoOutputPool8(&y[k0], &arg[k0], &m[i0], s, pn, b, relu)
			}
		}
		return
	}
	for j := 0; j < op; j += winoChunk {
		w := min(winoChunk, op-j)
		Gemm(false, false, 4, w, 16, 1, winoAA, 16, m[j:], s, 0, tmp[j:], op)
	}
	for n := range batch {
		for o := range out {
			var b float32
			if bias != nil {
				b = bias[o]
			}
			i0 := o*P + n*pn
			t00 := tmp[i0 : i0+pn]
			t01 := tmp[op+i0 : op+i0+pn]
			t10 := tmp[2*op+i0 : 2*op+i0+pn]
			t11 := tmp[3*op+i0 : 3*op+i0+pn]
			yo := y[(n*out+o)*pn : (n*out+o+1)*pn]
			ao := arg[(n*out+o)*pn : (n*out+o+1)*pn]
			for k := range yo {
				a0, a1, b0, b1 := t00[k]+b, t01[k]+b, t10[k]+b, t11[k]+b
				mx := max(max(a0, a1), max(b0, b1)) // NaN-propagating
				// int32, not uint8: the compiler turns these into conditional
				// moves only for 32- and 64-bit values, and which element
				// wins is random (branches mispredict: 24 against 13 ms for
				// the cnn's conv2 forward at batch 64)
				w := int32(3)
				if b0 == mx {
					w = 2
				}
				if a1 == mx {
					w = 1
				}
				if a0 == mx {
					w = 0
				}
				if relu {
					mx = max(mx, 0)
				}
				yo[k], ao[k] = mx, uint8(w)
			}
		}
	}
}

// WinogradOutputPoolGrad sets dm (16, out, P, point stride s) to A·e·Aᵀ
// for every output channel and tile, where e is the tile's gradient of
// the pooled output: d at the position arg recorded by WinogradOutputPool
// and 0 elsewhere, with d = dy (batch, out, OutH/2, OutW/2), or, when y is
// not nil, dy gated by the ReLU WinogradOutputPool applied: y is its
// pooled output, and d is 0 where y is +0 or negative (+Inf and NaNs
// pass, and so does −0, which the ReLU never outputs: the models'
// reluGate). It is the adjoint of
// WinogradOutputPool's linear part for fixed arg. When db is not nil, the
// bias gradient Σ d over each sample and channel's tiles is added to
// db[o] (samples in order, each summed as four interleaved partial sums
// (a0 + a1) + (a2 + a3), the models' sum32). tmp is scratch of at least
// 4·out·P values.
func WinogradOutputPoolGrad(dm, tmp []float32, s int, dy []float32, arg []uint8, y, db []float32, g ConvGeom, out, batch int) {
	g.checkWinogradPool("WinogradOutputPoolGrad")
	th, tw := g.WinogradTiles()
	P := batch * th * tw
	op := out * P
	checkLen("WinogradOutputPoolGrad", "dy", dy, op)
	if len(arg) != op {
		panic(fmt.Sprintf("kernels: WinogradOutputPoolGrad: len(arg)=%d, want %d", len(arg), op))
	}
	if y != nil {
		checkLen("WinogradOutputPoolGrad", "y", y, op)
	}
	if db != nil {
		checkLen("WinogradOutputPoolGrad", "db", db, out)
	}
	checkPoints("WinogradOutputPoolGrad", "dm", dm, s, op)
	if len(tmp) < 4*op {
		panic(fmt.Sprintf("kernels: WinogradOutputPoolGrad: len(tmp)=%d < %d", len(tmp), 4*op))
	}
	pn := th * tw
	if winoPoolVec(pn) {
		k8 := pn &^ 7 // the kernel's tiles; the rest here, in the same arithmetic
		for n := range batch {
			for o := range out {
				i0, k0 := o*P+n*pn, (n*out+o)*pn
				_ = dm[i0+pn-1+15*s]
				dyo := dy[k0 : k0+pn]
				ao := arg[k0 : k0+pn]
				var yo []float32
				var yp *float32
				if y != nil {
					yo = y[k0 : k0+pn]
					yp = &yo[0]
				}
				var a [4]float32
				winoOutputPoolGrad8(&dm[i0], s, &dyo[0], &ao[0], yp, pn, &a)
				for k := k8; k < pn; k++ {
					d := poolGradTerm(dyo, yo, k, &a)
					var e [4]float32
					e[ao[k]&3] = d
					outputGradTile(dm[i0+k:], s, e[0], e[1], e[2], e[3])
				}
				if db != nil {
					db[o] += (a[0] + a[1]) + (a[2] + a[3])
				}
			}
		}
		return
	}
	for n := range batch {
		for o := range out {
			i0 := o*P + n*pn
			t00 := tmp[i0 : i0+pn]
			t01 := tmp[op+i0 : op+i0+pn]
			t10 := tmp[2*op+i0 : 2*op+i0+pn]
			t11 := tmp[3*op+i0 : 3*op+i0+pn]
			k0 := (n*out + o) * pn
			dyo := dy[k0 : k0+pn]
			ao := arg[k0 : k0+pn]
			var yo []float32
			if y != nil {
				yo = y[k0 : k0+pn]
			}
			var a [4]float32
			for k := range dyo {
				d := poolGradTerm(dyo, yo, k, &a)
				var e [4]float32
				e[ao[k]&3] = d
				t00[k], t01[k], t10[k], t11[k] = e[0], e[1], e[2], e[3]
			}
			if db != nil {
				db[o] += (a[0] + a[1]) + (a[2] + a[3])
			}
		}
	}
	for j := 0; j < op; j += winoChunk {
		w := min(winoChunk, op-j)
		Gemm(false, false, 16, w, 4, 1, winoAAT, 4, tmp[j:], op, 0, dm[j:], s)
	}
}

// poolGradTerm returns tile k's gradient d: dy[k], or 0 where y is not
// nil and −bits(y[k]) is not negative as an int32 (y[k] is +0 or
// negative; the models' reluGate), and
// adds it to the partial sums a as the models' sum32 does: a[k%4] over
// the whole groups of 4, a[0] for the rest.
func poolGradTerm(dy, y []float32, k int, a *[4]float32) float32 {
	d := dy[k]
	if y != nil {
		mask := uint32(-int32(math.Float32bits(y[k])) >> 31)
		d = math.Float32frombits(math.Float32bits(d) & mask)
	}
	if k < len(dy)&^3 {
		a[k&3] += d
	} else {
		a[0] += d
	}
	return d
}

// WinogradTransposeV sets vt (16, P, C) at point stride st to the
// transposes of the point matrices of v (16, C, P) at point stride s, so
// that the weight gradient's dU[ξ] = dM[ξ]·V[ξ]ᵀ runs as a GEMM without a
// transposed operand (OpenBLAS: ~1.8× faster at the cnn's conv2 sizes,
// which pays for the copy).
func WinogradTransposeV(vt []float32, st int, v []float32, s, c, p int) {
	WinogradTransposeVN(vt, st, v, s, c, p, 16)
}

// edgeWindow returns the 2×2 window of the oh×ow image img at (yy, xx),
// with zeros for the positions past its right or bottom edge.
func edgeWindow(img []float32, yy, xx, oh, ow int) (g00, g01, g10, g11 float32) {
	g00 = img[yy*ow+xx]
	if xx+1 < ow {
		g01 = img[yy*ow+xx+1]
	}
	if yy+1 < oh {
		g10 = img[(yy+1)*ow+xx]
		if xx+1 < ow {
			g11 = img[(yy+1)*ow+xx+1]
		}
	}
	return g00, g01, g10, g11
}

// checkPointsN panics unless x holds n matrices of k values at stride s.
func checkPointsN(op, what string, x []float32, s, k, n int) {
	if s < k || len(x) < (n-1)*s+k {
		panic(fmt.Sprintf("kernels: %s: len(%s)=%d with point stride %d cannot hold %d matrices of %d values", op, what, len(x), s, n, k))
	}
}

// Winograd4Points and Winograd4Tiles are F(4×4, 3×3)'s (winograd4.go)
// shapes, here because models sizes its buffers with them whether or not
// the build has it (-tags winograd4).

// Winograd4Points is the number of points (and GEMMs) of F(4×4, 3×3).
const Winograd4Points = 36

// Winograd4Tiles is the grid of 4×4 output tiles: ⌈OutH/4⌉ × ⌈OutW/4⌉.
func (g ConvGeom) Winograd4Tiles() (th, tw int) {
	return (g.OutH() + 3) / 4, (g.OutW() + 3) / 4
}

// WinogradTransposeVN is WinogradTransposeV for n point matrices (16 for
// F(2×2, 3×3), 36 for F(4×4, 3×3)).
func WinogradTransposeVN(vt []float32, st int, v []float32, s, c, p, n int) {
	checkPointsN("WinogradTransposeVN", "v", v, s, c*p, n)
	checkPointsN("WinogradTransposeVN", "vt", vt, st, c*p, n)
	vec := winoSIMD && c >= 8 && p >= 8
	for xi := range n {
		src := v[xi*s : xi*s+c*p]
		dst := vt[xi*st : xi*st+c*p]
		i0, j0 := 0, 0
		if vec {
			i0, j0 = c&^7, p&^7
			winoTranspose(&dst[0], c, &src[0], p, c/8, p/8)
		}
		for i := range c {
			jl := 0
			if i < i0 {
				jl = j0
			}
			for j := jl; j < p; j++ {
				dst[j*c+i] = src[i*p+j]
			}
		}
	}
}
