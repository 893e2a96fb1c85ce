package models

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gradsync/gradsync/internal/kernels"
	"github.com/gradsync/gradsync/models/modeltest"
)

// convPoolCases: even outputs on the Winograd path (fused), and an odd
// output and an im2col kernel (run one after the other).
var convPoolCases = []struct {
	g     kernels.ConvGeom
	out   int
	fused bool
}{
	{geom(4, 6, 6, 3, 1, 0), 3, true},
	{geom(4, 4, 6, 3, 1, 1), 2, true},
	{geom(5, 2, 4, 3, 1, 2), 2, true},
	{geom(32, 26, 26, 3, 1, 0), 4, true}, // the cnn's conv2, fewer outputs
	{geom(4, 5, 5, 3, 1, 1), 3, false},
	{geom(2, 6, 6, 5, 1, 2), 2, false},
}

// TestConvMaxPool compares ConvMaxPool with the Conv2D and MaxPool2D it
// replaces on the same weights: y bit for bit, dx, dW and db, over one
// and several samples per Winograd block, kept and recomputed V, with
// the ReLU in the convolution, the pool or neither, and with all-zero
// weights (every window a tie); then checks its gradient.
func TestConvMaxPool(t *testing.T) {
	defer func(b, k int) { winogradBlockTiles, winogradKeepMax = b, k }(winogradBlockTiles, winogradKeepMax)
	forEachBackend(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(11, 1))
		for ci, c := range convPoolCases {
			og := c.g
			pg := PoolGeom{C: c.out, H: og.OutH(), W: og.OutW(), K: 2, Stride: 2}
			for _, blockTiles := range []int{1, 320} {
				for _, keep := range []int{0, keepColsMax} {
					for variant := range 4 { // 0: no ReLU, 1: conv ReLU, 2: pool ReLU, 3: zero weights
						winogradBlockTiles, winogradKeepMax = blockTiles, keep
						conv := newBoundConv(og, c.out, true, r)
						pool := NewMaxPool2D(pg)
						sconv := newBoundConv(og, c.out, true, r)
						spool := NewMaxPool2D(pg)
						if variant == 3 {
							clear(conv.W)
						}
						copy(sconv.W, conv.W)
						copy(sconv.B, conv.B)
						conv.ReLU, sconv.ReLU = variant == 1, variant == 1
						pool.ReLU, spool.ReLU = variant == 2, variant == 2
						l := NewConvMaxPool(conv, pool)
						if l.fused != c.fused {
							t.Fatalf("%+v: fused %v, want %v", og, l.fused, c.fused)
						}
						const batch = 3
						x := randn(r, batch*og.C*og.H*og.W)
						y := slices.Clone(l.Forward(x, batch, true))
						ys := spool.Forward(sconv.Forward(x, batch, true), batch, true)
						for i := range ys {
							if math.Float32bits(y[i]) != math.Float32bits(ys[i]) {
								t.Fatalf("%+v variant %d: y[%d] = %v, separate %v", og, variant, i, y[i], ys[i])
							}
						}
						dy := randn(r, len(y))
						dx := l.Backward(dy)
						dxs := sconv.Backward(spool.Backward(dy))
						for _, p := range []struct {
							name string
							a, b []float32
						}{{"dx", dx, dxs}, {"dW", conv.DW, sconv.DW}, {"db", conv.DB, sconv.DB}} {
							if len(p.a) != len(p.b) {
								t.Fatalf("%+v: len(%s) %d, separate %d", og, p.name, len(p.a), len(p.b))
							}
							for i := range p.b {
								if math.Abs(float64(p.a[i]-p.b[i])) > 1e-5*(1+math.Abs(float64(p.b[i]))) {
									t.Fatalf("%+v blocks %d keep %d variant %d: %s[%d] = %v, separate %v", og, blockTiles, keep, variant, p.name, i, p.a[i], p.b[i])
								}
							}
						}
					}
				}
			}
			conv := newBoundConv(og, c.out, true, r)
			pool := NewMaxPool2D(pg)
			pool.ReLU = true
			l := NewConvMaxPool(conv, pool)
			x := randn(r, 2*og.C*og.H*og.W)
			modeltest.CheckLayer(t, "conv+maxpool", l, x, 2, convParams(conv), modeltest.Config{Seed: uint64(ci), Eps: 1e-4, ATol: 1e-2})
		}
	})
}

