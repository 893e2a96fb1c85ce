package models

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gradsync/gradsync/internal/kernels"
	"github.com/gradsync/gradsync/models/modeltest"
)

// newBoundConv returns a Conv2D with its own initialised buffers.
func newBoundConv(g kernels.ConvGeom, out int, bias bool, r *rand.Rand) *Conv2D {
	l := NewConv2D(g, out, bias)
	l.W, l.DW = make([]float32, out*g.ColRows()), make([]float32, out*g.ColRows())
	if bias {
		l.B, l.DB = make([]float32, out), make([]float32, out)
	}
	l.Init(r)
	return l
}

func convParams(l *Conv2D) []modeltest.Param {
	ps := []modeltest.Param{{Name: "weight", Value: l.W, Grad: l.DW}}
	if l.B != nil {
		ps = append(ps, modeltest.Param{Name: "bias", Value: l.B, Grad: l.DB})
	}
	return ps
}

// convCases are boundary geometries: 1×1 (the direct path), padding wider
// than the kernel reach, strides that skip the last rows, a kernel as
// large as the padded input.
var convCases = []struct {
	g    kernels.ConvGeom
	out  int
	bias bool
}{
	{geom(1, 1, 1, 1, 1, 0), 1, true},
	{geom(3, 4, 5, 1, 1, 0), 2, false},
	{geom(2, 5, 5, 3, 1, 1), 3, true},
	{geom(2, 6, 7, 3, 2, 1), 2, false},
	{geom(1, 5, 4, 5, 1, 2), 2, true},
	{geom(2, 3, 3, 5, 1, 1), 1, true},
	{geom(3, 7, 7, 1, 2, 0), 4, false},
	{kernels.ConvGeom{C: 2, H: 6, W: 5, KH: 3, KW: 2, StrideH: 2, StrideW: 3, PadH: 1, PadW: 2}, 3, true},
	// Winograd F(2×2,3×3) (C ≥ winogradMinC): odd and even outputs, padding 0 to 2
	{geom(4, 5, 5, 3, 1, 1), 3, true},
	{geom(5, 6, 7, 3, 1, 0), 2, false},
	{geom(4, 3, 4, 3, 1, 2), 2, true},
	// kernels.ConvSmall (stride 1, few channels, output rows ≥ 8): a row of
	// exactly 8, overlapping last vectors with padding, 8 filters plus one,
	// a 25-tap kernel (three gradient passes of ≤ 12 taps)
	{geom(1, 6, 10, 3, 1, 0), 2, true},
	{geom(1, 5, 11, 3, 1, 1), 3, false},
	{geom(2, 4, 13, 3, 1, 0), 9, true},
	{geom(1, 4, 9, 5, 1, 2), 2, true},
}

// TestConv2DWinogradMatchesIm2col runs the Winograd path with one sample
// per block, with and without the kept input transforms, against the
// im2col path on the same weights: outputs, dx, dW and db, with and
// without the fused ReLU.
func TestConv2DWinogradMatchesIm2col(t *testing.T) {
	defer func(b, k int) { winogradBlockTiles, winogradKeepMax = b, k }(winogradBlockTiles, winogradKeepMax)
	forEachBackend(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(2, 3))
		for _, c := range convCases {
			if !c.g.WinogradOK() || c.g.C < winogradMinC {
				continue
			}
			for _, keep := range []int{0, keepColsMax} {
				for _, relu := range []bool{false, true} {
					winogradBlockTiles, winogradKeepMax = 1, keep
					fast := newBoundConv(c.g, c.out, c.bias, r)
					fast.ReLU = relu
					if !fast.wino {
						t.Fatalf("%+v: not on the Winograd path", c.g)
					}
					slow := newBoundConv(c.g, c.out, c.bias, r)
					copy(slow.W, fast.W)
					copy(slow.B, fast.B)
					slow.ReLU, slow.wino = relu, false
					const batch = 3
					x := randn(r, batch*c.g.C*c.g.H*c.g.W)
					dy := randn(r, batch*fast.OutSize())
					yf, ys := fast.Forward(x, batch, true), slow.Forward(x, batch, true)
					dxf, dxs := fast.Backward(dy), slow.Backward(dy)
					for _, p := range []struct {
						name string
						a, b []float32
					}{{"y", yf, ys}, {"dx", dxf, dxs}, {"dW", fast.DW, slow.DW}, {"db", fast.DB, slow.DB}} {
						for i := range p.b {
							if math.Abs(float64(p.a[i]-p.b[i])) > 1e-5*(1+math.Abs(float64(p.b[i]))) {
								t.Fatalf("%+v keep %d relu %v: Winograd %s[%d] = %v, im2col %v", c.g, keep, relu, p.name, i, p.a[i], p.b[i])
							}
						}
					}
				}
			}
		}
	})
}

