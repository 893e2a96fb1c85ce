package models

// Tests of the pooling, normalisation and dropout layers (the
// convolutions' and the transformer blocks' are in layers_test.go).

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gradsync/gradsync/models/modeltest"
)

// distinct returns n values in random order spaced at least 0.05 apart,
// so that a finite-difference step never changes which is the largest.
func distinct(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i, p := range r.Perm(n) {
		x[i] = float32(p)*0.05 - float32(n)*0.025
	}
	return x
}

var poolCases = []PoolGeom{
	{C: 1, H: 2, W: 2, K: 2, Stride: 2},
	{C: 2, H: 5, W: 4, K: 2, Stride: 2}, // odd height: the last row is dropped
	{C: 2, H: 5, W: 5, K: 3, Stride: 2},
	{C: 1, H: 4, W: 3, K: 2, Stride: 1}, // overlapping windows
	{C: 3, H: 3, W: 3, K: 3, Stride: 3},
}

func TestPoolGradients(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 1))
	for i, g := range poolCases {
		for _, batch := range []int{1, 2} {
			x := distinct(r, batch*g.C*g.H*g.W)
			cfg := modeltest.Config{Seed: uint64(i), Eps: 1e-3, MaxChecks: -1}
			modeltest.CheckLayer(t, "maxpool", NewMaxPool2D(g), x, batch, nil, cfg)
			modeltest.CheckLayer(t, "avgpool", NewAvgPool2D(g), x, batch, nil, cfg)
			modeltest.CheckLayer(t, "gap", &GlobalAvgPool{C: g.C}, x, batch, nil, cfg)
		}
	}
}

// naivePool returns max or mean over every window, straight from the definition.
func naivePool(x []float32, batch int, g PoolGeom, isMax bool) []float32 {
	var y []float32
	for p := range batch * g.C {
		for i := range g.OutH() {
			for j := range g.OutW() {
				m, s := float32(math.Inf(-1)), float32(0)
				for ki := range g.K {
					for kj := range g.K {
						v := x[(p*g.H+i*g.Stride+ki)*g.W+j*g.Stride+kj]
						m = max(m, v)
						s += v
					}
				}
				if isMax {
					y = append(y, m)
				} else {
					y = append(y, s/float32(g.K*g.K))
				}
			}
		}
	}
	return y
}

func TestPoolMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 2))
	for _, g := range append(slices.Clone(poolCases), PoolGeom{C: 6, H: 28, W: 28, K: 2, Stride: 2}, PoolGeom{C: 2, H: 7, W: 9, K: 2, Stride: 2}) {
		const batch = 3
		x := randn(r, batch*g.C*g.H*g.W)
		// ties: the first maximum gets the gradient, as in PyTorch
		x[0], x[1] = 5, 5
		if got, want := NewMaxPool2D(g).Forward(x, batch, true), naivePool(x, batch, g, true); !slices.Equal(got, want) {
			t.Fatalf("maxpool %+v: %v, want %v", g, got, want)
		}
		mp := NewMaxPool2D(g)
		mp.Forward(x, batch, true)
		dy := make([]float32, batch*g.OutSize())
		dy[0] = 1
		if dx := mp.Backward(dy); dx[0] != 1 || dx[1] != 0 {
			t.Fatalf("maxpool %+v: tie gradient dx[0:2] = %v, want [1 0]", g, dx[:2])
		}
		got, want := NewAvgPool2D(g).Forward(x, batch, true), naivePool(x, batch, g, false)
		for i := range want {
			if math.Abs(float64(got[i]-want[i])) > 1e-6 {
				t.Fatalf("avgpool %+v: y[%d] = %v, want %v", g, i, got[i], want[i])
			}
		}
	}
}

func TestMaxPoolNaN(t *testing.T) {
	for _, g := range []PoolGeom{{C: 1, H: 2, W: 2, K: 2, Stride: 2}, {C: 1, H: 3, W: 3, K: 3, Stride: 1}} {
		x := make([]float32, g.H*g.W)
		x[1] = float32(math.NaN())
		if y := NewMaxPool2D(g).Forward(x, 1, true); !math.IsNaN(float64(y[0])) {
			t.Errorf("%+v: max over a NaN = %v, want NaN", g, y[0])
		}
	}
}

