package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// naiveDepthwise computes the depthwise convolution, its input gradient
// and its filter gradient straight from the definition, in float64:
// y[n,c,i,j] = Σ_ki,kj w[c,ki,kj]·x[n,c,i·sh−ph+ki, j·sw−pw+kj] (0 outside).
func naiveDepthwise(x, w, dy []float32, g ConvGeom, batch int) (y, dx, dw []float64) {
	oh, ow := g.OutH(), g.OutW()
	y = make([]float64, batch*g.C*oh*ow)
	dx = make([]float64, len(x))
	dw = make([]float64, len(w))
	for n := range batch {
		for c := range g.C {
			for i := range oh {
				for j := range ow {
					o := ((n*g.C+c)*oh+i)*ow + j
					for ki := range g.KH {
						for kj := range g.KW {
							ih, iw := i*g.StrideH-g.PadH+ki, j*g.StrideW-g.PadW+kj
							if ih < 0 || ih >= g.H || iw < 0 || iw >= g.W {
								continue
							}
							xi := ((n*g.C+c)*g.H+ih)*g.W + iw
							wi := (c*g.KH+ki)*g.KW + kj
							y[o] += float64(w[wi]) * float64(x[xi])
							dx[xi] += float64(w[wi]) * float64(dy[o])
							dw[wi] += float64(dy[o]) * float64(x[xi])
						}
					}
				}
			}
		}
	}
	return y, dx, dw
}

// depthwiseGeoms are boundary cases: 1×1 inputs and kernels, the 3×3
// stride-1 fast path with rows shorter than, equal to and longer than the
// kernel, strides that skip the last rows, padding wider than the kernel
// reach (taps that see no input at all), kernels as wide as the padded
// input, and uneven kernels and strides.
func depthwiseGeoms() []ConvGeom {
	g := func(c, h, w, k, s, p int) ConvGeom {
		return ConvGeom{C: c, H: h, W: w, KH: k, KW: k, StrideH: s, StrideW: s, PadH: p, PadW: p}
	}
	return []ConvGeom{
		g(1, 1, 1, 1, 1, 0),
		g(2, 1, 1, 3, 1, 1),
		g(3, 5, 5, 3, 1, 1),
		g(2, 2, 7, 3, 1, 1),
		g(2, 4, 3, 3, 1, 0),
		g(1, 3, 2, 3, 1, 2),
		g(4, 8, 8, 3, 2, 1),
		g(3, 7, 9, 3, 2, 1),
		g(2, 6, 5, 5, 1, 2),
		g(2, 5, 6, 5, 3, 2),
		g(1, 3, 3, 5, 1, 1),
		g(2, 9, 4, 1, 2, 0),
		g(3, 16, 17, 3, 1, 1),
		{C: 2, H: 6, W: 7, KH: 3, KW: 2, StrideH: 2, StrideW: 3, PadH: 1, PadW: 2},
		{C: 2, H: 5, W: 9, KH: 2, KW: 3, StrideH: 1, StrideW: 1, PadH: 0, PadW: 4},
		// the vector path's (3×3, padding 1, stride 1 or 2): planes
		// smaller than, equal to and larger than a vector, odd sizes,
		// one row or column, widths past 16, channel counts not a
		// multiple of 16
		g(3, 1, 1, 3, 2, 1),
		g(2, 1, 5, 3, 1, 1),
		g(2, 5, 1, 3, 2, 1),
		g(17, 4, 4, 3, 1, 1),
		g(5, 2, 2, 3, 2, 1),
		g(3, 3, 7, 3, 2, 1),
		g(2, 17, 17, 3, 1, 1),
		g(2, 17, 17, 3, 2, 1),
		g(1, 33, 5, 3, 1, 1),
		g(1, 6, 35, 3, 2, 1),
		g(2, 3, 5, 3, 1, 0),
		g(2, 9, 9, 3, 3, 1),
	}
}

// withDepthwiseSIMD runs f with the vector kernels on and, where the CPU
// has them, off, naming the subtests.
func withDepthwiseSIMD(t *testing.T, f func(t *testing.T)) {
	saved := dwSIMD
	defer func() { dwSIMD = saved }()
	for _, on := range []bool{false, true} {
		if on && !dwAVX512 {
			t.Log("no AVX-512: vector depthwise kernels not tested")
			continue
		}
		dwSIMD = on
		name := "go"
		if on {
			name = "avx512"
		}
		t.Run(name, f)
	}
}

