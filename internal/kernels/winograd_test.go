package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// winogradGeoms are 3×3 stride-1 boundary cases: the smallest image, odd
// and even output sizes (partial tiles), padding 0, 1 and 2 (tiles that
// read only padding), and the cnn's conv2.
func winogradGeoms() []ConvGeom {
	w := func(c, h, wd, pad int) ConvGeom {
		return ConvGeom{C: c, H: h, W: wd, KH: 3, KW: 3, StrideH: 1, StrideW: 1, PadH: pad, PadW: pad}
	}
	return []ConvGeom{
		w(1, 3, 3, 0), w(1, 4, 4, 0), w(2, 5, 4, 0), w(3, 4, 7, 0), w(1, 1, 1, 1), w(2, 2, 3, 1),
		w(2, 5, 5, 1), w(3, 6, 7, 1), w(1, 3, 4, 2), w(2, 7, 8, 2), w(32, 26, 26, 0),
		w(2, 4, 6, 1), w(1, 2, 4, 2), w(3, 8, 4, 0), // even outputs (a fused 2×2 pool)
		w(3, 6, 18, 0), w(2, 5, 19, 1), w(1, 4, 40, 2), // vector kernels: one block, edge tiles around it, overlapping blocks
		{C: 2, H: 5, W: 6, KH: 3, KW: 3, StrideH: 1, StrideW: 1, PadH: 0, PadW: 1},
		// output vector kernels: rows of 8+ whole tiles with an odd edge
		// column and row, a partial last block; a pool of 8 narrow tiles
		w(3, 19, 21, 1), w(1, 12, 20, 0), w(2, 10, 6, 0),
	}
}

// winogradConv is the whole forward pass the models use: filter and input
// transforms, 16 GEMMs, output transform.
func winogradConv(w, b, x []float32, out, batch int, g ConvGeom, relu bool) []float32 {
	th, tw := g.WinogradTiles()
	P := batch * th * tw
	u := make([]float32, 16*out*g.C)
	sv, sm := WinogradStride(g.C*P), WinogradStride(out*P)
	v := make([]float32, 16*sv)
	m := make([]float32, 16*sm)
	WinogradFilter(u, w, out, g.C)
	WinogradInput(v, sv, x, g, batch)
	for xi := range 16 {
		Gemm(false, false, out, P, g.C, 1, u[xi*out*g.C:], g.C, v[xi*sv:], P, 0, m[xi*sm:], P)
	}
	y := make([]float32, batch*out*g.OutH()*g.OutW())
	for i := range y {
		y[i] = float32(math.NaN()) // every element must be written
	}
	WinogradOutput(y, make([]float32, 4*out*P), m, sm, b, g, out, batch, relu)
	return y
}

func TestWinogradMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	for _, be := range backends(t) {
		withBackend(t, be, func() {
			for _, g := range winogradGeoms() {
				for _, out := range []int{1, 3} {
					for _, batch := range []int{1, 2} {
						w := randSlice(r, out*g.C*9)
						b := randSlice(r, out)
						x := randSlice(r, batch*g.C*g.H*g.W)
						for _, relu := range []bool{false, true} {
							got := winogradConv(w, b, x, out, batch, g, relu)
							in, plane := g.C*g.H*g.W, out*g.OutH()*g.OutW()
							for n := range batch {
								want := naiveConv(w, x[n*in:(n+1)*in], out, g)
								for i, v := range want {
									v += float64(b[i/(g.OutH()*g.OutW())])
									if relu {
										v = max(v, 0)
									}
									if d := math.Abs(float64(got[n*plane+i]) - v); !(d <= 1e-5*(1+math.Abs(v))*float64(g.C)) {
										t.Fatalf("%s %+v out %d batch %d relu %v: y[%d,%d]=%v, want %v", be, g, out, batch, relu, n, i, got[n*plane+i], v)
									}
								}
							}
						}
					}
				}
			}
		})
	}
}

// dot is Σ a·b in float64.
func dot(a, b []float32) float64 {
	var s float64
	for i := range a {
		s += float64(a[i]) * float64(b[i])
	}
	return s
}

