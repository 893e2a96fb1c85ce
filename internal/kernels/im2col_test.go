package kernels

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// naiveIm2col reads every column entry straight from the definition.
func naiveIm2col(src []float32, g ConvGeom) []float32 {
	outH, outW := g.OutH(), g.OutW()
	dst := make([]float32, g.ColRows()*outH*outW)
	for c := range g.C {
		for ki := range g.KH {
			for kj := range g.KW {
				row := (c*g.KH+ki)*g.KW + kj
				for oh := range outH {
					for ow := range outW {
						ih, iw := oh*g.StrideH-g.PadH+ki, ow*g.StrideW-g.PadW+kj
						var v float32
						if ih >= 0 && ih < g.H && iw >= 0 && iw < g.W {
							v = src[(c*g.H+ih)*g.W+iw]
						}
						dst[row*outH*outW+oh*outW+ow] = v
					}
				}
			}
		}
	}
	return dst
}

// naiveConv is a direct convolution (cross-correlation): weight (F,C,KH,KW),
// src (C,H,W) -> (F,OutH,OutW).
func naiveConv(weight, src []float32, f int, g ConvGeom) []float64 {
	outH, outW := g.OutH(), g.OutW()
	out := make([]float64, f*outH*outW)
	for o := range f {
		for oh := range outH {
			for ow := range outW {
				var s float64
				for c := range g.C {
					for ki := range g.KH {
						for kj := range g.KW {
							ih, iw := oh*g.StrideH-g.PadH+ki, ow*g.StrideW-g.PadW+kj
							if ih >= 0 && ih < g.H && iw >= 0 && iw < g.W {
								s += float64(weight[((o*g.C+c)*g.KH+ki)*g.KW+kj]) * float64(src[(c*g.H+ih)*g.W+iw])
							}
						}
					}
				}
				out[(o*outH+oh)*outW+ow] = s
			}
		}
	}
	return out
}

func convGeoms() []ConvGeom {
	return []ConvGeom{
		{C: 1, H: 1, W: 1, KH: 1, KW: 1, StrideH: 1, StrideW: 1},
		{C: 1, H: 5, W: 5, KH: 3, KW: 3, StrideH: 1, StrideW: 1},
		{C: 2, H: 5, W: 7, KH: 3, KW: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{C: 3, H: 8, W: 6, KH: 3, KW: 2, StrideH: 2, StrideW: 3, PadH: 1, PadW: 2},
		{C: 2, H: 7, W: 7, KH: 5, KW: 5, StrideH: 2, StrideW: 2, PadH: 2, PadW: 2},
		{C: 1, H: 4, W: 4, KH: 4, KW: 4, StrideH: 1, StrideW: 1},
		{C: 2, H: 3, W: 3, KH: 1, KW: 1, StrideH: 2, StrideW: 2, PadH: 3, PadW: 0},
		// padding wider than the image: some kernel columns see no input at all
		{C: 1, H: 3, W: 2, KH: 3, KW: 5, StrideH: 1, StrideW: 1, PadH: 1, PadW: 3},
		{C: 2, H: 5, W: 4, KH: 2, KW: 4, StrideH: 3, StrideW: 3, PadH: 2, PadW: 3},
		{C: 1, H: 28, W: 28, KH: 5, KW: 5, StrideH: 1, StrideW: 1, PadH: 2, PadW: 2},
		{C: 2, H: 14, W: 14, KH: 7, KW: 7, StrideH: 7, StrideW: 7},
	}
}

func TestIm2colMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, g := range convGeoms() {
		src := randSlice(r, g.C*g.H*g.W)
		got := make([]float32, g.ColRows()*g.ColCols())
		for i := range got {
			got[i] = float32(math.NaN()) // every element must be written
		}
		Im2col(got, src, g)
		want := naiveIm2col(src, g)
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%+v: col[%d]=%v, want %v", g, i, got[i], want[i])
			}
		}
		// strided rows: sample 1 of 3 side by side; the other samples'
		// columns are left alone
		p, k := g.ColCols(), g.ColRows()
		ld := 3 * p
		wide := make([]float32, k*ld)
		for i := range wide {
			wide[i] = -7
		}
		Im2colStrided(wide[p:], ld, src, g)
		for row := range k {
			for j := range ld {
				v, w := wide[row*ld+j], float32(-7)
				if j >= p && j < 2*p {
					w = want[row*p+j-p]
				}
				if v != w {
					t.Fatalf("%+v: strided col row %d, column %d = %v, want %v", g, row, j, v, w)
				}
			}
		}
	}
}

