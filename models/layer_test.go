package models

import (
	"math/rand/v2"
	"testing"

	"github.com/gradsync/gradsync/internal/kernels"
	"github.com/gradsync/gradsync/models/modeltest"
)

// backends lists the GEMM backends that load here.
func backends() []string {
	names := []string{"gonum"}
	prev := kernels.Backend()
	if kernels.SetBackend("openblas") == nil {
		names = append(names, "openblas")
	}
	if err := kernels.SetBackend(prev); err != nil {
		panic(err)
	}
	return names
}

// forEachBackend runs f once per backend as a subtest. The backend is
// put back by a cleanup, which runs once the subtests f started have
// ended too, so f may start parallel subtests; those must not call
// backends (it switches the backend to probe it).
func forEachBackend(t *testing.T, f func(t *testing.T)) {
	for _, be := range backends() {
		t.Run(be, func(t *testing.T) {
			prev := kernels.Backend()
			if err := kernels.SetBackend(be); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { kernels.SetBackend(prev) })
			f(t)
		})
	}
}

func randn(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

// newBoundLinear returns a Linear with its own initialised buffers.
func newBoundLinear(in, out int, r *rand.Rand) *Linear {
	l := NewLinear(in, out)
	l.W, l.B = make([]float32, in*out), make([]float32, out)
	l.DW, l.DB = make([]float32, in*out), make([]float32, out)
	l.Init(r)
	return l
}

func TestLinearGradient(t *testing.T) {
	forEachBackend(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(1, 1))
		for _, sz := range []struct{ batch, in, out int }{{1, 1, 1}, {3, 5, 2}, {4, 17, 9}, {2, 65, 3}} {
			l := newBoundLinear(sz.in, sz.out, r)
			x := randn(r, sz.batch*sz.in)
			modeltest.CheckLayer(t, "linear", l, x, sz.batch, []modeltest.Param{
				{Name: "weight", Value: l.W, Grad: l.DW},
				{Name: "bias", Value: l.B, Grad: l.DB},
			}, modeltest.Config{Seed: uint64(sz.in)})
		}
	})
}

func TestLinearForwardValues(t *testing.T) {
	l := NewLinear(2, 3)
	l.W = []float32{1, 2, 3, 4, 5, 6} // (out=3, in=2)
	l.B = []float32{0.5, -1, 0}
	l.DW, l.DB = make([]float32, 6), make([]float32, 3)
	y := l.Forward([]float32{1, 1, 2, -1}, 2, false)
	want := []float32{3.5, 6, 11, 0.5, 1, 4}
	for i := range want {
		if y[i] != want[i] {
			t.Fatalf("y=%v, want %v", y, want)
		}
	}
	// Backward accumulates: twice the same dy gives twice the gradient.
	dy := []float32{1, 0, 0, 0, 0, 1}
	l.Backward(dy)
	l.Backward(dy)
	wantDW := []float32{2, 2, 0, 0, 4, -2}
	wantDB := []float32{2, 0, 2}
	for i := range wantDW {
		if l.DW[i] != wantDW[i] {
			t.Fatalf("DW=%v, want %v", l.DW, wantDW)
		}
	}
	for i := range wantDB {
		if l.DB[i] != wantDB[i] {
			t.Fatalf("DB=%v, want %v", l.DB, wantDB)
		}
	}
}

func TestLinearInit(t *testing.T) {
	l := newBoundLinear(100, 50, rand.New(rand.NewPCG(1, 0)))
	var maxAbs float32
	for _, v := range append(append([]float32(nil), l.W...), l.B...) {
		maxAbs = max(maxAbs, v, -v)
	}
	if maxAbs > 0.1 || maxAbs < 0.09 {
		t.Fatalf("max |param| = %v, want just under 1/√100 = 0.1", maxAbs)
	}
}

func TestReLUGradient(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	x := randn(r, 3*7)
	for i, v := range x { // keep inputs away from the kink at 0
		if v > -0.1 && v < 0.1 {
			x[i] += 0.3
		}
	}
	modeltest.CheckLayer(t, "relu", &ReLU{}, x, 3, nil, modeltest.Config{MaxChecks: -1})
}

func TestFlattenGradient(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	modeltest.CheckLayer(t, "flatten", &Flatten{}, randn(r, 2*3*4*5), 2, nil, modeltest.Config{MaxChecks: -1})
}

func TestSoftmaxCrossEntropyGradient(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	const batch, classes = 5, 7
	for _, scale := range []float32{0.1, 1, 30} {
		logits := randn(r, batch*classes)
		for i := range logits {
			logits[i] *= scale
		}
		labels := []uint8{0, 6, 3, 3, 1}
		d := make([]float32, len(logits))
		SoftmaxCrossEntropy(logits, labels, classes, d)
		modeltest.CheckGrad(t, "ce dlogits", func() float64 {
			return float64(SoftmaxCrossEntropy(logits, labels, classes, nil))
		}, logits, d, modeltest.Config{MaxChecks: -1, Eps: 1e-3})
	}
}
