package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// smallConvGeoms are stride-1 geometries for ConvSmall: the cnn's and
// lenet5's first layers, output widths of exactly 8, 9 (an overlapping
// last vector) and 16, odd sizes, padding, several channels, and tap
// counts below, at and above the 12 taps of one gradient pass.
func smallConvGeoms() []ConvGeom {
	g := func(c, h, w, kh, kw, ph, pw int) ConvGeom {
		return ConvGeom{C: c, H: h, W: w, KH: kh, KW: kw, StrideH: 1, StrideW: 1, PadH: ph, PadW: pw}
	}
	return []ConvGeom{
		g(1, 28, 28, 3, 3, 0, 0), g(1, 28, 28, 5, 5, 2, 2), g(1, 10, 10, 3, 3, 0, 0), g(1, 3, 11, 3, 3, 0, 0),
		g(1, 5, 9, 1, 1, 0, 0), g(2, 7, 13, 3, 3, 1, 1), g(3, 9, 17, 3, 3, 1, 0), g(1, 6, 12, 2, 5, 0, 2),
		g(3, 11, 15, 5, 5, 2, 2), g(4, 5, 10, 1, 3, 0, 1), g(1, 1, 8, 1, 1, 0, 0), g(2, 4, 10, 2, 3, 1, 0),
	}
}

// naiveConvGrad returns y = conv(x)+b (max(0,·) if relu) and, for dy, the
// weight and bias gradients (dy gated by y > 0 if relu), in float64.
func naiveConvGrad(w, b, x, dy []float32, f, batch int, g ConvGeom, relu bool) (y, dw, db []float64) {
	oh, ow := g.OutH(), g.OutW()
	k := g.ColRows()
	y = make([]float64, batch*f*oh*ow)
	dw = make([]float64, f*k)
	db = make([]float64, f)
	for n := range batch {
		for fi := range f {
			for i := range oh {
				for j := range ow {
					s := 0.0
					if b != nil {
						s = float64(b[fi])
					}
					for c := range g.C {
						for ki := range g.KH {
							for kj := range g.KW {
								ih, iw := i-g.PadH+ki, j-g.PadW+kj
								if ih < 0 || ih >= g.H || iw < 0 || iw >= g.W {
									continue
								}
								s += float64(w[((fi*g.C+c)*g.KH+ki)*g.KW+kj]) * float64(x[((n*g.C+c)*g.H+ih)*g.W+iw])
							}
						}
					}
					if relu {
						s = max(s, 0)
					}
					o := ((n*f+fi)*oh+i)*ow + j
					y[o] = s
					d := float64(dy[o])
					if relu && float32(s) <= 0 {
						d = 0
					}
					db[fi] += d
					for c := range g.C {
						for ki := range g.KH {
							for kj := range g.KW {
								ih, iw := i-g.PadH+ki, j-g.PadW+kj
								if ih < 0 || ih >= g.H || iw < 0 || iw >= g.W {
									continue
								}
								dw[((fi*g.C+c)*g.KH+ki)*g.KW+kj] += d * float64(x[((n*g.C+c)*g.H+ih)*g.W+iw])
							}
						}
					}
				}
			}
		}
	}
	return y, dw, db
}

func closeTo(got float32, want, scale float64) bool {
	return math.Abs(float64(got)-want) <= 1e-5*scale
}

// TestConvSmallMatchesNaive checks Forward and Grad, with the assembly
// kernels and with the Go code, against the float64 definition.
func TestConvSmallMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	for _, asm := range []bool{true, false} {
		if asm && !convSmallSIMD {
			continue
		}
		for _, g := range smallConvGeoms() {
			for _, f := range []int{1, 6, 8, 13, 32} {
				for _, batch := range []int{1, 3} {
					for _, relu := range []bool{false, true} {
						name := fmt.Sprintf("asm=%v/%+v/f%d/b%d/relu=%v", asm, g, f, batch, relu)
						func() {
							defer func(v bool) { convSmallAsm = v }(convSmallAsm)
							convSmallAsm = asm
							testConvSmall(t, r, name, g, f, batch, relu)
						}()
					}
				}
			}
		}
	}
}

func testConvSmall(t *testing.T, r *rand.Rand, name string, g ConvGeom, f, batch int, relu bool) {
	t.Helper()
	k := g.ColRows()
	w := randSlice(r, f*k)
	var b []float32
	if f%2 == 0 {
		b = randSlice(r, f)
	}
	x := randSlice(r, batch*g.C*g.H*g.W)
	p := g.ColCols()
	dy := randSlice(r, batch*f*p)
	want, wantDW, wantDB := naiveConvGrad(w, b, x, dy, f, batch, g, relu)
	var s ConvSmall
	y := make([]float32, batch*f*p)
	for i := range y {
		y[i] = float32(math.NaN()) // every element must be written
	}
	s.Forward(y, x, w, b, g, f, batch, relu)
	for i := range y {
		if !closeTo(y[i], want[i], float64(k+1)) {
			t.Fatalf("%s: y[%d] = %v, want %v", name, i, y[i], want[i])
		}
	}
	dw := randSlice(r, f*k) // Grad accumulates
	dw0 := append([]float32(nil), dw...)
	var db, db0 []float32
	if b != nil {
		db = randSlice(r, f)
		db0 = append([]float32(nil), db...)
	}
	s.Grad(dw, db, dy, x, g, f, batch, relu)
	tol := float64(batch * p)
	for i := range dw {
		if !closeTo(dw[i], float64(dw0[i])+wantDW[i], tol) {
			t.Fatalf("%s: dw[%d] = %v, want %v", name, i, dw[i], float64(dw0[i])+wantDW[i])
		}
	}
	for i := range db {
		if !closeTo(db[i], float64(db0[i])+wantDB[i], tol) {
			t.Fatalf("%s: db[%d] = %v, want %v", name, i, db[i], float64(db0[i])+wantDB[i])
		}
	}
}

// BenchmarkConvSmall runs the cnn's first layer (1→32, 3×3, 28×28, ReLU)
// at batch 64: Forward, and Grad.
func BenchmarkConvSmall(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	g := ConvGeom{C: 1, H: 28, W: 28, KH: 3, KW: 3, StrideH: 1, StrideW: 1}
	const f, batch = 32, 64
	w, bias := randSlice(r, f*9), randSlice(r, f)
	x := randSlice(r, batch*28*28)
	y := make([]float32, batch*f*g.ColCols())
	dy := randSlice(r, len(y))
	dw, db := make([]float32, f*9), make([]float32, f)
	var s ConvSmall
	b.Run("forward", func(b *testing.B) {
		for b.Loop() {
			s.Forward(y, x, w, bias, g, f, batch, true)
		}
	})
	b.Run("grad", func(b *testing.B) {
		for b.Loop() {
			s.Grad(dw, db, dy, x, g, f, batch, true)
		}
	})
}