// checkAdjoint checks ⟨F x, y⟩ = ⟨x, Fᵀ y⟩ for random x and y.
func checkAdjoint(t *testing.T, name string, nx, ny int, f, ft func(dst, src []float32), r *rand.Rand) {
	t.Helper()
	x, y := randSlice(r, nx), randSlice(r, ny)
	fx := make([]float32, ny)
	f(fx, x)
	fty := randSlice(r, nx) // the adjoints accumulate: start from noise and subtract it
	base := append([]float32(nil), fty...)
	ft(fty, y)
	for i := range fty {
		fty[i] -= base[i]
	}
	a, b := dot(fx, y), dot(x, fty)
	if math.Abs(a-b) > 1e-4*(1+math.Abs(a)) {
		t.Fatalf("%s: ⟨F x, y⟩ = %v but ⟨x, Fᵀ y⟩ = %v", name, a, b)
	}
}

// TestWinogradAdjoints: each backward kernel is the exact transpose of its
// forward kernel, so the layer's gradients are those of its forward pass.
func TestWinogradAdjoints(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	for _, g := range winogradGeoms() {
		const out, batch = 3, 2
		th, tw := g.WinogradTiles()
		P := batch * th * tw
		name := fmt.Sprintf("%+v", g)
		checkAdjoint(t, "filter "+name, out*g.C*9, 16*out*g.C,
			func(u, w []float32) { WinogradFilter(u, w, out, g.C) },
			func(dw, du []float32) { WinogradFilterGrad(dw, du, out, g.C) }, r)
		// exact point strides: every value of the transformed tensor is used
		checkAdjoint(t, "input "+name, batch*g.C*g.H*g.W, 16*g.C*P,
			func(v, x []float32) { WinogradInput(v, g.C*P, x, g, batch) },
			func(dx, dv []float32) { WinogradInputGrad(dx, dv, g.C*P, g, batch) }, r)
		ny := batch * out * g.OutH() * g.OutW()
		// the output transform overwrites: its adjoint is checked with a
		// zero start by wrapping it
		checkAdjoint(t, "output "+name, 16*out*P, ny,
			func(y, m []float32) { WinogradOutput(y, make([]float32, 4*out*P), m, out*P, nil, g, out, batch, false) },
			func(dm, dy []float32) {
				tmp := make([]float32, len(dm))
				WinogradOutputGrad(tmp, make([]float32, 4*out*P), out*P, dy, g, out, batch)
				for i := range dm {
					dm[i] += tmp[i]
				}
			}, r)
	}
}

func BenchmarkWinograd(b *testing.B) {
	g := ConvGeom{C: 32, H: 26, W: 26, KH: 3, KW: 3, StrideH: 1, StrideW: 1}
	const out, batch = 64, 2 // one block of the cnn's batch; ×32 for a batch of 64
	th, tw := g.WinogradTiles()
	P := batch * th * tw
	r := rand.New(rand.NewPCG(1, 1))
	x := randSlice(r, batch*g.C*g.H*g.W)
	sv, sm := WinogradStride(g.C*P), WinogradStride(out*P)
	v := make([]float32, 16*sv)
	m := randSlice(r, 16*sm)
	y := make([]float32, batch*out*g.OutH()*g.OutW())
	tmp := make([]float32, 4*out*P)
	b.Run("input", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			WinogradInput(v, sv, x, g, batch)
		}
	})
	b.Run("input-go", func(b *testing.B) {
		defer func(v bool) { winoSIMD = v }(winoSIMD)
		winoSIMD = false
		for b.Loop() {
			WinogradInput(v, sv, x, g, batch)
		}
	})
	b.Run("inputgrad", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			WinogradInputGrad(x, v, sv, g, batch)
		}
	})
	b.Run("inputgrad-go", func(b *testing.B) {
		defer func(v bool) { winoSIMD = v }(winoSIMD)
		winoSIMD = false
		for b.Loop() {
			WinogradInputGrad(x, v, sv, g, batch)
		}
	})
	yp := make([]float32, out*P)
	arg := make([]uint8, out*P)
	bias := randSlice(r, out)
	for _, simd := range []bool{true, false} {
		sfx := ""
		if !simd {
			sfx = "-go"
		}
		run := func(name string, f func()) {
			b.Run(name+sfx, func(b *testing.B) {
				defer func(v bool) { winoSIMD = v }(winoSIMD)
				winoSIMD = winoSIMD && simd
				b.ReportAllocs()
				for b.Loop() {
					f()
				}
			})
		}
		run("output", func() { WinogradOutput(y, tmp, m, sm, nil, g, out, batch, false) })
		run("outputgrad", func() { WinogradOutputGrad(m, tmp, sm, y, g, out, batch) })
		run("outputpool", func() { WinogradOutputPool(yp, arg, tmp, m, sm, bias, g, out, batch, true) })
		run("outputpoolgrad", func() { WinogradOutputPoolGrad(m, tmp, sm, yp, arg, yp, bias, g, out, batch) })
	}
}

