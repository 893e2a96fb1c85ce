//go:build winograd4

package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// winograd4Geoms adds to winogradGeoms output sizes around multiples of 4
// (whole and partial 4×4 tiles), with and without padding.
func winograd4Geoms() []ConvGeom {
	w := func(c, h, wd, pad int) ConvGeom {
		return ConvGeom{C: c, H: h, W: wd, KH: 3, KW: 3, StrideH: 1, StrideW: 1, PadH: pad, PadW: pad}
	}
	return append(winogradGeoms(), w(3, 6, 6, 0), w(5, 10, 14, 0), w(3, 8, 8, 1), w(7, 9, 11, 1), w(2, 12, 12, 0),
		ConvGeom{C: 3, H: 6, W: 10, KH: 3, KW: 3, StrideH: 1, StrideW: 1, PadH: 0, PadW: 1})
}

// winograd4Conv is the forward pass with F(4×4, 3×3): filter and input
// transforms, 36 GEMMs, output transform.
func winograd4Conv(w, b, x []float32, out, batch int, g ConvGeom, relu bool) []float32 {
	th, tw := g.Winograd4Tiles()
	P := batch * th * tw
	u := make([]float32, 36*out*g.C)
	sv, sm := WinogradStride(g.C*P), WinogradStride(out*P)
	v := make([]float32, 36*sv)
	m := make([]float32, 36*sm)
	Winograd4Filter(u, w, out, g.C)
	Winograd4Input(v, sv, x, g, batch)
	for xi := range 36 {
		Gemm(false, false, out, P, g.C, 1, u[xi*out*g.C:], g.C, v[xi*sv:], P, 0, m[xi*sm:], P)
	}
	y := make([]float32, batch*out*g.OutH()*g.OutW())
	for i := range y {
		y[i] = float32(math.NaN()) // every element must be written
	}
	Winograd4Output(y, m, sm, b, g, out, batch, relu)
	return y
}

func TestWinograd4MatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 13))
	for _, be := range backends(t) {
		withBackend(t, be, func() {
			var worst float64
			for _, g := range winograd4Geoms() {
				for _, out := range []int{1, 3} {
					for _, batch := range []int{1, 2} {
						w := randSlice(r, out*g.C*9)
						b := randSlice(r, out)
						x := randSlice(r, batch*g.C*g.H*g.W)
						for _, relu := range []bool{false, true} {
							got := winograd4Conv(w, b, x, out, batch, g, relu)
							in, plane := g.C*g.H*g.W, out*g.OutH()*g.OutW()
							for n := range batch {
								want := naiveConv(w, x[n*in:(n+1)*in], out, g)
								for i, v := range want {
									v += float64(b[i/(g.OutH()*g.OutW())])
									if relu {
										v = max(v, 0)
									}
									d := math.Abs(float64(got[n*plane+i]) - v)
									worst = max(worst, d/(1+math.Abs(v))/float64(g.C))
									if !(d <= 1e-4*(1+math.Abs(v))*float64(g.C)) { // F(4×4, 3×3) loses about 10× more than F(2×2, 3×3)
										t.Fatalf("%s %+v out %d batch %d relu %v: y[%d,%d]=%v, want %v", be, g, out, batch, relu, n, i, got[n*plane+i], v)
									}
								}
							}
						}
					}
				}
			}
			t.Logf("%s: worst |error| / (1+|y|) / C = %.2g", be, worst)
		})
	}
}

// TestWinograd4Adjoints: each backward transform is the exact transpose
// of its forward transform.
func TestWinograd4Adjoints(t *testing.T) {
	r := rand.New(rand.NewPCG(14, 14))
	for _, g := range winograd4Geoms() {
		const out, batch = 3, 2
		th, tw := g.Winograd4Tiles()
		P := batch * th * tw
		name := fmt.Sprintf("%+v", g)
		checkAdjoint(t, "filter "+name, out*g.C*9, 36*out*g.C,
			func(u, w []float32) { Winograd4Filter(u, w, out, g.C) },
			func(dw, du []float32) { Winograd4FilterGrad(dw, du, out, g.C) }, r)
		checkAdjoint(t, "input "+name, batch*g.C*g.H*g.W, 36*g.C*P,
			func(v, x []float32) { Winograd4Input(v, g.C*P, x, g, batch) },
			func(dx, dv []float32) { Winograd4InputGrad(dx, dv, g.C*P, g, batch) }, r)
		ny := batch * out * g.OutH() * g.OutW()
		checkAdjoint(t, "output "+name, 36*out*P, ny,
			func(y, m []float32) { Winograd4Output(y, m, out*P, nil, g, out, batch, false) },
			func(dm, dy []float32) {
				tmp := make([]float32, len(dm))
				Winograd4OutputGrad(tmp, out*P, dy, g, out, batch)
				for i := range dm {
					dm[i] += tmp[i]
				}
			}, r)
	}
}

