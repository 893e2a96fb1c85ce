package models

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gradsync/gradsync/internal/kernels"
	"github.com/gradsync/gradsync/models/modeltest"
)

// newBoundDepthwise returns a DepthwiseConv2D with its own initialised
// buffers.
func newBoundDepthwise(g kernels.ConvGeom, bias bool, r *rand.Rand) *DepthwiseConv2D {
	l := NewDepthwiseConv2D(g, bias)
	k := g.C * g.KH * g.KW
	l.W, l.DW = make([]float32, k), make([]float32, k)
	if bias {
		l.B, l.DB = make([]float32, g.C), make([]float32, g.C)
	}
	l.Init(r)
	copy(l.B, randn(r, len(l.B)))
	return l
}

func depthwiseParams(l *DepthwiseConv2D) []modeltest.Param {
	ps := []modeltest.Param{{Name: "weight", Value: l.W, Grad: l.DW}}
	if l.B != nil {
		ps = append(ps, modeltest.Param{Name: "bias", Value: l.B, Grad: l.DB})
	}
	return ps
}

// depthwiseCases: MobileNet's 3×3 at strides 1 and 2, 1×1 inputs, a
// kernel wider than the input, uneven kernels and strides.
var depthwiseCases = []struct {
	g    kernels.ConvGeom
	bias bool
}{
	{geom(3, 5, 6, 3, 1, 1), false},
	{geom(2, 7, 7, 3, 2, 1), true},
	{geom(2, 1, 1, 3, 2, 1), false},
	{geom(1, 3, 2, 5, 1, 2), true},
	{kernels.ConvGeom{C: 2, H: 6, W: 5, KH: 3, KW: 2, StrideH: 2, StrideW: 3, PadH: 1, PadW: 2}, true},
}

func TestDepthwiseConv2DGradient(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 1))
	for i, c := range depthwiseCases {
		l := newBoundDepthwise(c.g, c.bias, r)
		for _, batch := range []int{1, 3} {
			x := randn(r, batch*c.g.C*c.g.H*c.g.W)
			modeltest.CheckLayer(t, "depthwise", l, x, batch, depthwiseParams(l), modeltest.Config{Seed: uint64(i), Eps: 1e-3, MaxChecks: -1})
		}
	}
}

// TestDepthwiseMatchesDenseConv checks the depthwise layer against the
// dense Conv2D (im2col + GEMM) with block-diagonal weights — filter c
// nonzero on input channel c only, which is what groups = C means —
// forward, input gradient and weight and bias gradients.
func TestDepthwiseMatchesDenseConv(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 2))
	for _, c := range depthwiseCases {
		g := c.g
		dw := newBoundDepthwise(g, c.bias, r)
		dense := newBoundConv(g, g.C, c.bias, r)
		k := g.KH * g.KW
		clear(dense.W)
		for ch := range g.C {
			copy(dense.W[(ch*g.C+ch)*k:(ch*g.C+ch+1)*k], dw.W[ch*k:(ch+1)*k])
		}
		copy(dense.B, dw.B)
		const batch = 2
		x := randn(r, batch*g.C*g.H*g.W)
		near(t, "y", dw.Forward(x, batch, true), dense.Forward(x, batch, true), 1e-6)
		dy := randn(r, batch*dw.OutSize())
		near(t, "dx", dw.Backward(dy), dense.Backward(dy), 1e-6)
		for ch := range g.C {
			near(t, "dw", dw.DW[ch*k:(ch+1)*k], dense.DW[(ch*g.C+ch)*k:(ch*g.C+ch+1)*k], 1e-6)
		}
		near(t, "db", dw.DB, dense.DB, 1e-6)
	}
}

func TestSigmoidGradient(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 3))
	x := randn(r, 2*7)
	x[0], x[1] = 30, -30 // saturated: σ' ≈ 0
	modeltest.CheckLayer(t, "sigmoid", &Sigmoid{}, x, 2, nil, modeltest.Config{MaxChecks: -1})
	y := (&Sigmoid{}).Forward([]float32{0, 2, -2}, 1, false)
	for i, want := range []float64{0.5, 1 / (1 + math.Exp(-2)), 1 / (1 + math.Exp(2))} {
		if math.Abs(float64(y[i])-want) > 1e-7 {
			t.Errorf("σ[%d] = %v, want %v", i, y[i], want)
		}
	}
}

func TestSqueezeExciteGradient(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 4))
	for i, sz := range []struct{ c, hidden, hw, batch int }{{1, 1, 1, 1}, {4, 2, 6, 2}, {6, 3, 1, 3}} {
		l := NewSqueezeExcite(sz.c, sz.hidden)
		for _, lin := range []*Linear{l.FC1, l.FC2} {
			lin.W, lin.B = make([]float32, lin.In*lin.Out), make([]float32, lin.Out)
			lin.DW, lin.DB = make([]float32, lin.In*lin.Out), make([]float32, lin.Out)
		}
		l.Init(r)
		x := randn(r, sz.batch*sz.c*sz.hw)
		modeltest.CheckLayer(t, "se", l, x, sz.batch, []modeltest.Param{
			{Name: "fc1.weight", Value: l.FC1.W, Grad: l.FC1.DW},
			{Name: "fc1.bias", Value: l.FC1.B, Grad: l.FC1.DB},
			{Name: "fc2.weight", Value: l.FC2.W, Grad: l.FC2.DW},
			{Name: "fc2.bias", Value: l.FC2.B, Grad: l.FC2.DB},
		}, modeltest.Config{Seed: uint64(i), Eps: 1e-3, MaxChecks: -1})
	}
}