// TestWinogradOutputPool checks the fused output transform and 2×2 max
// pool against the full output transform in the same arithmetic
// (WinogradOutput's GEMM, or outputTile where the pool takes the vector
// kernel) followed by a reference pool, bit for bit, ties (tiles of m all
// 0) and NaNs included,
// and its gradient against WinogradOutputGrad of the scattered pool
// gradient.
func TestWinogradOutputPool(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	nan := float32(math.NaN())
	for _, be := range backends(t) {
		withBackend(t, be, func() {
			tested := 0
			for _, g := range winogradGeoms() {
				if !g.WinogradPoolOK() {
					continue
				}
				tested++
				for _, out := range []int{1, 3} {
					for _, batch := range []int{1, 2} {
						th, tw := g.WinogradTiles()
						pn := th * tw
						P := batch * pn
						op := out * P
						s := WinogradStride(op)
						m := randSlice(r, 16*s)
						for i := 0; i < op; i += 3 { // ties: every point of the tile 0
							for xi := range 16 {
								m[xi*s+i] = 0
							}
						}
						if op > 4 {
							m[5*s+4] = nan
						}
						b := randSlice(r, out)
						tmp := make([]float32, 4*op)
						for _, relu := range []bool{false, true} {
							// the full output in the pool's own arithmetic: the
							// vector kernels' (outputTile) or the GEMM path's
							full := make([]float32, batch*out*g.OutH()*g.OutW())
							if winoPoolVec(pn) {
								refOutput(full, m, s, b, g, out, batch, false)
							} else {
								WinogradOutput(full, tmp, m, s, b, g, out, batch, false)
							}
							y := make([]float32, op)
							arg := make([]uint8, op)
							WinogradOutputPool(y, arg, tmp, m, s, b, g, out, batch, relu)
							ow := g.OutW()
							for q := range batch * out {
								img := full[q*g.OutH()*ow:]
								for ty := range th {
									for tx := range tw {
										k := q*pn + ty*tw + tx
										a0, a1 := img[2*ty*ow+2*tx], img[2*ty*ow+2*tx+1]
										b0, b1 := img[(2*ty+1)*ow+2*tx], img[(2*ty+1)*ow+2*tx+1]
										mx, w := refPoolWindow(a0, a1, b0, b1, relu)
										if math.Float32bits(y[k]) != math.Float32bits(mx) || arg[k] != w {
											t.Fatalf("%s %+v out %d batch %d relu %v: y[%d]=%v arg %d, want %v arg %d", be, g, out, batch, relu, k, y[k], arg[k], mx, w)
										}
									}
								}
							}
							// gradient: the pooled dy scattered to its argmax, then WinogradOutputGrad
							dy := randSlice(r, op)
							dfull := make([]float32, len(full))
							for q := range batch * out {
								for ty := range th {
									for tx := range tw {
										k := q*pn + ty*tw + tx
										a := arg[k]
										dfull[q*g.OutH()*ow+(2*ty+int(a>>1))*ow+2*tx+int(a&1)] = dy[k]
									}
								}
							}
							want := randSlice(r, 16*s)
							got := append([]float32(nil), want...)
							WinogradOutputGrad(want, tmp, s, dfull, g, out, batch)
							WinogradOutputPoolGrad(got, tmp, s, dy, arg, nil, nil, g, out, batch)
							for i := range want {
								// the same values; a zero's sign may differ where
								// one of them is a GEMM (WinogradOutputGrad on
								// rows of under 8 tiles)
								if got[i] != want[i] {
									t.Fatalf("%s %+v out %d batch %d: dm[%d]=%v, want %v", be, g, out, batch, i, got[i], want[i])
								}
							}
						}
					}
				}
			}
			if tested < 4 {
				t.Fatalf("only %d geometries with even outputs", tested)
			}
		})
	}
}