// TestConv2DSmallMatchesIm2col runs the kernels.ConvSmall path against
// the im2col path on the same weights: outputs, dx, dW and db, with and
// without the fused ReLU and the input gradient, at batch 1 and 3.
func TestConv2DSmallMatchesIm2col(t *testing.T) {
	if !kernels.SmallConvOK(geom(1, 28, 28, 3, 1, 0)) {
		t.Skip("no direct small-channel convolution on this machine")
	}
	forEachBackend(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(2, 4))
		cases := append(slices.Clone(convCases), struct {
			g    kernels.ConvGeom
			out  int
			bias bool
		}{geom(1, 28, 28, 3, 1, 0), 32, true}, struct {
			g    kernels.ConvGeom
			out  int
			bias bool
		}{geom(3, 12, 17, 5, 1, 2), 5, false})
		n := 0
		for _, c := range cases {
			if !kernels.SmallConvOK(c.g) || c.g.C >= winogradMinC && c.g.WinogradOK() {
				continue
			}
			n++
			for _, batch := range []int{1, 3} {
				for _, relu := range []bool{false, true} {
					for _, skip := range []bool{false, true} {
						fast := newBoundConv(c.g, c.out, c.bias, r)
						if !fast.small {
							t.Fatalf("%+v: not on the small-channel path", c.g)
						}
						fast.ReLU, fast.SkipInputGrad = relu, skip
						slow := newBoundConv(c.g, c.out, c.bias, r)
						copy(slow.W, fast.W)
						copy(slow.B, fast.B)
						slow.ReLU, slow.SkipInputGrad, slow.small = relu, skip, false
						x := randn(r, batch*c.g.C*c.g.H*c.g.W)
						dy := randn(r, batch*fast.OutSize())
						yf, ys := fast.Forward(x, batch, true), slow.Forward(x, batch, true)
						dxf, dxs := fast.Backward(dy), slow.Backward(dy)
						if skip != (dxf == nil) {
							t.Fatalf("%+v skip %v: dx = %v", c.g, skip, dxf)
						}
						for _, p := range []struct {
							name string
							a, b []float32
						}{{"y", yf, ys}, {"dx", dxf, dxs}, {"dW", fast.DW, slow.DW}, {"db", fast.DB, slow.DB}} {
							for i := range p.b {
								if math.Abs(float64(p.a[i]-p.b[i])) > 1e-4*(1+math.Abs(float64(p.b[i]))) {
									t.Fatalf("%+v batch %d relu %v: small %s[%d] = %v, im2col %v", c.g, batch, relu, p.name, i, p.a[i], p.b[i])
								}
							}
						}
					}
				}
			}
		}
		if n < 6 {
			t.Fatalf("only %d cases on the small-channel path", n)
		}
	})
}

func TestConv2DGradient(t *testing.T) {
	forEachBackend(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(2, 1))
		for i, c := range convCases {
			l := newBoundConv(c.g, c.out, c.bias, r)
			for _, batch := range []int{1, 2} {
				x := randn(r, batch*c.g.C*c.g.H*c.g.W)
				modeltest.CheckLayer(t, "conv", l, x, batch, convParams(l), modeltest.Config{Seed: uint64(i)})
			}
		}
	})
}

// naiveConv2D is the definition: y[n,f,i,j] = b[f] + Σ w[f,c,ki,kj]·x[n,c,i·s−p+ki,j·s−p+kj].
func naiveConv2D(w, b, x []float32, batch, out int, g kernels.ConvGeom) []float64 {
	oh, ow := g.OutH(), g.OutW()
	y := make([]float64, batch*out*oh*ow)
	for n := range batch {
		for f := range out {
			for i := range oh {
				for j := range ow {
					var s float64
					if b != nil {
						s = float64(b[f])
					}
					for c := range g.C {
						for ki := range g.KH {
							for kj := range g.KW {
								ih, iw := i*g.StrideH-g.PadH+ki, j*g.StrideW-g.PadW+kj
								if ih >= 0 && ih < g.H && iw >= 0 && iw < g.W {
									s += float64(w[((f*g.C+c)*g.KH+ki)*g.KW+kj]) * float64(x[((n*g.C+c)*g.H+ih)*g.W+iw])
								}
							}
						}
					}
					y[((n*out+f)*oh+i)*ow+j] = s
				}
			}
		}
	}
	return y
}

