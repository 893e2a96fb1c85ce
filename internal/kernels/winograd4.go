//go:build winograd4

package kernels

import (
	"fmt"
	"math"
)

// Winograd F(4×4, 3×3) (Lavin & Gray 2015, points 0, ±1, ±2 and ∞): the
// output is cut into 4×4 tiles; tile p reads the 6×6 input patch at
// (4·ty − PadH, 4·tx − PadW) and
//
//	y_tile = Aᵀ [ Σ_c (G w_{o,c} Gᵀ) ⊙ (Bᵀ d_{c,p} B) ] A
//
// with 36 GEMMs, one per point ξ = 6·i + j of the 6×6 transformed tile:
// 4× fewer multiplications than im2col, against 2.25× for F(2×2, 3×3).
// The layouts are F(2×2, 3×3)'s (see winograd.go) with 36 point matrices
// instead of 16: U (36, Out, C), V (36, C, P), M (36, Out, P), tile
// p = (n·TilesH + ty)·TilesW + tx of the 4×4 tile grid Winograd4Tiles.
//
//	Bᵀ = [4 0 −5 0 1 0; 0 −4 −4 1 1 0; 0 4 −4 −1 1 0;
//	      0 −2 −1 2 1 0; 0 2 −1 −2 1 0; 0 4 0 −5 0 1]
//	G  = [1/4 0 0; −1/6 −1/6 −1/6; −1/6 1/6 −1/6;
//	      1/24 1/12 1/6; 1/24 −1/12 1/6; 0 0 1]
//	Aᵀ = [1 1 1 1 1 0; 0 1 −1 2 −2 0; 0 1 1 4 4 0; 0 1 −1 8 −8 1]
//
// The Go code is the reference; with AVX2, groups of 8 tiles (in the
// order of P) go through vector kernels (winograd4_amd64.s) for the
// transforms themselves, with the same values, while the gathers and
// scatters around them (edge tiles, the input gradient's overlapping
// patches, the pool's windows) stay Go code. models.Conv2D uses it only
// when switched on: on the cnn's conv2 it is not faster than F(2×2, 3×3)
// yet (see models' winograd4). It is therefore compiled only with the
// build tag winograd4 (go test -tags winograd4 ./internal/kernels/
// ./models/), so the default build does not carry it.

// Winograd4Built says this build has F(4×4, 3×3) (built with -tags
// winograd4; winograd4_off.go stands in for it otherwise).
const Winograd4Built = true

// in4 is Bᵀ·d for one column (or row) of a patch.
func in4(d0, d1, d2, d3, d4, d5 float32) (t0, t1, t2, t3, t4, t5 float32) {
	a := d4 - 4*d2
	b := d3 - 4*d1
	c := d4 - d2
	e := 2 * (d3 - d1)
	return 4*d0 - 5*d2 + d4, a + b, a - b, c + e, c - e, 4*d1 - 5*d3 + d5
}

// in4T is B·v, the adjoint of in4.
func in4T(v0, v1, v2, v3, v4, v5 float32) (d0, d1, d2, d3, d4, d5 float32) {
	return 4 * v0,
		4*(v2-v1+v5) + 2*(v4-v3),
		-5*v0 - 4*(v1+v2) - (v3 + v4),
		(v1 - v2) + 2*(v3-v4) - 5*v5,
		v0 + v1 + v2 + v3 + v4,
		v5
}

// out4 is Aᵀ·m for one column (or row) of a tile.
func out4(m0, m1, m2, m3, m4, m5 float32) (y0, y1, y2, y3 float32) {
	p, q := m1+m2, m1-m2
	r, s := m3+m4, m3-m4
	return m0 + p + r, q + 2*s, p + 4*r, q + 8*s + m5
}

// out4T is A·g, the adjoint of out4.
func out4T(g0, g1, g2, g3 float32) (m0, m1, m2, m3, m4, m5 float32) {
	p, q := g0+g2, g1+g3
	r, s := g0+4*g2, 2*g1+8*g3
	return g0, p + q, p - q, r + s, r - s, g3
}