// TestWinogradInputSIMD: the vector kernels give the Go code's values,
// bit for bit in the forward transform (the naive and adjoint tests above
// run with them on).
func TestWinogradInputSIMD(t *testing.T) {
	if !winoSIMD {
		t.Skip("no vector kernels on this machine")
	}
	defer func() { winoSIMD = true }()
	r := rand.New(rand.NewPCG(6, 6))
	vectors := 0
	for _, g := range winogradGeoms() {
		if lo, hi := winoVectorTiles(g); hi > lo {
			vectors++
		}
		const batch = 2
		th, tw := g.WinogradTiles()
		P := batch * th * tw
		s := WinogradStride(g.C * P)
		x := randSlice(r, batch*g.C*g.H*g.W)
		want, got := randSlice(r, 16*s), randSlice(r, 16*s)
		copy(got, want)
		winoSIMD = false
		WinogradInput(want, s, x, g, batch)
		winoSIMD = true
		WinogradInput(got, s, x, g, batch)
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%+v: input v[%d] = %v, Go code %v", g, i, got[i], want[i])
			}
		}
		// the adjoint: the same values (a zero's sign may differ)
		dv := randSlice(r, 16*s)
		dxWant := randSlice(r, len(x))
		dxGot := slices.Clone(dxWant)
		winoSIMD = false
		WinogradInputGrad(dxWant, dv, s, g, batch)
		winoSIMD = true
		WinogradInputGrad(dxGot, dv, s, g, batch)
		for i := range dxWant {
			if dxGot[i] != dxWant[i] {
				t.Fatalf("%+v: input gradient dx[%d] = %v, Go code %v", g, i, dxGot[i], dxWant[i])
			}
		}
	}
	if vectors < 4 {
		t.Fatalf("only %d geometries reach the vector kernels", vectors)
	}
}

// refOutput is WinogradOutput tile by tile with outputTile: the vector
// kernels' arithmetic.
func refOutput(y, m []float32, s int, bias []float32, g ConvGeom, out, batch int, relu bool) {
	th, tw := g.WinogradTiles()
	oh, ow := g.OutH(), g.OutW()
	pn := th * tw
	for n := range batch {
		for o := range out {
			img := y[(n*out+o)*oh*ow:]
			for ty := range th {
				for tx := range tw {
					t := [4]float32{}
					t[0], t[1], t[2], t[3] = outputTile(m[o*batch*pn+n*pn+ty*tw+tx:], s)
					for k, v := range t {
						v += bias[o]
						if relu {
							v = max(v, 0)
						}
						if yy, xx := 2*ty+k/2, 2*tx+k%2; yy < oh && xx < ow {
							img[yy*ow+xx] = v
						}
					}
				}
			}
		}
	}
}

// refOutputGrad is WinogradOutputGrad tile by tile with outputGradTile.
func refOutputGrad(dm []float32, s int, dy []float32, g ConvGeom, out, batch int) {
	th, tw := g.WinogradTiles()
	oh, ow := g.OutH(), g.OutW()
	pn := th * tw
	for n := range batch {
		for o := range out {
			img := dy[(n*out+o)*oh*ow:]
			for ty := range th {
				for tx := range tw {
					var t [4]float32
					for k := range t {
						if yy, xx := 2*ty+k/2, 2*tx+k%2; yy < oh && xx < ow {
							t[k] = img[yy*ow+xx]
						}
					}
					outputGradTile(dm[o*batch*pn+n*pn+ty*tw+tx:], s, t[0], t[1], t[2], t[3])
				}
			}
		}
	}
}