func TestTokenLayersGradient(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 5))
	mt := &MapTokens{D: 3, Tokens: 5}
	mt.Pos, mt.DPos = make([]float32, 15), make([]float32, 15)
	mt.Init(r)
	x := randn(r, 2*15)
	modeltest.CheckLayer(t, "maptokens", mt, x, 2, []modeltest.Param{{Name: "pos", Value: mt.Pos, Grad: mt.DPos}}, modeltest.Config{MaxChecks: -1})
	// token p of sample n holds the feature map's column (n, :, p)
	y := mt.Forward(x, 2, false)
	if got, want := y[(1*5+4)*3+2]-mt.Pos[4*3+2], x[(1*3+2)*5+4]; math.Abs(float64(got-want)) > 1e-6 {
		t.Errorf("token (1, 4)[2] = %v, want x[1, 2, 4] = %v", got, want)
	}
	modeltest.CheckLayer(t, "meantokens", &MeanTokens{Tokens: 5, D: 3}, x, 2, nil, modeltest.Config{MaxChecks: -1})
}

// smallestInputs is the smallest square input of every architecture
// (with 3 channels): where a pool, an unpadded kernel or a patch stops
// fitting. Every new architecture must be written down here.
var smallestInputs = map[string]int{
	"logreg": 1, "mlp": 1, "lenet5": 12, "cnn": 6, "fedcnn": 4, "resnet8": 1, "vit-tiny": 7,
	"resnet18": 1, "se-resnet8": 1, "mobilenet": 1, "mobilenet-0.5": 1, "convvit": 1,
}

// TestNewRefusesSmallInputs checks, for every architecture, that New
// builds (and runs) the smallest input it takes, and refuses one pixel
// less in either direction with an error that names the architecture,
// the input and the smallest size, never a panic.
func TestNewRefusesSmallInputs(t *testing.T) {
	for _, name := range Names() {
		s, ok := smallestInputs[name]
		if !ok {
			t.Errorf("%s: no smallest input written down", name)
			continue
		}
		n, err := New(name, Options{Channels: 3, Height: s, Width: s, Classes: 3})
		if err != nil {
			t.Errorf("%s: New at %d×%d: %v", name, s, s, err)
			continue
		}
		n.Forward(make([]float32, 2*n.InputSize()), 2, true)
		if s == 1 {
			continue
		}
		for _, hw := range [][2]int{{s - 1, s}, {s, s - 1}, {s - 1, s - 1}} {
			n, err := New(name, Options{Channels: 3, Height: hw[0], Width: hw[1], Classes: 3})
			if err == nil {
				t.Errorf("%s: New at %d×%d succeeded (%d parameters), want an error", name, hw[0], hw[1], n.NumParams())
				continue
			}
			for _, want := range []string{name + " cannot take 3×", "smallest square input it takes is"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("%s at %d×%d: error %q does not say %q", name, hw[0], hw[1], err, want)
				}
			}
		}
	}
	_, err := New("lenet5", Options{Channels: 1, Height: 8, Width: 8})
	if want := `models: lenet5 cannot take 1×8×8 inputs: layer "3", a 5×5 convolution, gets 4×4 planes, smaller than its kernel; the smallest square input it takes is 12×12`; err == nil || err.Error() != want {
		t.Errorf("lenet5 at 1×8×8: error %v, want %q", err, want)
	}
}

// TestBuildsNeverPanic builds every architecture's layers (without
// allocating parameters) for every input up to 13×13: each build either
// succeeds or returns an error, and it succeeds exactly from the smallest
// input on.
func TestBuildsNeverPanic(t *testing.T) {
	for _, name := range Names() {
		for h := 1; h <= 13; h++ {
			for w := 1; w <= 13; w++ {
				opt := Options{Channels: 2, Height: h, Width: w, Classes: 2}
				_, _, err := build(archs[name], &builder{}, name, opt)
				if s := smallestInputs[name]; (err == nil) != (h >= s && w >= s) {
					t.Errorf("%s at %d×%d: error %v, smallest input %d×%d", name, h, w, err, s, s)
				}
			}
		}
	}
}

// BenchmarkCIFARStep measures one training step (forward, loss,
// backward) of the colour architectures on 3×32×32 inputs with 10
// classes at batch 64, on one thread and the current GEMM backend
// (images/s reported):
//
//	go test ./models -run XXX -bench CIFARStep/mobilenet -benchtime 5x
func BenchmarkCIFARStep(b *testing.B) {
	for _, name := range []string{"resnet8", "se-resnet8", "mobilenet", "mobilenet-0.5", "resnet18", "convvit"} {
		b.Run(name, func(b *testing.B) {
			n, err := New(name, Options{Channels: 3, Height: 32, Width: 32, Seed: 1})
			if err != nil {
				b.Fatal(err)
			}
			const batch = 64
			r := rand.New(rand.NewPCG(8, 8))
			x := randn(r, batch*n.InputSize())
			labels := make([]uint8, batch)
			for i := range labels {
				labels[i] = uint8(i % 10)
			}
			d := make([]float32, batch*10)
			step := func() {
				n.ZeroGrad()
				SoftmaxCrossEntropy(n.Forward(x, batch, true), labels, 10, d)
				n.Backward(d)
			}
			step()
			b.ReportAllocs()
			for b.Loop() {
				step()
			}
			b.ReportMetric(float64(batch)*float64(b.N)/b.Elapsed().Seconds(), "images/s")
		})
	}
}