// Winograd4Filter sets u (36, out, C) to G·w·Gᵀ for every (o, c), where w
// is (out, C, 3, 3) in PyTorch's layout.
func Winograd4Filter(u, w []float32, out, c int) {
	checkLen("Winograd4Filter", "w", w, out*c*9)
	checkLen("Winograd4Filter", "u", u, 36*out*c)
	s := out * c
	filt := func(g0, g1, g2 float32) [6]float32 {
		a := -(g0 + g2) / 6
		b := g1 / 6
		e := g0/24 + g2/6
		f := g1 / 12
		return [6]float32{g0 / 4, a - b, a + b, e + f, e - f, g2}
	}
	for i := range s {
		g := w[i*9 : i*9+9 : i*9+9]
		var h [3][6]float32 // columns of G·g
		for j := range 3 {
			h[j] = filt(g[j], g[3+j], g[6+j])
		}
		for k := range 6 {
			r := filt(h[0][k], h[1][k], h[2][k])
			for l := range 6 {
				u[(6*k+l)*s+i] = r[l]
			}
		}
	}
}

// Winograd4FilterGrad adds Gᵀ·du·G into dw (out, C, 3, 3) for every
// (o, c): the adjoint of Winograd4Filter, with du (36, out, C).
func Winograd4FilterGrad(dw, du []float32, out, c int) {
	checkLen("Winograd4FilterGrad", "dw", dw, out*c*9)
	checkLen("Winograd4FilterGrad", "du", du, 36*out*c)
	s := out * c
	filtT := func(e *[6]float32) (g0, g1, g2 float32) {
		g0 = e[0]/4 - (e[1]+e[2])/6 + (e[3]+e[4])/24
		g1 = (e[2]-e[1])/6 + (e[3]-e[4])/12
		g2 = (e[3]+e[4]-e[1]-e[2])/6 + e[5]
		return g0, g1, g2
	}
	for i := range s {
		var h [6][3]float32 // rows of du·G
		for k := range 6 {
			var e [6]float32
			for l := range 6 {
				e[l] = du[(6*k+l)*s+i]
			}
			h[k][0], h[k][1], h[k][2] = filtT(&e)
		}
		g := dw[i*9 : i*9+9 : i*9+9]
		for j := range 3 {
			e := [6]float32{h[0][j], h[1][j], h[2][j], h[3][j], h[4][j], h[5][j]}
			g0, g1, g2 := filtT(&e)
			g[j] += g0
			g[3+j] += g1
			g[6+j] += g2
		}
	}
}

// patch6 reads the 6×6 patch at (iy, ix) of one plane with zeros outside it.
func (g ConvGeom) patch6(img []float32, iy, ix int) (d [36]float32) {
	if iy >= 0 && ix >= 0 && iy+6 <= g.H && ix+6 <= g.W {
		for i := range 6 {
			copy(d[6*i:6*i+6], img[(iy+i)*g.W+ix:])
		}
		return d
	}
	for i := range 6 {
		if y := iy + i; y >= 0 && y < g.H {
			for j := range 6 {
				if x := ix + j; x >= 0 && x < g.W {
					d[6*i+j] = img[y*g.W+x]
				}
			}
		}
	}
	return d
}

// addPatch6 adds the 6×6 patch d at (iy, ix) into one plane, dropping what
// falls outside it.
func (g ConvGeom) addPatch6(img []float32, iy, ix int, d *[36]float32) {
	for i := range 6 {
		if y := iy + i; y >= 0 && y < g.H {
			row := img[y*g.W : (y+1)*g.W]
			for j := range 6 {
				if x := ix + j; x >= 0 && x < g.W {
					row[x] += d[6*i+j]
				}
			}
		}
	}
}

// tile4 returns the sample of tile p and the top left corner of its
// input patch.
func (g ConvGeom) tile4(p, pn, tw int) (n, iy, ix int) {
	n, t := p/pn, p%pn
	return n, 4*(t/tw) - g.PadH, 4*(t%tw) - g.PadW
}

// interior4 reports whether the 6×6 patch at (iy, ix) lies inside the
// image.
func (g ConvGeom) interior4(iy, ix int) bool {
	return iy >= 0 && ix >= 0 && iy+6 <= g.H && ix+6 <= g.W
}

// input4Tile writes Bᵀ·d·B of the 6×6 patch d to q[ξ·s].
func input4Tile(q []float32, s int, d *[36]float32) {
	// columns: t = Bᵀ·d
	for j := range 6 {
		d[j], d[6+j], d[12+j], d[18+j], d[24+j], d[30+j] = in4(d[j], d[6+j], d[12+j], d[18+j], d[24+j], d[30+j])
	}
	q = q[:35*s+1]
	// rows: V = t·B
	for i := range 6 {
		r := d[6*i : 6*i+6 : 6*i+6]
		v0, v1, v2, v3, v4, v5 := in4(r[0], r[1], r[2], r[3], r[4], r[5])
		q[6*i*s] = v0
		q[(6*i+1)*s] = v1
		q[(6*i+2)*s] = v2
		q[(6*i+3)*s] = v3
		q[(6*i+4)*s] = v4
		q[(6*i+5)*s] = v5
	}
}