func TestConv2DMatchesNaive(t *testing.T) {
	forEachBackend(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(2, 2))
		cases := append(slices.Clone(convCases), struct {
			g    kernels.ConvGeom
			out  int
			bias bool
		}{geom(1, 28, 28, 5, 1, 2), 6, true})
		for _, c := range cases {
			l := newBoundConv(c.g, c.out, c.bias, r)
			const batch = 3
			x := randn(r, batch*c.g.C*c.g.H*c.g.W)
			y := l.Forward(x, batch, false)
			want := naiveConv2D(l.W, l.B, x, batch, c.out, c.g)
			for i := range want {
				if math.Abs(float64(y[i])-want[i]) > 1e-5*(1+math.Abs(want[i])) {
					t.Fatalf("%+v: y[%d] = %v, want %v", c.g, i, y[i], want[i])
				}
			}
		}
	})
}

func TestResidualGradient(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 1))
	body := newBoundLinear(4, 4, r)
	sc := newBoundLinear(4, 4, r)
	params := []modeltest.Param{
		{Name: "body.weight", Value: body.W, Grad: body.DW},
		{Name: "shortcut.bias", Value: sc.B, Grad: sc.DB},
	}
	x := randn(r, 3*4)
	modeltest.CheckLayer(t, "residual identity", &Residual{Body: []Layer{body, &GELU{}}}, x, 3, params[:1], modeltest.Config{})
	modeltest.CheckLayer(t, "residual projection", &Residual{Body: []Layer{body}, Shortcut: []Layer{sc}}, x, 3, params, modeltest.Config{})
}

func TestAttentionGradient(t *testing.T) {
	forEachBackend(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(7, 1))
		for i, sz := range []struct{ d, heads, tokens, batch int }{{2, 1, 1, 1}, {4, 2, 3, 2}, {6, 3, 5, 1}} {
			l := NewSelfAttention(sz.d, sz.heads, sz.tokens)
			for _, lin := range []*Linear{l.In, l.Out} {
				lin.W, lin.B = make([]float32, lin.In*lin.Out), make([]float32, lin.Out)
				lin.DW, lin.DB = make([]float32, lin.In*lin.Out), make([]float32, lin.Out)
			}
			l.Init(r)
			copy(l.In.B, randn(r, len(l.In.B)))
			x := randn(r, sz.batch*sz.tokens*sz.d)
			modeltest.CheckLayer(t, "attention", l, x, sz.batch, []modeltest.Param{
				{Name: "in_proj_weight", Value: l.In.W, Grad: l.In.DW},
				{Name: "in_proj_bias", Value: l.In.B, Grad: l.In.DB},
				{Name: "out_proj.weight", Value: l.Out.W, Grad: l.Out.DW},
			}, modeltest.Config{Seed: uint64(i), Eps: 1e-3})
		}
	})
}

func TestPatchEmbedGradient(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 1))
	l := NewPatchEmbed(2, 5, 4, 2, 3) // 2×2 patches, a row and no column left over
	k := 2 * 2 * 2
	l.Proj.W, l.Proj.B, l.Proj.DW, l.Proj.DB = make([]float32, 3*k), make([]float32, 3), make([]float32, 3*k), make([]float32, 3)
	tokens := 1 + l.NumPatches()
	l.Cls, l.DCls, l.Pos, l.DPos = make([]float32, 3), make([]float32, 3), make([]float32, tokens*3), make([]float32, tokens*3)
	l.Init(r)
	x := randn(r, 2*2*5*4)
	modeltest.CheckLayer(t, "patchembed", l, x, 2, []modeltest.Param{
		{Name: "proj.weight", Value: l.Proj.W, Grad: l.Proj.DW},
		{Name: "proj.bias", Value: l.Proj.B, Grad: l.Proj.DB},
		{Name: "cls", Value: l.Cls, Grad: l.DCls},
		{Name: "pos", Value: l.Pos, Grad: l.DPos},
	}, modeltest.Config{})
	// It equals a stride-2 convolution of the same weights.
	conv := NewConv2D(geom(2, 5, 4, 2, 2, 0), 3, true)
	conv.W, conv.B, conv.DW, conv.DB = l.Proj.W, l.Proj.B, l.Proj.DW, l.Proj.DB
	c := conv.Forward(x, 2, false) // (2, 3, 2, 2)
	y := l.Forward(x, 2, false)    // (2, 5, 3)
	for n := range 2 {
		for p := range 4 {
			for d := range 3 {
				got := y[(n*tokens+1+p)*3+d] - l.Pos[(1+p)*3+d]
				if want := c[(n*3+d)*4+p]; math.Abs(float64(got-want)) > 1e-5 {
					t.Fatalf("token (%d,%d,%d) = %v, conv %v", n, p, d, got, want)
				}
			}
		}
	}
}