// TestWinograd4OutputPool checks the fused output transform and 2×2 max
// pool against Winograd4Output followed by a reference pool, bit for bit,
// ties and NaNs included, and its gradient (with and without the ReLU
// gate and the bias gradient) against Winograd4OutputGrad of the
// scattered pool gradient.
func TestWinograd4OutputPool(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 15))
	nan := float32(math.NaN())
	tested := 0
	for _, g := range winograd4Geoms() {
		if !g.Winograd4PoolOK() {
			continue
		}
		tested++
		oh, ow := g.OutH(), g.OutW()
		ph, pw := oh/2, ow/2
		for _, out := range []int{1, 3} {
			for _, batch := range []int{1, 2} {
				th, tw := g.Winograd4Tiles()
				P := batch * th * tw
				op := out * P
				s := WinogradStride(op) + 5
				m := randSlice(r, 36*s)
				for i := 0; i < op; i += 3 { // ties: every point of the tile 0
					for xi := range 36 {
						m[xi*s+i] = 0
					}
				}
				if op > 4 {
					m[7*s+4] = nan
				}
				b := randSlice(r, out)
				for _, relu := range []bool{false, true} {
					full := make([]float32, batch*out*oh*ow)
					Winograd4Output(full, m, s, b, g, out, batch, false)
					np := batch * out * ph * pw
					y := make([]float32, np)
					arg := make([]uint8, np)
					Winograd4OutputPool(y, arg, m, s, b, g, out, batch, relu)
					for q := range batch * out {
						img := full[q*oh*ow:]
						for py := range ph {
							for px := range pw {
								k := q*ph*pw + py*pw + px
								a0, a1 := img[2*py*ow+2*px], img[2*py*ow+2*px+1]
								b0, b1 := img[(2*py+1)*ow+2*px], img[(2*py+1)*ow+2*px+1]
								mx, w := refPoolWindow(a0, a1, b0, b1, relu)
								if math.Float32bits(y[k]) != math.Float32bits(mx) || arg[k] != w {
									t.Fatalf("%+v out %d batch %d relu %v: y[%d]=%v arg %d, want %v arg %d", g, out, batch, relu, k, y[k], arg[k], mx, w)
								}
							}
						}
					}
					// gradient: the (gated) pooled dy scattered to its argmax,
					// then Winograd4OutputGrad
					dy := randSlice(r, np)
					var gate []float32
					if relu {
						gate = y
					}
					dfull := make([]float32, len(full))
					wantDB := randSlice(r, out)
					gotDB := slices.Clone(wantDB)
					for q := range batch * out {
						var a [4]float32
						for k := range ph * pw {
							d := poolGradTerm(dy[q*ph*pw:(q+1)*ph*pw], gateOf(gate, q, ph*pw), k, &a)
							py, px := k/pw, k%pw
							ak := arg[q*ph*pw+k]
							dfull[q*oh*ow+(2*py+int(ak>>1))*ow+2*px+int(ak&1)] = d
						}
						wantDB[q%out] += (a[0] + a[1]) + (a[2] + a[3])
					}
					want := randSlice(r, 36*s)
					got := slices.Clone(want)
					Winograd4OutputGrad(want, s, dfull, g, out, batch)
					Winograd4OutputPoolGrad(got, s, dy, arg, gate, gotDB, g, out, batch)
					if i := sameBits(got, want); i >= 0 {
						t.Fatalf("%+v out %d batch %d relu %v: dm[%d]=%v, want %v", g, out, batch, relu, i, got[i], want[i])
					}
					if i := sameBits(gotDB, wantDB); i >= 0 {
						t.Fatalf("%+v out %d batch %d relu %v: db[%d]=%v, want %v", g, out, batch, relu, i, gotDB[i], wantDB[i])
					}
				}
			}
		}
	}
	if tested < 6 {
		t.Fatalf("only %d geometries with even outputs", tested)
	}
}

// gateOf returns the q-th plane of n values of y, or nil when y is nil.
func gateOf(y []float32, q, n int) []float32 {
	if y == nil {
		return nil
	}
	return y[q*n : (q+1)*n]
}