// TestIm2colConv checks the layout a convolution layer relies on:
// weight (F, C·KH·KW) · col equals a direct convolution.
func TestIm2colConv(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, be := range backends(t) {
		withBackend(t, be, func() {
			for _, g := range convGeoms() {
				const f = 3
				src, w := randSlice(r, g.C*g.H*g.W), randSlice(r, f*g.ColRows())
				col := make([]float32, g.ColRows()*g.ColCols())
				Im2col(col, src, g)
				out := make([]float32, f*g.ColCols())
				Gemm(false, false, f, g.ColCols(), g.ColRows(), 1, w, g.ColRows(), col, g.ColCols(), 0, out, g.ColCols())
				want := naiveConv(w, src, f, g)
				for i := range want {
					if math.Abs(float64(out[i])-want[i]) > 1e-4*(1+math.Abs(want[i])) {
						t.Fatalf("%s %+v: out[%d]=%v, want %v", be, g, i, out[i], want[i])
					}
				}
			}
		})
	}
}

// TestCol2imAdjoint checks <Im2col(x), y> == <x, Col2im(y)> and that
// Col2im accumulates.
func TestCol2imAdjoint(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, g := range convGeoms() {
		x := randSlice(r, g.C*g.H*g.W)
		y := randSlice(r, g.ColRows()*g.ColCols())
		col := make([]float32, len(y))
		Im2col(col, x, g)
		base := randSlice(r, len(x))
		img := append([]float32(nil), base...)
		Col2im(img, y, g)
		var lhs, rhs float64
		for i := range y {
			lhs += float64(col[i]) * float64(y[i])
		}
		for i := range x {
			rhs += float64(x[i]) * (float64(img[i]) - float64(base[i]))
		}
		if math.Abs(lhs-rhs) > 1e-4*(1+math.Abs(lhs)) {
			t.Fatalf("%+v: <im2col(x),y>=%v, <x,col2im(y)>=%v", g, lhs, rhs)
		}
	}
}

func TestIm2colPanics(t *testing.T) {
	g := ConvGeom{C: 1, H: 3, W: 3, KH: 2, KW: 2, StrideH: 1, StrideW: 1}
	for name, f := range map[string]func(){
		"short dst":   func() { Im2col(make([]float32, 15), make([]float32, 9), g) },
		"short src":   func() { Col2im(make([]float32, 9), make([]float32, 15), g) },
		"zero stride": func() { Im2col(nil, nil, ConvGeom{C: 1, H: 3, W: 3, KH: 2, KW: 2}) },
		"big kernel":  func() { Im2col(nil, nil, ConvGeom{C: 1, H: 3, W: 3, KH: 4, KW: 2, StrideH: 1, StrideW: 1}) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if r, _ := recover().(string); !strings.HasPrefix(r, "kernels: ") {
					t.Fatalf("recovered %q, want a \"kernels: \" panic", r)
				}
			}()
			f()
		})
	}
}

func BenchmarkIm2col(b *testing.B) {
	g := ConvGeom{C: 32, H: 26, W: 26, KH: 3, KW: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1}
	src := make([]float32, g.C*g.H*g.W)
	col := make([]float32, g.ColRows()*g.ColCols())
	b.ReportAllocs()
	for b.Loop() {
		Im2col(col, src, g)
	}
}

func BenchmarkCol2im(b *testing.B) {
	g := ConvGeom{C: 32, H: 26, W: 26, KH: 3, KW: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1}
	img := make([]float32, g.C*g.H*g.W)
	col := make([]float32, g.ColRows()*g.ColCols())
	b.ReportAllocs()
	for b.Loop() {
		Col2im(img, col, g)
	}
}