// input4GradTile returns B·dv·Bᵀ of the tile whose points are q[ξ·s].
func input4GradTile(q []float32, s int) (d [36]float32) {
	q = q[:35*s+1]
	// rows: u = dv·Bᵀ
	for i := range 6 {
		d[6*i], d[6*i+1], d[6*i+2], d[6*i+3], d[6*i+4], d[6*i+5] =
			in4T(q[6*i*s], q[(6*i+1)*s], q[(6*i+2)*s], q[(6*i+3)*s], q[(6*i+4)*s], q[(6*i+5)*s])
	}
	// columns: B·u
	for j := range 6 {
		d[j], d[6+j], d[12+j], d[18+j], d[24+j], d[30+j] = in4T(d[j], d[6+j], d[12+j], d[18+j], d[24+j], d[30+j])
	}
	return d
}

// wino4Lanes is the scratch of the vector kernels: 8 tiles' values, lane
// k of value e at 8·e + k.
type wino4Lanes [320]float32

// lane returns the first n values of lane k.
func (b *wino4Lanes) lane(k, n int) (t [36]float32) {
	for e := range n {
		t[e] = b[8*e+k]
	}
	return t
}

// Winograd4Input sets v (36, C, P) at point stride s to Bᵀ·d·B for every
// channel c and tile p of the batch x (batch, C, H, W); input outside the
// image (padding, or past the edge for partial tiles) reads as 0. With
// AVX2, groups of 8 tiles (in the order of P) whose patches lie inside
// the image go through a vector kernel, with the same values.
func Winograd4Input(v []float32, s int, x []float32, g ConvGeom, batch int) {
	g.checkWinograd("Winograd4Input")
	th, tw := g.Winograd4Tiles()
	plane := g.H * g.W
	checkLen("Winograd4Input", "x", x, batch*g.C*plane)
	pn := th * tw
	P := batch * pn
	checkPointsN("Winograd4Input", "v", v, s, g.C*P, 36)
	var buf wino4Lanes
	for p0 := 0; p0 < P; p0 += 8 {
		if winoSIMD && p0+8 <= P {
			var idx [8]int32
			ok := true
			for k := range 8 {
				n, iy, ix := g.tile4(p0+k, pn, tw)
				ok = ok && g.interior4(iy, ix)
				idx[k] = int32(n*g.C*plane + iy*g.W + ix)
			}
			if ok && batch*g.C*plane < math.MaxInt32 {
				for c := range g.C {
					_ = v[c*P+p0+7+35*s]
					wino4In8(&v[c*P+p0], s, &x[c*plane], &idx[0], g.W, &buf[0])
				}
				continue
			}
		}
		for p := p0; p < min(p0+8, P); p++ {
			n, iy, ix := g.tile4(p, pn, tw)
			for c := range g.C {
				img := x[(n*g.C+c)*plane : (n*g.C+c+1)*plane]
				d := g.patch6(img, iy, ix)
				input4Tile(v[c*P+p:], s, &d)
			}
		}
	}
}

// Winograd4InputGrad adds B·dv·Bᵀ of every channel and tile into dx
// (batch, C, H, W): the adjoint of Winograd4Input, with dv (36, C, P) at
// point stride s. Contributions that fall outside the image are dropped.
func Winograd4InputGrad(dx, dv []float32, s int, g ConvGeom, batch int) {
	g.checkWinograd("Winograd4InputGrad")
	th, tw := g.Winograd4Tiles()
	plane := g.H * g.W
	checkLen("Winograd4InputGrad", "dx", dx, batch*g.C*plane)
	pn := th * tw
	P := batch * pn
	checkPointsN("Winograd4InputGrad", "dv", dv, s, g.C*P, 36)
	var buf wino4Lanes
	for c := range g.C {
		for p0 := 0; p0 < P; p0 += 8 {
			if winoSIMD && p0+8 <= P {
				_ = dv[c*P+p0+7+35*s]
				wino4InT8(&buf[0], &dv[c*P+p0], s)
				for k := range 8 {
					n, iy, ix := g.tile4(p0+k, pn, tw)
					img := dx[(n*g.C+c)*plane : (n*g.C+c+1)*plane]
					if !g.interior4(iy, ix) {
						d := buf.lane(k, 36)
						g.addPatch6(img, iy, ix, &d)
						continue
					}
					for i := range 6 {
						row := img[(iy+i)*g.W+ix : (iy+i)*g.W+ix+6 : (iy+i)*g.W+ix+6]
						b := buf[48*i+k : 48*i+k+41 : 48*i+k+41]
						row[0] += b[0]
						row[1] += b[8]
						row[2] += b[16]
						row[3] += b[24]
						row[4] += b[32]
						row[5] += b[40]
					}
				}
				continue
			}
			for p := p0; p < min(p0+8, P); p++ {
				n, iy, ix := g.tile4(p, pn, tw)
				d := input4GradTile(dv[c*P+p:], s)
				g.addPatch6(dx[(n*g.C+c)*plane:(n*g.C+c+1)*plane], iy, ix, &d)
			}
		}
	}
}

