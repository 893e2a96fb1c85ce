package models

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gradsync/gradsync/internal/tensor"
	"github.com/gradsync/gradsync/models/modeltest"
)

// convPoolCases: even outputs on the Winograd path (fused), and an odd
// output and an im2col kernel (run one after the other).
var convPoolCases = []struct {
	g     tensor.ConvGeom
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
