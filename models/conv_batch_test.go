package models

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
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