// output4Tile returns Aᵀ·m·A of the tile whose points are m[ξ·s], row by
// row.
func output4Tile(m []float32, s int) (y [16]float32) {
	m = m[:35*s+1]
	var t [4][6]float32 // Aᵀ·m
	for j := range 6 {
		t[0][j], t[1][j], t[2][j], t[3][j] = out4(m[j*s], m[(6+j)*s], m[(12+j)*s], m[(18+j)*s], m[(24+j)*s], m[(30+j)*s])
	}
	for i := range 4 {
		r := &t[i]
		y[4*i], y[4*i+1], y[4*i+2], y[4*i+3] = out4(r[0], r[1], r[2], r[3], r[4], r[5])
	}
	return y
}

// output4GradTile writes A·e·Aᵀ of one tile's output gradient e (4×4, row
// by row) to dm[ξ·s].
func output4GradTile(dm []float32, s int, e *[16]float32) {
	dm = dm[:35*s+1]
	var t [4][6]float32 // e·Aᵀ
	for i := range 4 {
		t[i][0], t[i][1], t[i][2], t[i][3], t[i][4], t[i][5] = out4T(e[4*i], e[4*i+1], e[4*i+2], e[4*i+3])
	}
	for j := range 6 {
		m0, m1, m2, m3, m4, m5 := out4T(t[0][j], t[1][j], t[2][j], t[3][j])
		dm[j*s] = m0
		dm[(6+j)*s] = m1
		dm[(12+j)*s] = m2
		dm[(18+j)*s] = m3
		dm[(24+j)*s] = m4
		dm[(30+j)*s] = m5
	}
}

// tileCursor walks the tiles of a block in the order of P.
type tileCursor struct{ n, ty, tx, th, tw int }

func (c *tileCursor) next() {
	if c.tx++; c.tx == c.tw {
		c.tx = 0
		if c.ty++; c.ty == c.th {
			c.ty = 0
			c.n++
		}
	}
}

// tiles4 sets buf[8·e + k], e = 0..15, to Aᵀ·m·A of tile p0 + k of one
// output channel, whose points are m[ξ·s + p0 + k], for the n = min(8,
// P − p0) tiles from p0 (the AVX2 kernel for whole groups, output4Tile
// otherwise: the same values), and returns n.
func tiles4(buf *wino4Lanes, m []float32, s, p0, P int) int {
	if winoSIMD && p0+8 <= P {
		_ = m[p0+7+35*s]
		wino4Out8(&buf[0], &m[p0], s)
		return 8
	}
	n := min(8, P-p0)
	for k := range n {
		y := output4Tile(m[p0+k:], s)
		for e, v := range y {
			buf[8*e+k] = v
		}
	}
	return n
}

// gradTiles4 writes A·e·Aᵀ to dm[ξ·s + p0 + k] for the n tiles from p0,
// where e is buf[8·i + k], i = 0..15.
func gradTiles4(dm []float32, s, p0, n int, buf *wino4Lanes) {
	if winoSIMD && n == 8 {
		_ = dm[p0+7+35*s]
		wino4OutT8(&dm[p0], s, &buf[0])
		return
	}
	for k := range n {
		var e [16]float32
		for i := range e {
			e[i] = buf[8*i+k]
		}
		output4GradTile(dm[p0+k:], s, &e)
	}
}