func TestClassTokenGradient(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 1))
	modeltest.CheckLayer(t, "classtoken", &ClassToken{Tokens: 3, D: 2}, randn(r, 2*3*2), 2, nil, modeltest.Config{})
}

// BenchmarkLayers measures the fast kernels at the cnn's and lenet5's
// shapes, batch 64.
func BenchmarkLayers(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	const batch = 64
	run := func(name string, l Layer, in int) {
		x := randn(r, batch*in)
		y := l.Forward(x, batch, true)
		dy := randn(r, len(y))
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				l.Forward(x, batch, true)
				l.Backward(dy)
			}
		})
	}
	g := geom(32, 26, 26, 3, 1, 0)
	run("conv32x26x26-64", newBoundConv(g, 64, true, r), 32*26*26)
	im2col := newBoundConv(g, 64, true, r)
	im2col.wino = false
	run("conv32x26x26-64-im2col", im2col, 32*26*26)
	// the first layers of cnn, lenet5, fedcnn and resnet8, on the
	// small-channel path where it applies and on im2col
	for _, c := range []struct {
		name       string
		g          kernels.ConvGeom
		out        int
		bias, relu bool
	}{
		{"conv1x28x28-32relu", geom(1, 28, 28, 3, 1, 0), 32, true, true},
		{"conv1x28x28-6pad2", geom(1, 28, 28, 5, 1, 2), 6, true, false},
		{"conv1x28x28-32pad2relu", geom(1, 28, 28, 5, 1, 2), 32, true, true},
		{"conv1x28x28-16pad1", geom(1, 28, 28, 3, 1, 1), 16, false, false},
	} {
		for _, small := range []bool{true, false} {
			l := newBoundConv(c.g, c.out, c.bias, r)
			l.ReLU, l.SkipInputGrad = c.relu, true
			name := c.name
			if !small {
				name += "-im2col"
				l.small = false
			} else if !l.small {
				continue
			}
			run(name, l, 28*28)
		}
	}
	run("maxpool64x24x24", NewMaxPool2D(PoolGeom{C: 64, H: 24, W: 24, K: 2, Stride: 2}), 64*24*24)
	run("relu64x24x24", &ReLU{}, 64*24*24)
	run("dropout9216", NewDropout(0.25, 1), 9216)
}

// TestFusedReLU checks Conv2D.ReLU and MaxPool2D.ReLU against separate
// ReLU layers, forward and backward, and the fused convolution's gradient.
func TestFusedReLU(t *testing.T) {
	forEachBackend(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(10, 1))
		for i, c := range convCases {
			const batch = 2
			x := randn(r, batch*c.g.C*c.g.H*c.g.W)
			fused := newBoundConv(c.g, c.out, c.bias, r)
			fused.ReLU = true
			modeltest.CheckLayer(t, "conv+relu", fused, x, batch, convParams(fused), modeltest.Config{Seed: uint64(i), Eps: 1e-4, ATol: 1e-2})
			plain := &Conv2D{Geom: c.g, Out: c.out, W: fused.W, B: fused.B,
				DW: make([]float32, len(fused.W)), DB: make([]float32, len(fused.B)), direct: fused.direct}
			if fused.B == nil {
				plain.DB = nil
			}
			checkFused(t, "conv", fused, []Layer{plain, &ReLU{}}, x, batch, r)
		}
		for _, g := range poolCases {
			const batch = 2
			x := randn(r, batch*g.C*g.H*g.W)
			fused := NewMaxPool2D(g)
			fused.ReLU = true
			checkFused(t, "maxpool", fused, []Layer{&ReLU{}, NewMaxPool2D(g)}, x, batch, r)
		}
	})
}

// checkFused compares a fused layer with the stack it replaces.
func checkFused(t *testing.T, name string, fused Layer, stack []Layer, x []float32, batch int, r *rand.Rand) {
	t.Helper()
	y := slices.Clone(fused.Forward(x, batch, true))
	ys := x
	for _, l := range stack {
		ys = l.Forward(ys, batch, true)
	}
	dy := randn(r, len(y))
	dx := fused.Backward(dy)
	dxs := dy
	for i := len(stack) - 1; i >= 0; i-- {
		dxs = stack[i].Backward(dxs)
	}
	for i := range y {
		if math.Abs(float64(y[i]-ys[i])) > 1e-5 {
			t.Fatalf("%s: fused y[%d] = %v, separate %v", name, i, y[i], ys[i])
		}
	}
	for i := range dx {
		if math.Abs(float64(dx[i]-dxs[i])) > 1e-5 {
			t.Fatalf("%s: fused dx[%d] = %v, separate %v", name, i, dx[i], dxs[i])
		}
	}
}