// refPool is WinogradOutputPool's pool over a full output y: each tile's
// maximum (Go's max, NaNs propagating) and its position.
func refPool(y []float32, g ConvGeom, out, batch int, relu bool) ([]float32, []uint8) {
	th, tw := g.WinogradTiles()
	ow := g.OutW()
	var p []float32
	var arg []uint8
	for q := range batch * out {
		img := y[q*g.OutH()*ow:]
		for ty := range th {
			for tx := range tw {
				a0, a1 := img[2*ty*ow+2*tx], img[2*ty*ow+2*tx+1]
				b0, b1 := img[(2*ty+1)*ow+2*tx], img[(2*ty+1)*ow+2*tx+1]
				mx, w := refPoolWindow(a0, a1, b0, b1, relu)
				p, arg = append(p, mx), append(arg, w)
			}
		}
	}
	return p, arg
}

// withSIMD runs f with the vector kernels on (where the machine has them)
// or off.
func withSIMD(on bool, f func()) {
	defer func(v bool) { winoSIMD = v }(winoSIMD)
	winoSIMD = winoSIMD && on
	f()
}

// sameBits reports whether a and b hold the same float32 bit patterns.
func sameBits(a, b []float32) int {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// near reports the first index where a and b differ by more than a few
// ulps of values ~1 (NaNs equal).
func near(a, b []float32) int {
	for i := range a {
		x, y := float64(a[i]), float64(b[i])
		if math.IsNaN(x) && math.IsNaN(y) {
			continue
		}
		if !(math.Abs(x-y) <= 1e-6*(1+math.Abs(x))) {
			return i
		}
	}
	return -1
}

// TestWinogradOutputSIMD: the output-side vector kernels give the values
// of the Go code in the same order (outputTile, outputGradTile and Go's
// max) bit for bit, and those of the GEMM path (their fallback) within a
// few ulps, with the same pool positions; ties, NaNs and signed zeros
// included.
func TestWinogradOutputSIMD(t *testing.T) {
	if !winoSIMD {
		t.Skip("no vector kernels on this machine")
	}
	w := func(c, h, wd, pad int) ConvGeom {
		return ConvGeom{C: c, H: h, W: wd, KH: 3, KW: 3, StrideH: 1, StrideW: 1, PadH: pad, PadW: pad}
	}
	geoms := append(winogradGeoms(), w(2, 18, 18, 0), w(1, 6, 40, 2), w(2, 9, 35, 1), w(1, 7, 9, 1), w(64, 16, 16, 1))
	negZero := float32(math.Copysign(0, -1))
	nan := float32(math.NaN())
	r := rand.New(rand.NewPCG(7, 7))
	plain, pooled := 0, 0
	for _, g := range geoms {
		th, tw := g.WinogradTiles()
		pn := th * tw
		for _, out := range []int{1, 3} {
			for _, batch := range []int{1, 2} {
				name := fmt.Sprintf("%+v out %d batch %d", g, out, batch)
				P := batch * pn
				op := out * P
				s := WinogradStride(op)
				m := randSlice(r, 16*s)
				for i := 0; i < op; i += 5 { // ties: tiles of +0 or −0
					for xi := range 16 {
						m[xi*s+i] = 0
						if i%2 == 1 {
							m[xi*s+i] = negZero
						}
					}
				}
				if op > 9 {
					m[5*s+9] = nan
				}
				bias := randSlice(r, out)
				bias[0] = negZero
				tmp := make([]float32, 4*op)
				ny := batch * out * g.OutH() * g.OutW()
				dy := randSlice(r, ny)
				if winoOutputVec(g) {
					plain++
				}
				for _, relu := range []bool{false, true} {
					var yVec, yGo, yRef = make([]float32, ny), make([]float32, ny), make([]float32, ny)
					WinogradOutput(yVec, tmp, m, s, bias, g, out, batch, relu)
					withSIMD(false, func() { WinogradOutput(yGo, tmp, m, s, bias, g, out, batch, relu) })
					refOutput(yRef, m, s, bias, g, out, batch, relu)
					if winoOutputVec(g) {
						if i := sameBits(yVec, yRef); i >= 0 {
							t.Fatalf("%s relu %v: y[%d] = %v, Go code %v", name, relu, i, yVec[i], yRef[i])
						}
					}
					if i := near(yVec, yGo); i >= 0 {
						t.Fatalf("%s relu %v: y[%d] = %v, GEMM path %v", name, relu, i, yVec[i], yGo[i])
					}
				}
				dmVec, dmGo, dmRef := randSlice(r, 16*s), randSlice(r, 16*s), randSlice(r, 16*s)
				copy(dmGo, dmVec)
				copy(dmRef, dmVec) // the padding between point matrices must stay
				WinogradOutputGrad(dmVec, tmp, s, dy, g, out, batch)
				withSIMD(false, func() { WinogradOutputGrad(dmGo, tmp, s, dy, g, out, batch) })
				refOutputGrad(dmRef, s, dy, g, out, batch)
				if winoOutputVec(g) {
					if i := sameBits(dmVec, dmRef); i >= 0 {
						t.Fatalf("%s: dm[%d] = %v, Go code %v", name, i, dmVec[i], dmRef[i])
					}
				}
				if i := near(dmVec, dmGo); i >= 0 {
					t.Fatalf("%s: dm[%d] = %v, GEMM path %v", name, i, dmVec[i], dmGo[i])
				}

				if !g.WinogradPoolOK() {
					continue
				}
				if winoPoolVec(pn) {
					pooled++
				}
				for _, relu := range []bool{false, true} {
					yVec, yGo := make([]float32, op), make([]float32, op)
					argVec, argGo := make([]uint8, op), make([]uint8, op)
					WinogradOutputPool(yVec, argVec, tmp, m, s, bias, g, out, batch, relu)
					withSIMD(false, func() { WinogradOutputPool(yGo, argGo, tmp, m, s, bias, g, out, batch, relu) })
					full := make([]float32, ny)
					refOutput(full, m, s, bias, g, out, batch, false)
					yRef, argRef := refPool(full, g, out, batch, relu)
					if winoPoolVec(pn) {
						if i := sameBits(yVec, yRef); i >= 0 || !slices.Equal(argVec, argRef) {
							i = max(i, 0)
							t.Fatalf("%s relu %v: pooled y[%d] = %v arg %d, Go code %v arg %d", name, relu, i, yVec[i], argVec[i], yRef[i], argRef[i])
						}
					}
					if i := near(yVec, yGo); i >= 0 || !slices.Equal(argVec, argGo) {
						i = max(i, 0)
						t.Fatalf("%s relu %v: pooled y[%d] = %v arg %d, GEMM path %v arg %d", name, relu, i, yVec[i], argVec[i], yGo[i], argGo[i])
					}
					dp := randSlice(r, op)
					dfull := make([]float32, ny)
					ow := g.OutW()
					for q := range batch * out {
						for k := range pn {
							a := argVec[q*pn+k]
							dfull[q*g.OutH()*ow+(2*(k/tw)+int(a>>1))*ow+2*(k%tw)+int(a&1)] = dp[q*pn+k]
						}
					}
					dmVec, dmGo, dmRef := randSlice(r, 16*s), randSlice(r, 16*s), randSlice(r, 16*s)
					copy(dmGo, dmVec)
					copy(dmRef, dmVec)
					WinogradOutputPoolGrad(dmVec, tmp, s, dp, argVec, nil, nil, g, out, batch)
					withSIMD(false, func() { WinogradOutputPoolGrad(dmGo, tmp, s, dp, argVec, nil, nil, g, out, batch) })
					refOutputGrad(dmRef, s, dfull, g, out, batch)
					if winoPoolVec(pn) {
						if i := sameBits(dmVec, dmRef); i >= 0 {
							t.Fatalf("%s: pooled dm[%d] = %v, Go code %v", name, i, dmVec[i], dmRef[i])
						}
					}
					for i := range dmVec {
						if dmVec[i] != dmGo[i] {
							t.Fatalf("%s: pooled dm[%d] = %v, GEMM path %v", name, i, dmVec[i], dmGo[i])
						}
					}

					// with the ReLU's gate and the bias gradient: the gated dy
					// through the plain call, and sum32's sums, bit for bit
					gate := slices.Clone(yVec)
					for i, v := range []float32{negZero, 0, nan, float32(math.Inf(1)), float32(math.Inf(-1)), -1, 2} {
						if j := 3*i + 1; j < len(gate) {
							gate[j] = v
						}
					}
					dg := slices.Clone(dp)
					for i := range dg {
						if b := int32(math.Float32bits(gate[i])); -b >= 0 { // +0 or negative; −0 passes
							dg[i] = 0
						}
					}
					dbWant := randSlice(r, out)
					dbVec, dbGo := slices.Clone(dbWant), slices.Clone(dbWant)
					for q := range batch * out {
						dbWant[q%out] += sum32(dg[q*pn : (q+1)*pn])
					}
					copy(dmRef, dmVec)
					copy(dmGo, dmVec)
					WinogradOutputPoolGrad(dmRef, tmp, s, dg, argVec, nil, nil, g, out, batch)
					WinogradOutputPoolGrad(dmVec, tmp, s, dp, argVec, gate, dbVec, g, out, batch)
					withSIMD(false, func() { WinogradOutputPoolGrad(dmGo, tmp, s, dp, argVec, gate, dbGo, g, out, batch) })
					if i := sameBits(dmVec, dmRef); i >= 0 {
						t.Fatalf("%s: gated pooled dm[%d] = %v, want %v", name, i, dmVec[i], dmRef[i])
					}
					if i := sameBits(dbVec, dbWant); i >= 0 {
						t.Fatalf("%s: db[%d] = %v, want %v", name, i, dbVec[i], dbWant[i])
					}
					if i := sameBits(dbGo, dbWant); i >= 0 {
						t.Fatalf("%s: GEMM path db[%d] = %v, want %v", name, i, dbGo[i], dbWant[i])
					}
					for i := range dmVec {
						if dmVec[i] != dmGo[i] {
							t.Fatalf("%s: gated pooled dm[%d] = %v, GEMM path %v", name, i, dmVec[i], dmGo[i])
						}
					}
				}
			}
		}
	}
	if plain < 16 || pooled < 16 {
		t.Fatalf("only %d plain and %d pooled cases reach the vector kernels", plain, pooled)
	}
}

// sum32 is the models' sum: four interleaved partial sums.
func sum32(s []float32) float32 {
	var a0, a1, a2, a3 float32
	i := 0
	for ; i+4 <= len(s); i += 4 {
		a0 += s[i]
		a1 += s[i+1]
		a2 += s[i+2]
		a3 += s[i+3]
	}
	for ; i < len(s); i++ {
		a0 += s[i]
	}
	return (a0 + a1) + (a2 + a3)
}

// TestWinogradTransposeV: the transposes of the 16 point matrices, with
// and without the vector kernel (8×8 blocks plus the rows and columns past
// them), leaving the padding between point matrices alone.
func TestWinogradTransposeV(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 8))
	for _, cp := range [][2]int{{1, 1}, {3, 5}, {8, 8}, {32, 288}, {9, 17}, {16, 7}, {7, 16}, {24, 100}, {32, 1024}} {
		c, p := cp[0], cp[1]
		s, st := WinogradStride(c*p), WinogradStride(c*p)+3
		v := randSlice(r, 16*s)
		for _, simd := range []bool{true, false} {
			vt := randSlice(r, 16*st)
			want := slices.Clone(vt)
			for xi := range 16 {
				for i := range c {
					for j := range p {
						want[xi*st+j*c+i] = v[xi*s+i*p+j]
					}
				}
			}
			withSIMD(simd, func() { WinogradTransposeV(vt, st, v, s, c, p) })
			if i := sameBits(vt, want); i >= 0 {
				t.Fatalf("c %d p %d simd %v: vt[%d] = %v, want %v", c, p, simd, i, vt[i], want[i])
			}
		}
	}
}

