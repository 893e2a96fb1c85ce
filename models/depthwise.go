package models

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/gradsync/gradsync/internal/kernels"
)

// DepthwiseConv2D is torch.nn.Conv2d(C, C, k, stride, padding,
// groups=C): each input channel is convolved with its own filter and
// gives one output channel. x is (batch, C, H, W) and y is (batch, C,
// OutH, OutW), the geometry fixed at construction. W has PyTorch's layout
// (C, 1, KH, KW) and B is (C), or nil without a bias. It runs as a direct
// per-channel loop (kernels.Depthwise and its gradients), not as
// im2col + GEMM: with one input channel per filter a GEMM has nothing to
// sum over.
type DepthwiseConv2D struct {
	Geom kernels.ConvGeom
	// W, B are views into the network's flat parameter buffer; DW, DB the
	// matching views into its gradient buffer. B and DB are nil without a
	// bias.
	W, B, DW, DB []float32
	// SkipInputGrad makes Backward skip dx (it returns nil), for the first
	// layer of a network.
	SkipInputGrad bool

	x     []float32 // borrowed input of the last Forward
	batch int
	y, dx []float32 // owned
}

// NewDepthwiseConv2D returns a depthwise convolution over inputs of
// geometry g (g.C channels in and out), with or without a bias, and no
// parameter storage; bind its views (a Network does this) before use.
func NewDepthwiseConv2D(g kernels.ConvGeom, bias bool) *DepthwiseConv2D {
	if g.C < 1 || g.H < 1 || g.W < 1 || g.KH < 1 || g.KW < 1 || g.StrideH < 1 || g.StrideW < 1 ||
		g.PadH < 0 || g.PadW < 0 || g.H+2*g.PadH < g.KH || g.W+2*g.PadW < g.KW {
		panic(fmt.Sprintf("models: NewDepthwiseConv2D(%+v): invalid geometry", g))
	}
	l := &DepthwiseConv2D{Geom: g}
	if bias {
		l.B, l.DB = []float32{}, []float32{} // non-nil: bound later
	}
	return l
}

// OutSize is the number of output values per sample: C·OutH·OutW.
func (l *DepthwiseConv2D) OutSize() int { return l.Geom.C * l.Geom.OutH() * l.Geom.OutW() }

// Init fills W (and B) from U(−1/√fan_in, 1/√fan_in) with fan_in = KH·KW
// (one input channel per group), PyTorch's default for a grouped
// nn.Conv2d, drawing the weight first.
func (l *DepthwiseConv2D) Init(r *rand.Rand) {
	bound := 1 / math.Sqrt(float64(l.Geom.KH*l.Geom.KW))
	uniform(r, l.W, bound)
	uniform(r, l.B, bound)
}

func (l *DepthwiseConv2D) checkBound() {
	g := l.Geom
	if len(l.W) != g.C*g.KH*g.KW || len(l.DW) != len(l.W) || len(l.DB) != len(l.B) || (l.B != nil && len(l.B) != g.C) {
		panic(fmt.Sprintf("models: DepthwiseConv2D(%d): parameter views not bound (len W=%d B=%d DW=%d DB=%d)",
			g.C, len(l.W), len(l.B), len(l.DW), len(l.DB)))
	}
}

// Forward computes every channel's convolution with its filter (plus its
// bias).
func (l *DepthwiseConv2D) Forward(x []float32, batch int, train bool) []float32 {
	l.checkBound()
	g := l.Geom
	if batch < 1 || len(x) != batch*g.C*g.H*g.W {
		panic(fmt.Sprintf("models: DepthwiseConv2D.Forward: len(x)=%d, want batch %d × %d×%d×%d", len(x), batch, g.C, g.H, g.W))
	}
	l.x, l.batch = x, batch
	l.y = grow(l.y, batch*l.OutSize())
	kernels.Depthwise(l.y, x, l.W, g, batch)
	if l.B != nil {
		p := g.OutH() * g.OutW()
		for i := range batch * g.C {
			b := l.B[i%g.C]
			for j := range l.y[i*p : (i+1)*p] {
				l.y[i*p+j] += b
			}
		}
	}
	return l.y
}

// Backward adds dW and db and returns dx, or nil when SkipInputGrad is
// set.
func (l *DepthwiseConv2D) Backward(dy []float32) []float32 {
	g := l.Geom
	if l.x == nil || len(dy) != l.batch*l.OutSize() {
		panic(fmt.Sprintf("models: DepthwiseConv2D.Backward: len(dy)=%d, want batch %d × %d (after Forward)", len(dy), l.batch, l.OutSize()))
	}
	kernels.DepthwiseFilterGrad(l.DW, dy, l.x, g, l.batch)
	if l.DB != nil {
		p := g.OutH() * g.OutW()
		for i := range l.batch * g.C {
			l.DB[i%g.C] += sum32(dy[i*p : (i+1)*p])
		}
	}
	if l.SkipInputGrad {
		return nil
	}
	l.dx = grow(l.dx, len(l.x))
	kernels.DepthwiseInputGrad(l.dx, dy, l.W, g, l.batch)
	return l.dx
}