// TestConvWinograd4 compares Conv2D and the fused ConvMaxPool on
// Winograd F(4×4, 3×3) (winograd4, off by default) with the same layers
// on F(2×2, 3×3): output, dx, dW and db within float32 rounding of each
// other, over output sizes that are multiples of 4, padding, one and
// several samples per block, kept and recomputed V, with and without the
// ReLU.
func TestConvWinograd4(t *testing.T) {
	if !kernels.Winograd4Built {
		t.Skip("F(4×4, 3×3) is compiled only with -tags winograd4")
	}
	defer func(w bool, b4, k int) { winograd4, winograd4BlockTiles, winogradKeepMax = w, b4, k }(winograd4, winograd4BlockTiles, winogradKeepMax)
	forEachBackend(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(12, 1))
		for _, og := range []kernels.ConvGeom{geom(4, 6, 6, 3, 1, 0), geom(5, 8, 12, 3, 1, 1), geom(32, 26, 26, 3, 1, 0), geom(4, 10, 6, 3, 1, 0)} {
			const out = 5
			for _, blockTiles := range []int{1, 144} {
				for _, keep := range []int{0, keepColsMax} {
					for variant := range 3 { // 0: plain, 1: ReLU, 2: fused 2×2 pool with ReLU
						winograd4BlockTiles, winogradKeepMax = blockTiles, keep
						winograd4 = false
						c2 := newBoundConv(og, out, true, r)
						winograd4 = true
						c4 := newBoundConv(og, out, true, r)
						if !c4.wino4 || c2.wino4 {
							t.Fatalf("%+v: wino4 %v and %v", og, c4.wino4, c2.wino4)
						}
						copy(c4.W, c2.W)
						copy(c4.B, c2.B)
						c2.ReLU, c4.ReLU = variant == 1, variant == 1
						var l2, l4 Layer = c2, c4
						if variant == 2 {
							pg := PoolGeom{C: out, H: og.OutH(), W: og.OutW(), K: 2, Stride: 2}
							p2, p4 := NewMaxPool2D(pg), NewMaxPool2D(pg)
							p2.ReLU, p4.ReLU = true, true
							cp2, cp4 := NewConvMaxPool(c2, p2), NewConvMaxPool(c4, p4)
							if !cp2.fused || !cp4.fused {
								t.Fatalf("%+v: not fused", og)
							}
							l2, l4 = cp2, cp4
						}
						const batch = 3
						x := randn(r, batch*og.C*og.H*og.W)
						y2 := slices.Clone(l2.Forward(x, batch, true))
						y4 := slices.Clone(l4.Forward(x, batch, true))
						dy := randn(r, len(y2))
						dx2, dx4 := l2.Backward(dy), l4.Backward(dy)
						for _, p := range []struct {
							name string
							a, b []float32
							tol  float64
						}{{"y", y4, y2, 1e-4}, {"dx", dx4, dx2, 1e-3}, {"dW", c4.DW, c2.DW, 1e-3}, {"db", c4.DB, c2.DB, 1e-4}} {
							if len(p.a) != len(p.b) {
								t.Fatalf("%+v: len(%s) %d, F(2×2) %d", og, p.name, len(p.a), len(p.b))
							}
							for i := range p.b {
								if math.Abs(float64(p.a[i]-p.b[i])) > p.tol*(1+math.Abs(float64(p.b[i]))) {
									t.Fatalf("%+v blocks %d keep %d variant %d: %s[%d] = %v, F(2×2) %v", og, blockTiles, keep, variant, p.name, i, p.a[i], p.b[i])
								}
							}
						}
					}
				}
			}
		}
	})
}