// refPoolWindow is the reference 2×2 max-pool of one window (a0 a1 in the
// top row, b0 b1 below): the NaN-propagating maximum, the position of the
// first element equal to it in row-major order (the pooled transforms'
// arg), and the ReLU applied after the choice when relu is set.
func refPoolWindow(a0, a1, b0, b1 float32, relu bool) (float32, uint8) {
	mx := max(max(a0, a1), max(b0, b1))
	w := uint8(3)
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
	return mx, w
}

// TestWinogradTransposeVN: the transposes of 36 point matrices.
func TestWinogradTransposeVN(t *testing.T) {
	r := rand.New(rand.NewPCG(16, 16))
	for _, cp := range [][2]int{{1, 1}, {3, 5}, {32, 288}, {9, 17}} {
		c, p := cp[0], cp[1]
		s, st := WinogradStride(c*p), WinogradStride(c*p)+3
		v := randSlice(r, 36*s)
		for _, simd := range []bool{true, false} {
			vt := randSlice(r, 36*st)
			want := slices.Clone(vt)
			for xi := range 36 {
				for i := range c {
					for j := range p {
						want[xi*st+j*c+i] = v[xi*s+i*p+j]
					}
				}
			}
			withSIMD(simd, func() { WinogradTransposeVN(vt, st, v, s, c, p, 36) })
			if i := sameBits(vt, want); i >= 0 {
				t.Fatalf("c %d p %d simd %v: vt[%d] = %v, want %v", c, p, simd, i, vt[i], want[i])
			}
		}
	}
}