// TestDepthwiseMatchesNaive checks the three kernels against the
// definition on every boundary geometry, with batches of one and three,
// and that the filter gradient accumulates.
func TestDepthwiseMatchesNaive(t *testing.T) {
	withDepthwiseSIMD(t, testDepthwiseMatchesNaive)
}

func testDepthwiseMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, g := range depthwiseGeoms() {
		for _, batch := range []int{1, 3} {
			x := randSlice(r, batch*g.C*g.H*g.W)
			w := randSlice(r, g.C*g.KH*g.KW)
			dy := randSlice(r, batch*g.C*g.OutH()*g.OutW())
			wantY, wantDx, wantDw := naiveDepthwise(x, w, dy, g, batch)
			y := nanSlice(len(dy))
			Depthwise(y, x, w, g, batch)
			dwClose(t, g, "y", y, wantY)
			dx := nanSlice(len(x))
			DepthwiseInputGrad(dx, dy, w, g, batch)
			dwClose(t, g, "dx", dx, wantDx)
			dw := make([]float32, len(w))
			for i := range dw {
				dw[i] = 1
			}
			DepthwiseFilterGrad(dw, dy, x, g, batch)
			for i := range wantDw {
				wantDw[i]++
			}
			dwClose(t, g, "dw", dw, wantDw)
		}
	}
}

// nanSlice returns n NaNs: every element a kernel must write.
func nanSlice(n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(math.NaN())
	}
	return s
}

func dwClose(t *testing.T, g ConvGeom, name string, got []float32, want []float64) {
	t.Helper()
	for i, w := range want {
		if d := math.Abs(float64(got[i]) - w); !(d <= 1e-5*(1+math.Abs(w))) {
			t.Fatalf("%+v: %s[%d] = %v, want %v", g, name, i, got[i], w)
		}
	}
}

func TestDepthwisePanicsOnShape(t *testing.T) {
	g := ConvGeom{C: 2, H: 4, W: 4, KH: 3, KW: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1}
	x, w, y := make([]float32, 2*16), make([]float32, 2*9), make([]float32, 2*16)
	for name, f := range map[string]func(){
		"short w":        func() { Depthwise(y, x, w[:17], g, 1) },
		"short x":        func() { DepthwiseInputGrad(x[:31], y, w, g, 1) },
		"batch":          func() { DepthwiseFilterGrad(w, y, x, g, 2) },
		"kernel too big": func() { Depthwise(y, x, w, ConvGeom{C: 2, H: 4, W: 4, KH: 7, KW: 7, StrideH: 1, StrideW: 1}, 1) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

// BenchmarkDepthwise measures MobileNet's 3×3 depthwise layers on 32×32
// inputs (forward, input gradient and filter gradient at batch 64): the
// first block's 32×32 planes, a stride-2 block's and the middle blocks'
// 4×4 planes, on the Go code and the vector kernels.
func BenchmarkDepthwise(b *testing.B) {
	saved := dwSIMD
	defer func() { dwSIMD = saved }()
	for _, g := range []ConvGeom{
		{C: 32, H: 32, W: 32, KH: 3, KW: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
		{C: 128, H: 16, W: 16, KH: 3, KW: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1},
		{C: 512, H: 4, W: 4, KH: 3, KW: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1},
	} {
		const batch = 64
		r := rand.New(rand.NewPCG(1, 1))
		x := randSlice(r, batch*g.C*g.H*g.W)
		w := randSlice(r, g.C*9)
		y := make([]float32, batch*g.C*g.OutH()*g.OutW())
		dx := make([]float32, len(x))
		for _, path := range []string{"go", "avx512"} {
			if path == "avx512" && !dwAVX512 {
				continue
			}
			dwSIMD = path == "avx512"
			name := func(s string) string {
				return fmt.Sprintf("%s/%s/c%d_%dx%d_s%d", path, s, g.C, g.H, g.W, g.StrideH)
			}
			b.Run(name("forward"), func(b *testing.B) {
				for b.Loop() {
					Depthwise(y, x, w, g, batch)
				}
			})
			b.Run(name("inputgrad"), func(b *testing.B) {
				for b.Loop() {
					DepthwiseInputGrad(dx, y, w, g, batch)
				}
			})
			b.Run(name("filtergrad"), func(b *testing.B) {
				for b.Loop() {
					DepthwiseFilterGrad(w, y, x, g, batch)
				}
			})
		}
	}
}