// Winograd4Output sets y (batch, out, OutH, OutW) to Aᵀ·m·A + bias[o] for
// every output channel and tile, then to max(0, ·) when relu is set; m is
// (36, out, P) at point stride s, bias (out) or nil. Tile outputs past
// OutH or OutW are dropped.
func Winograd4Output(y, m []float32, s int, bias []float32, g ConvGeom, out, batch int, relu bool) {
	g.checkWinograd("Winograd4Output")
	th, tw := g.Winograd4Tiles()
	oh, ow := g.OutH(), g.OutW()
	plane := oh * ow
	checkLen("Winograd4Output", "y", y, batch*out*plane)
	pn := th * tw
	P := batch * pn
	checkPointsN("Winograd4Output", "m", m, s, out*P, 36)
	if bias != nil {
		checkLen("Winograd4Output", "bias", bias, out)
	}
	for o := range out {
		var b float32
		if bias != nil {
			b = bias[o]
		}
		c := tileCursor{th: th, tw: tw}
		var buf wino4Lanes
		for p0 := 0; p0 < P; p0 += 8 {
			for k := range tiles4(&buf, m[o*P:], s, p0, P) {
				ty, tx := c.ty, c.tx
				img := y[(c.n*out+o)*plane : (c.n*out+o+1)*plane]
				for i := range 4 {
					yy := 4*ty + i
					if yy >= oh {
						break
					}
					for j := range 4 {
						xx := 4*tx + j
						if xx >= ow {
							break
						}
						v := buf[8*(4*i+j)+k] + b
						if relu {
							v = max(v, 0)
						}
						img[yy*ow+xx] = v
					}
				}
				c.next()
			}
		}
	}
}

// Winograd4OutputGrad sets dm (36, out, P, point stride s) to A·dy·Aᵀ for
// every output channel and tile of dy (batch, out, OutH, OutW): the
// adjoint of Winograd4Output's linear part. Tile positions past OutH or
// OutW read as 0.
func Winograd4OutputGrad(dm []float32, s int, dy []float32, g ConvGeom, out, batch int) {
	g.checkWinograd("Winograd4OutputGrad")
	th, tw := g.Winograd4Tiles()
	oh, ow := g.OutH(), g.OutW()
	plane := oh * ow
	checkLen("Winograd4OutputGrad", "dy", dy, batch*out*plane)
	pn := th * tw
	P := batch * pn
	checkPointsN("Winograd4OutputGrad", "dm", dm, s, out*P, 36)
	for o := range out {
		c := tileCursor{th: th, tw: tw}
		var buf wino4Lanes
		for p0 := 0; p0 < P; p0 += 8 {
			n := min(8, P-p0)
			clear(buf[:128])
			for k := range n {
				ty, tx := c.ty, c.tx
				img := dy[(c.n*out+o)*plane : (c.n*out+o+1)*plane]
				for i := range 4 {
					yy := 4*ty + i
					if yy >= oh {
						break
					}
					for j := range 4 {
						xx := 4*tx + j
						if xx >= ow {
							break
						}
						buf[8*(4*i+j)+k] = img[yy*ow+xx]
					}
				}
				c.next()
			}
			gradTiles4(dm[o*P:], s, p0, n, &buf)
		}
	}
}

// Winograd4PoolOK reports whether a 2×2 stride-2 max pool over the output
// of g can be taken in Winograd4OutputPool: OutH and OutW even (each 4×4
// tile then holds whole pool windows).
func (g ConvGeom) Winograd4PoolOK() bool {
	return g.WinogradPoolOK()
}