// TestWinogradInputPaddedStrips: the zero-padded strips that carry every
// tile touching padding give edgePatch's transform bit for bit, and
// addEdgePatch's input gradient within a few ulps (each position's
// contributions are summed in the strip first), with the vector kernels
// on and off, on the boundary geometries and resnet8's (28×28, 14×14 and
// 7×7 with padding 1; 32×32, 16×16, 8×8).
func TestWinogradInputPaddedStrips(t *testing.T) {
	w := func(c, h, wd, pad int) ConvGeom {
		return ConvGeom{C: c, H: h, W: wd, KH: 3, KW: 3, StrideH: 1, StrideW: 1, PadH: pad, PadW: pad}
	}
	geoms := append(winogradGeoms(), w(2, 28, 28, 1), w(3, 14, 14, 1), w(2, 7, 7, 1), w(2, 32, 32, 1),
		w(1, 16, 16, 1), w(3, 8, 8, 1), w(1, 15, 17, 1), w(1, 2, 2, 1))
	r := rand.New(rand.NewPCG(12, 12))
	for _, simd := range []bool{false, true} {
		withSIMD(simd, func() {
			for _, g := range geoms {
				const batch = 3
				th, tw := g.WinogradTiles()
				pn := th * tw
				P := batch * pn
				s := WinogradStride(g.C * P)
				plane := g.H * g.W
				x := randSlice(r, batch*g.C*plane)
				want, got := make([]float32, 16*s), make([]float32, 16*s)
				dv := randSlice(r, 16*s)
				dxWant := randSlice(r, len(x))
				dxGot := slices.Clone(dxWant)
				for n := range batch {
					for c := range g.C {
						for ty := range th {
							for tx := range tw {
								o := c*P + n*pn + ty*tw + tx
								img := x[(n*g.C+c)*plane : (n*g.C+c+1)*plane]
								d := g.edgePatch(img, 2*ty-g.PadH, 2*tx-g.PadW)
								inputTransform(want[o:o+15*s+1], s, &d)
								e := inputTransformT(dv[o:o+15*s+1], s)
								g.addEdgePatch(dxWant[(n*g.C+c)*plane:(n*g.C+c+1)*plane], 2*ty-g.PadH, 2*tx-g.PadW, &e)
							}
						}
					}
				}
				WinogradInput(got, s, x, g, batch)
				if i := sameBits(got, want); i >= 0 {
					t.Fatalf("simd %v %+v: v[%d] = %v, per tile %v", simd, g, i, got[i], want[i])
				}
				WinogradInputGrad(dxGot, dv, s, g, batch)
				for i := range dxWant {
					if d := math.Abs(float64(dxGot[i] - dxWant[i])); d > 1e-5*(1+math.Abs(float64(dxWant[i]))) {
						t.Fatalf("simd %v %+v: dx[%d] = %v, per tile %v", simd, g, i, dxGot[i], dxWant[i])
					}
				}
			}
		})
	}
}