func newBoundBN(c int) *BatchNorm2d {
	l := NewBatchNorm2d(c)
	l.Weight, l.Bias, l.DWeight, l.DBias = make([]float32, c), make([]float32, c), make([]float32, c), make([]float32, c)
	l.RunningMean, l.RunningVar = make([]float32, c), make([]float32, c)
	l.Init()
	return l
}

func TestBatchNormGradient(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 1))
	for _, train := range []bool{true, false} {
		for i, sz := range []struct{ batch, c, hw int }{{2, 1, 3}, {3, 2, 4}, {1, 3, 5}} {
			l := newBoundBN(sz.c)
			copy(l.Weight, randn(r, sz.c))
			copy(l.Bias, randn(r, sz.c))
			for c := range sz.c {
				l.RunningMean[c], l.RunningVar[c] = float32(r.NormFloat64()), 0.5+r.Float32()
			}
			x := randn(r, sz.batch*sz.c*sz.hw)
			layer := modeltest.Layer(l)
			if !train {
				layer = evalOnly{l}
			}
			modeltest.CheckLayer(t, "batchnorm", layer, x, sz.batch, []modeltest.Param{
				{Name: "weight", Value: l.Weight, Grad: l.DWeight},
				{Name: "bias", Value: l.Bias, Grad: l.DBias},
			}, modeltest.Config{Seed: uint64(i), Eps: 1e-3})
		}
	}
}

// evalOnly runs a layer's Forward in evaluation mode whatever it is asked.
type evalOnly struct{ Layer }

func (e evalOnly) Forward(x []float32, batch int, _ bool) []float32 {
	return e.Layer.Forward(x, batch, false)
}

func TestBatchNormRunningStats(t *testing.T) {
	l := newBoundBN(2)
	// batch 2, 2 channels, 2 values per plane
	x := []float32{1, 3, 10, 10, 5, 7, 20, 30}
	y := l.Forward(x, 2, true)
	// channel 0: values 1,3,5,7: mean 4, biased var 5, unbiased 20/3
	// channel 1: values 10,10,20,30: mean 17.5, biased var 68.75, unbiased 91.666…
	wantMean := []float32{0.4, 1.75}
	wantVar := []float32{0.9 + 0.1*20.0/3, 0.9 + 0.1*275.0/3}
	for c := range 2 {
		if math.Abs(float64(l.RunningMean[c]-wantMean[c])) > 1e-6 || math.Abs(float64(l.RunningVar[c]-wantVar[c])) > 1e-5 {
			t.Fatalf("running stats %v %v, want %v %v", l.RunningMean, l.RunningVar, wantMean, wantVar)
		}
	}
	if want := float32((1 - 4) / math.Sqrt(5+1e-5)); math.Abs(float64(y[0]-want)) > 1e-6 {
		t.Fatalf("y[0] = %v, want %v", y[0], want)
	}
	// evaluation mode uses the running statistics and leaves them alone
	before := slices.Clone(l.RunningVar)
	y = l.Forward(x, 2, false)
	if want := float32((1 - 0.4) / math.Sqrt(float64(wantVar[0])+1e-5)); math.Abs(float64(y[0]-want)) > 1e-6 {
		t.Fatalf("eval y[0] = %v, want %v", y[0], want)
	}
	if !slices.Equal(before, l.RunningVar) {
		t.Fatal("evaluation-mode Forward changed the running variance")
	}
}

