package models

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gradsync/gradsync/internal/kernels"
)

// TestConv2DWholeBatchMatchesPerSample runs 1×1 convolutions on the
// whole-batch GEMM path and, with it turned off, on the per-sample one
// (same weights, input and dy): y and dx bit for bit (they stay per
// sample), dW and db to float32 rounding (the sums over the batch run in
// another order), and y matches the definition. Plane sizes 1 (squeeze-and-excitation), 4, 20 and
// wholeBatchMaxP take the whole-batch path; one past it does not.
func TestConv2DWholeBatchMatchesPerSample(t *testing.T) {
	saved := wholeBatchMaxP
	defer func() { wholeBatchMaxP = saved }()
	forEachBackend(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(5, 9))
		for _, c := range []struct {
			c, h, w, out int
			bias         bool
		}{{7, 1, 1, 5, true}, {64, 1, 1, 96, false}, {3, 2, 2, 17, false}, {16, 4, 5, 9, true}, {5, 8, 8, 3, false}, {2, 5, 13, 4, true}} {
			g := geom(c.c, c.h, c.w, 1, 1, 0)
			for _, batch := range []int{1, 3, 13} {
				for _, skip := range []bool{false, true} {
					wholeBatchMaxP = saved
					fast := newBoundConv(g, c.out, c.bias, r)
					fast.SkipInputGrad = skip
					slow := newBoundConv(g, c.out, c.bias, r)
					copy(slow.W, fast.W)
					copy(slow.B, fast.B)
					slow.SkipInputGrad = skip
					if want := g.ColCols() <= saved; fast.wholeBatch() != want {
						t.Fatalf("%+v: whole batch %v, want %v", g, fast.wholeBatch(), want)
					}
					x := randn(r, batch*g.C*g.H*g.W)
					dy := randn(r, batch*fast.OutSize())
					yf := fast.Forward(x, batch, true)
					dxf := fast.Backward(dy)
					wholeBatchMaxP = 0
					ys := slow.Forward(x, batch, true)
					dxs := slow.Backward(dy)
					if skip != (dxf == nil) {
						t.Fatalf("%+v skip %v: dx = %v", g, skip, dxf)
					}
					naive := naiveConv2D(fast.W, fast.B, x, batch, c.out, g)
					for i, v := range naive {
						if math.Abs(float64(yf[i])-v) > 1e-5*(1+math.Abs(v)) {
							t.Fatalf("%+v batch %d: y[%d] = %v, definition %v", g, batch, i, yf[i], v)
						}
					}
					if !slices.Equal(yf, ys) || !slices.Equal(dxf, dxs) {
						t.Fatalf("%+v batch %d: y or dx differ from the per-sample path, want bit-identical", g, batch)
					}
					for _, p := range []struct {
						name string
						a, b []float32
					}{{"dW", fast.DW, slow.DW}, {"db", fast.DB, slow.DB}} {
						for i := range p.b {
							if math.Abs(float64(p.a[i]-p.b[i])) > 1e-5*(1+math.Abs(float64(p.b[i]))) {
								t.Fatalf("%+v batch %d: whole-batch %s[%d] = %v, per sample %v", g, batch, p.name, i, p.a[i], p.b[i])
							}
						}
					}
				}
			}
		}
	})
}

// TestConv2DChainMatchesGemm runs convolutions with their products on
// kernels.GemmChain (Chain) and on Gemm — the Winograd path (7×7 and
// 1×1 images, 17 channels), the im2col path with stride 2, 1×1 with
// stride 1 and 2, the 1×1 ones on small planes as one product over the
// batch — and compares y with the definition and y, dx, dW between the
// two within float32 rounding, at batch 1 and 3; y and dx of a sample
// computed alone equal its values in the batch bit for bit.
func TestConv2DChainMatchesGemm(t *testing.T) {
	if !kernels.ChainOK() {
		t.Skip("no GemmChain kernel on this machine")
	}
	r := rand.New(rand.NewPCG(5, 10))
	for _, c := range []struct {
		g   kernels.ConvGeom
		out int
	}{
		{geom(16, 7, 7, 3, 1, 1), 16}, {geom(17, 9, 6, 3, 1, 1), 5}, {geom(4, 1, 1, 3, 1, 1), 6},
		{geom(16, 9, 9, 3, 2, 1), 33}, {geom(5, 8, 7, 3, 2, 1), 7},
		{geom(16, 4, 4, 1, 1, 0), 35}, {geom(9, 8, 8, 1, 1, 0), 4}, {geom(16, 9, 9, 1, 2, 0), 32},
	} {
		for _, batch := range []int{1, 3} {
			chain := newBoundConv(c.g, c.out, false, r)
			chain.Chain = true
			plain := newBoundConv(c.g, c.out, false, r)
			copy(plain.W, chain.W)
			x := randn(r, batch*c.g.C*c.g.H*c.g.W)
			dy := randn(r, batch*chain.OutSize())
			yc := slices.Clone(chain.Forward(x, batch, true))
			dxc := chain.Backward(dy)
			yp := plain.Forward(x, batch, true)
			dxp := plain.Backward(dy)
			if c.g.KH == 1 || c.g.StrideH == 2 {
				// (stride 2: the columns kept side by side for the batch)
				// a sample alone gives its values in the batch, bit for
				// bit (the property that keeps the threads' results those
				// of one thread; Winograd's output transform runs a Gemm
				// over its block of samples, so not there)
				alone := newBoundConv(c.g, c.out, false, r)
				alone.Chain = true
				copy(alone.W, chain.W)
				in, o := c.g.C*c.g.H*c.g.W, chain.OutSize()
				last := batch - 1
				if ya := alone.Forward(x[last*in:], 1, true); !slices.Equal(ya, yc[last*o:]) {
					t.Fatalf("%+v batch %d: the last sample alone gives another y", c.g, batch)
				}
				if dxa := alone.Backward(dy[last*o:]); !slices.Equal(dxa, dxc[last*in:]) {
					t.Fatalf("%+v batch %d: the last sample alone gives another dx", c.g, batch)
				}
			}
			naive := naiveConv2D(chain.W, nil, x, batch, c.out, c.g)
			for i, v := range naive {
				if math.Abs(float64(yc[i])-v) > 1e-5*(1+math.Abs(v)) {
					t.Fatalf("%+v batch %d: y[%d] = %v, definition %v", c.g, batch, i, yc[i], v)
				}
			}
			for _, p := range []struct {
				name string
				a, b []float32
			}{{"y", yc, yp}, {"dx", dxc, dxp}, {"dW", chain.DW, plain.DW}} {
				for i := range p.b {
					if math.Abs(float64(p.a[i]-p.b[i])) > 1e-5*(1+math.Abs(float64(p.b[i]))) {
						t.Fatalf("%+v batch %d: Chain %s[%d] = %v, Gemm %v", c.g, batch, p.name, i, p.a[i], p.b[i])
					}
				}
			}
		}
	}
}