// BenchmarkWinograd4 times the F(4×4, 3×3) transforms on one block of the
// cnn's conv2 (8 samples, 288 tiles; ×8 per batch of 64), and its 36
// GEMMs in each direction against F(2×2, 3×3)'s 16 on 2 samples (×32).
func BenchmarkWinograd4(b *testing.B) {
	g := ConvGeom{C: 32, H: 26, W: 26, KH: 3, KW: 3, StrideH: 1, StrideW: 1}
	const out, batch = 64, 8
	th, tw := g.Winograd4Tiles()
	P := batch * th * tw
	r := rand.New(rand.NewPCG(1, 1))
	x := randSlice(r, batch*g.C*g.H*g.W)
	sv, sm := WinogradStride(g.C*P), WinogradStride(out*P)
	v := randSlice(r, 36*sv)
	m := randSlice(r, 36*sm)
	u := randSlice(r, 36*out*g.C)
	y := make([]float32, batch*out*g.OutH()*g.OutW())
	yp := make([]float32, len(y)/4)
	arg := make([]uint8, len(yp))
	bias := randSlice(r, out)
	run := func(name string, f func()) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				f()
			}
		})
	}
	run("input", func() { Winograd4Input(v, sv, x, g, batch) })
	run("inputgrad", func() { Winograd4InputGrad(x, v, sv, g, batch) })
	run("output", func() { Winograd4Output(y, m, sm, bias, g, out, batch, false) })
	run("outputgrad", func() { Winograd4OutputGrad(m, sm, y, g, out, batch) })
	run("outputpool", func() { Winograd4OutputPool(yp, arg, m, sm, bias, g, out, batch, true) })
	run("outputpoolgrad", func() { Winograd4OutputPoolGrad(m, sm, yp, arg, yp, bias, g, out, batch) })
	run("gemm-fwd", func() {
		for xi := range 36 {
			Gemm(false, false, out, P, g.C, 1, u[xi*out*g.C:], g.C, v[xi*sv:], P, 0, m[xi*sm:], P)
		}
	})
	th2, tw2 := g.WinogradTiles()
	P2 := 2 * th2 * tw2
	sv2, sm2 := WinogradStride(g.C*P2), WinogradStride(out*P2)
	run("gemm-fwd-f2", func() {
		for xi := range 16 {
			Gemm(false, false, out, P2, g.C, 1, u[xi*out*g.C:], g.C, v[xi*sv2:], P2, 0, m[xi*sm2:], P2)
		}
	})
}

// TestWinograd4SIMD: the vector kernels give the Go code's values, bit
// for bit, in every transform (groups of 8 tiles inside the image, edge
// tiles and the last partial group in Go code).
func TestWinograd4SIMD(t *testing.T) {
	if !winoSIMD {
		t.Skip("no vector kernels on this machine")
	}
	r := rand.New(rand.NewPCG(17, 17))
	for _, g := range winograd4Geoms() {
		for _, batch := range []int{1, 3} {
			const out = 3
			th, tw := g.Winograd4Tiles()
			P := batch * th * tw
			sv, sm := WinogradStride(g.C*P)+1, WinogradStride(out*P)+2
			x := randSlice(r, batch*g.C*g.H*g.W)
			m := randSlice(r, 36*sm)
			dv := randSlice(r, 36*sv)
			dy := randSlice(r, batch*out*g.OutH()*g.OutW())
			b := randSlice(r, out)
			type result struct{ v, dx, y, dm []float32 }
			run := func(simd bool) (res result) {
				withSIMD(simd, func() {
					res.v = randSlice(rand.New(rand.NewPCG(1, 1)), 36*sv)
					Winograd4Input(res.v, sv, x, g, batch)
					res.dx = randSlice(rand.New(rand.NewPCG(2, 2)), len(x))
					Winograd4InputGrad(res.dx, dv, sv, g, batch)
					res.y = make([]float32, len(dy))
					Winograd4Output(res.y, m, sm, b, g, out, batch, true)
					res.dm = randSlice(rand.New(rand.NewPCG(3, 3)), 36*sm)
					Winograd4OutputGrad(res.dm, sm, dy, g, out, batch)
					if g.Winograd4PoolOK() {
						yp := make([]float32, len(dy)/4)
						arg := make([]uint8, len(yp))
						Winograd4OutputPool(yp, arg, m, sm, b, g, out, batch, true)
						res.y = append(res.y, yp...)
						for _, a := range arg {
							res.y = append(res.y, float32(a))
						}
						dm := make([]float32, 36*sm)
						Winograd4OutputPoolGrad(dm, sm, dy[:len(yp)], arg, yp, nil, g, out, batch)
						res.dm = append(res.dm, dm...)
					}
				})
				return res
			}
			got, want := run(true), run(false)
			for _, c := range []struct {
				name string
				a, b []float32
			}{{"input", got.v, want.v}, {"inputgrad", got.dx, want.dx}, {"output", got.y, want.y}, {"outputgrad", got.dm, want.dm}} {
				if i := sameBits(c.a, c.b); i >= 0 {
					t.Fatalf("%+v batch %d: %s[%d] = %v with the vector kernels, %v without", g, batch, c.name, i, c.a[i], c.b[i])
				}
			}
		}
	}
}