func TestLayerNormGELUGradient(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 1))
	for i, sz := range []struct{ rows, d int }{{1, 1}, {2, 3}, {6, 8}} {
		l := NewLayerNorm(sz.d)
		l.Weight, l.Bias = randn(r, sz.d), randn(r, sz.d)
		l.DWeight, l.DBias = make([]float32, sz.d), make([]float32, sz.d)
		x := randn(r, sz.rows*sz.d)
		cfg := modeltest.Config{Seed: uint64(i), Eps: 1e-3}
		if sz.d > 1 { // with one value a row normalises to 0 whatever x is
			modeltest.CheckLayer(t, "layernorm", l, x, 1, []modeltest.Param{
				{Name: "weight", Value: l.Weight, Grad: l.DWeight},
				{Name: "bias", Value: l.Bias, Grad: l.DBias},
			}, cfg)
		}
		modeltest.CheckLayer(t, "gelu", &GELU{}, x, 1, nil, cfg)
	}
	// GELU values from torch.nn.functional.gelu
	y := (&GELU{}).Forward([]float32{-3, -1, 0, 0.5, 2}, 1, false)
	want := []float32{-0.0040496, -0.15865526, 0, 0.34573123, 1.9544997}
	for i := range want {
		if math.Abs(float64(y[i]-want[i])) > 1e-6 {
			t.Fatalf("gelu = %v, want %v", y, want)
		}
	}
}

func TestDropout(t *testing.T) {
	const n = 20000
	x := make([]float32, n)
	for i := range x {
		x[i] = 1
	}
	l := NewDropout(0.25, 9)
	y := slices.Clone(l.Forward(x, 4, true))
	zeros := 0
	for _, v := range y {
		switch v {
		case 0:
			zeros++
		case 1 / 0.75:
		default:
			t.Fatalf("dropout output %v, want 0 or 1/0.75", v)
		}
	}
	if f := float64(zeros) / n; math.Abs(f-0.25) > 0.015 {
		t.Fatalf("dropped fraction %v, want about 0.25", f)
	}
	dy := randn(rand.New(rand.NewPCG(1, 1)), n)
	dx := l.Backward(dy)
	for i := range dx {
		if dx[i] != dy[i]*y[i] {
			t.Fatalf("dx[%d] = %v, want dy·mask = %v", i, dx[i], dy[i]*y[i])
		}
	}
	// the next step draws a different mask; a fresh layer with the same seed replays them
	y2 := l.Forward(x, 4, true)
	if slices.Equal(y, y2) {
		t.Fatal("two training steps drew the same mask")
	}
	if again := NewDropout(0.25, 9).Forward(x, 4, true); !slices.Equal(again, y) {
		t.Fatal("same seed, first step: different mask")
	}
	// evaluation: identity, borrowed
	if ye := l.Forward(x, 4, false); &ye[0] != &x[0] || &l.Backward(dy)[0] != &dy[0] {
		t.Fatal("evaluation-mode dropout is not the identity")
	}
}

// TestDropoutRates checks the dropped fraction at small and large P and
// on lengths that end in a partial mask word, and that Backward applies
// Forward's mask value for value.
func TestDropoutRates(t *testing.T) {
	for _, c := range []struct {
		p   float32
		n   int
		tol float64
	}{{0.001, 200003, 0.0004}, {0.5, 100001, 0.006}, {0.9, 99999, 0.006}, {0.25, 1, 1}, {0.25, 63, 1}, {0.25, 65, 1}, {0.25, 130, 1}} {
		x := randn(rand.New(rand.NewPCG(2, uint64(c.n))), c.n)
		l := NewDropout(c.p, 5)
		y := slices.Clone(l.Forward(x, 1, true))
		zeros := 0
		scale := 1 / (1 - c.p)
		for i, v := range y {
			switch v {
			case 0:
				zeros++
			case x[i] * scale:
			default:
				t.Fatalf("p=%v n=%d: y[%d] = %v, want 0 or %v", c.p, c.n, i, v, x[i]*scale)
			}
		}
		if f := float64(zeros) / float64(c.n); math.Abs(f-float64(c.p)) > c.tol {
			t.Errorf("p=%v n=%d: dropped fraction %v", c.p, c.n, f)
		}
		dx := l.Backward(x)
		if !slices.Equal(dx, y) {
			t.Fatalf("p=%v n=%d: Backward(x) differs from Forward(x)", c.p, c.n)
		}
	}
}