// Winograd4OutputPool is Winograd4Output followed by a 2×2 stride-2 max
// pool: it sets y (batch, out, OutH/2, OutW/2) to the maximum of each
// window of Aᵀ·m·A + bias[o] (then to max(0, ·) when relu is set) and arg
// to the window position of that maximum (0 top left, 1 top right, 2
// bottom left, 3 bottom right), with WinogradOutputPool's rules for ties
// and NaNs. The full-size output is never written.
func Winograd4OutputPool(y []float32, arg []uint8, m []float32, s int, bias []float32, g ConvGeom, out, batch int, relu bool) {
	g.checkWinogradPool("Winograd4OutputPool")
	th, tw := g.Winograd4Tiles()
	ph, pw := g.OutH()/2, g.OutW()/2
	pplane := ph * pw
	pn := th * tw
	P := batch * pn
	checkLen("Winograd4OutputPool", "y", y, batch*out*pplane)
	if len(arg) != len(y) {
		panic(fmt.Sprintf("kernels: Winograd4OutputPool: len(arg)=%d, want %d", len(arg), len(y)))
	}
	checkPointsN("Winograd4OutputPool", "m", m, s, out*P, 36)
	if bias != nil {
		checkLen("Winograd4OutputPool", "bias", bias, out)
	}
	for o := range out {
		var b float32
		if bias != nil {
			b = bias[o]
		}
		c := tileCursor{th: th, tw: tw}
		var buf wino4Lanes
		for p0 := 0; p0 < P; p0 += 8 {
			for k := range tiles4(&buf, m[o*P:], s, p0, P) {
				ty, tx := c.ty, c.tx
				k0 := (c.n*out + o) * pplane
				yo, ao := y[k0:k0+pplane], arg[k0:k0+pplane]
				for wy := range 2 {
					py := 2*ty + wy
					if py >= ph {
						break
					}
					for wx := range 2 {
						px := 2*tx + wx
						if px >= pw {
							break
						}
						t := buf[8*(8*wy+2*wx)+k : 8*(8*wy+2*wx)+k+41 : 8*(8*wy+2*wx)+k+41]
						a0, a1, b0, b1 := t[0]+b, t[8]+b, t[32]+b, t[40]+b
						mx := max(max(a0, a1), max(b0, b1)) // NaN-propagating
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
						yo[py*pw+px], ao[py*pw+px] = mx, uint8(w)
					}
				}
				c.next()
			}
		}
	}
}

// Winograd4OutputPoolGrad sets dm (36, out, P, point stride s) to A·e·Aᵀ
// for every output channel and tile, where e is the tile's gradient of
// the pooled output: for each of its pool windows, d at the position arg
// recorded by Winograd4OutputPool and 0 elsewhere, with d = dy (batch,
// out, OutH/2, OutW/2) gated by the ReLU when y (the pooled output) is not
// nil, as WinogradOutputPoolGrad does. When db is not nil, the bias
// gradient Σ d over each sample and channel is added to db[o] in
// WinogradOutputPoolGrad's order (the models' sum32).
func Winograd4OutputPoolGrad(dm []float32, s int, dy []float32, arg []uint8, y, db []float32, g ConvGeom, out, batch int) {
	g.checkWinogradPool("Winograd4OutputPoolGrad")
	th, tw := g.Winograd4Tiles()
	ph, pw := g.OutH()/2, g.OutW()/2
	pplane := ph * pw
	pn := th * tw
	P := batch * pn
	checkLen("Winograd4OutputPoolGrad", "dy", dy, batch*out*pplane)
	if len(arg) != len(dy) {
		panic(fmt.Sprintf("kernels: Winograd4OutputPoolGrad: len(arg)=%d, want %d", len(arg), len(dy)))
	}
	if y != nil {
		checkLen("Winograd4OutputPoolGrad", "y", y, len(dy))
	}
	if db != nil {
		checkLen("Winograd4OutputPoolGrad", "db", db, out)
		for n := range batch {
			for o := range out {
				k0 := (n*out + o) * pplane
				var yo []float32
				if y != nil {
					yo = y[k0 : k0+pplane]
				}
				var a [4]float32
				dyo := dy[k0 : k0+pplane]
				for k := range dyo {
					poolGradTerm(dyo, yo, k, &a)
				}
				db[o] += (a[0] + a[1]) + (a[2] + a[3])
			}
		}
	}
	checkPointsN("Winograd4OutputPoolGrad", "dm", dm, s, out*P, 36)
	for o := range out {
		c := tileCursor{th: th, tw: tw}
		var buf wino4Lanes
		for p0 := 0; p0 < P; p0 += 8 {
			n := min(8, P-p0)
			clear(buf[:128])
			for k := range n {
				ty, tx := c.ty, c.tx
				k0 := (c.n*out + o) * pplane
				dyo, ao := dy[k0:k0+pplane], arg[k0:k0+pplane]
				for wy := range 2 {
					py := 2*ty + wy
					if py >= ph {
						break
					}
					for wx := range 2 {
						px := 2*tx + wx
						if px >= pw {
							break
						}
						q := py*pw + px
						d := dyo[q]
						if y != nil {
							mask := uint32(-int32(math.Float32bits(y[k0+q])) >> 31)
							d = math.Float32frombits(math.Float32bits(d) & mask)
						}
						a := ao[q] & 3
						buf[8*(8*wy+2*wx+4*int(a>>1)+int(a&1))+k] = d
					}
				}
				c.next()
			}
			gradTiles4(dm[o*P:], s, p0, n, &buf)
		}
	}
}
