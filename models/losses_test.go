package models

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gradsync/gradsync/models/modeltest"
)

// Expected values from torch 1.13 in float64 (python3 -c: F.cross_entropy /
// F.binary_cross_entropy_with_logits on these inputs, then .backward()).
var (
	ceLogits = []float32{1.5, -0.3, 0.2, 2.0, 0.1, 0.4, -1.2, 0.0, -2.0, 3.0, 0.5, 0.5}
	ceLabels = []uint8{3, 0, 1}
	ceWeight = []float32{0.5, 2.0, 1.0, 3.0}
)

func TestSoftmaxCrossEntropyWithTorch(t *testing.T) {
	cases := []struct {
		name string
		opt  CEOptions
		loss float64
		grad []float64
	}{
		{"plain", CEOptions{}, 0.681782119689832, []float64{
			0.107995374336, 0.017851515098, 0.029432173095, -0.155279062529, -0.23883041705, 0.127565594456,
			0.025755047955, 0.085509774639, 0.001918154492, -0.048653965522, 0.023367905515, 0.023367905515}},
		{"weight", CEOptions{ClassWeights: ceWeight}, 0.5139961578617562, []float64{
			0.176719703459, 0.02921157016, 0.048161737792, -0.25409301141, -0.065135568286, 0.03479061667,
			0.007024103988, 0.023320847629, 0.002092532173, -0.053077053297, 0.025492260562, 0.025492260562}},
		{"smooth 0.1", CEOptions{LabelSmoothing: 0.1}, 0.8126154534826179, []float64{
			0.099662041002, 0.009518181765, 0.021098839762, -0.130279062529, -0.21383041705, 0.119232261123,
			0.017421714622, 0.077176441306, -0.006415178841, -0.023653965522, 0.015034572182, 0.015034572182}},
		{"weight+smooth 0.2", CEOptions{ClassWeights: ceWeight, LabelSmoothing: 0.2}, 0.7152401208304672, []float64{
			0.155974942763, 0.008352024714, 0.034656002736, -0.198982970213, -0.03990111947, 0.03226457599,
			0.001094041691, 0.006542501789, -0.002531392329, -0.010177572889, 0.0154453917, -0.002736426482}},
		{"weight+smooth 1", CEOptions{ClassWeights: ceWeight, LabelSmoothing: 1}, 1.5202159727053106, []float64{
			0.072995899979, -0.075086157072, -0.019366937484, 0.021457194577, 0.061036675796, 0.022160413268,
			-0.022626207494, -0.06057088157, -0.021027090337, 0.161420348742, -0.024742083748, -0.115651174657}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := make([]float32, len(ceLogits))
			got := SoftmaxCrossEntropyWith(ceLogits, ceLabels, 4, c.opt, d)
			if math.Abs(float64(got)-c.loss) > 1e-6*c.loss {
				t.Errorf("loss = %.9g, torch %.9g", got, c.loss)
			}
			for i, g := range c.grad {
				if math.Abs(float64(d[i])-g) > 1e-7+1e-6*math.Abs(g) {
					t.Errorf("dlogits[%d] = %.9g, torch %.9g", i, d[i], g)
				}
			}
		})
	}
}

func TestSoftmaxCrossEntropyWithMatchesPlain(t *testing.T) {
	// Zero options: bit-identical to SoftmaxCrossEntropy. All-ones weights
	// and ε = 0: the same loss up to rounding.
	logits := lossTestFloats(6*7, 3)
	labels := []uint8{0, 6, 3, 3, 1, 5}
	d0, d1, d2 := make([]float32, len(logits)), make([]float32, len(logits)), make([]float32, len(logits))
	l0 := SoftmaxCrossEntropy(logits, labels, 7, d0)
	l1 := SoftmaxCrossEntropyWith(logits, labels, 7, CEOptions{}, d1)
	ones := []float32{1, 1, 1, 1, 1, 1, 1}
	l2 := SoftmaxCrossEntropyWith(logits, labels, 7, CEOptions{ClassWeights: ones}, d2)
	if l0 != l1 {
		t.Errorf("zero options: %v, plain %v", l1, l0)
	}
	if math.Abs(float64(l2-l0)) > 1e-6 {
		t.Errorf("unit weights: %v, plain %v", l2, l0)
	}
	for i := range d0 {
		if d0[i] != d1[i] || math.Abs(float64(d2[i]-d0[i])) > 1e-7 {
			t.Fatalf("dlogits[%d]: plain %v, zero options %v, unit weights %v", i, d0[i], d1[i], d2[i])
		}
	}
	// Scaling all weights leaves the weighted mean unchanged.
	w := []float32{0.5, 2, 1, 3, 0.1, 4, 1}
	w10 := make([]float32, len(w))
	for i := range w {
		w10[i] = 10 * w[i]
	}
	a := SoftmaxCrossEntropyWith(logits, labels, 7, CEOptions{ClassWeights: w, LabelSmoothing: 0.3}, nil)
	b := SoftmaxCrossEntropyWith(logits, labels, 7, CEOptions{ClassWeights: w10, LabelSmoothing: 0.3}, nil)
	if math.Abs(float64(a-b)) > 1e-6*math.Abs(float64(a)) {
		t.Errorf("weights ×10 changed the loss: %v → %v", a, b)
	}
}

func TestSoftmaxCrossEntropyWithDegenerate(t *testing.T) {
	d := []float32{9, 9, 9, 9}
	// Only class 0 present, with weight 0: torch gives NaN, we give 0.
	if l := SoftmaxCrossEntropyWith([]float32{1, 2, 3, 4}, []uint8{0, 0}, 2, CEOptions{ClassWeights: []float32{0, 1}}, d); l != 0 {
		t.Errorf("zero total weight: loss %v", l)
	}
	for _, v := range d {
		if v != 0 {
			t.Fatalf("zero total weight: dlogits %v", d)
		}
	}
	if l := SoftmaxCrossEntropyWith(nil, []uint8(nil), 3, CEOptions{LabelSmoothing: 0.1}, nil); l != 0 {
		t.Errorf("empty batch: %v", l)
	}
	// Huge logits stay finite.
	l := SoftmaxCrossEntropyWith([]float32{1000, -1000}, []uint8{1}, 2, CEOptions{LabelSmoothing: 0.5}, d[:2])
	// 0.5·2000 + 0.25·(2000 + 0)
	if math.Abs(float64(l)-1500) > 1e-3 {
		t.Errorf("huge logits: loss %v, want 1500", l)
	}
}

func TestSoftmaxCrossEntropyWithGradient(t *testing.T) {
	const batch, classes = 5, 6
	logits := lossTestFloats(batch*classes, 2)
	labels := []uint8{0, 5, 2, 2, 4}
	for _, opt := range []CEOptions{
		{LabelSmoothing: 0.1},
		{ClassWeights: []float32{0.2, 1, 3, 0.5, 2, 1.5}},
		{ClassWeights: []float32{0.2, 1, 3, 0.5, 2, 1.5}, LabelSmoothing: 0.25},
	} {
		d := make([]float32, len(logits))
		SoftmaxCrossEntropyWith(logits, labels, classes, opt, d)
		f := func() float64 { return float64(SoftmaxCrossEntropyWith(logits, labels, classes, opt, nil)) }
		modeltest.CheckGrad(t, "CEWith", f, logits, d, modeltest.Config{MaxChecks: -1, Eps: 1e-2})
	}
}

func TestBCEWithLogitsTorch(t *testing.T) {
	x := []float32{0.5, -1, 30, -40, 2, 0}
	y := []float32{1, 0, 1, 1, 0.25, 0}
	pw := []float32{2, 0.5, 3}
	for _, c := range []struct {
		name string
		pw   []float32
		loss float64
		grad []float64
	}{
		{"plain", nil, 7.18456897721689, []float64{-0.0629234448, 0.044823570228, 0, -0.166666666667, 0.10513284633, 0.083333333333}},
		{"pos_weight", pw, 13.927604141016877, []float64{-0.125846889599, 0.044823570228, 0, -0.333333333333, 0.107616240538, 0.083333333333}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := make([]float32, len(x))
			got := BCEWithLogits(x, y, c.pw, d)
			if math.Abs(float64(got)-c.loss) > 1e-6*c.loss {
				t.Errorf("loss = %.9g, torch %.9g", got, c.loss)
			}
			for i, g := range c.grad {
				if math.Abs(float64(d[i])-g) > 1e-7+1e-6*math.Abs(g) {
					t.Errorf("dlogits[%d] = %.9g, torch %.9g", i, d[i], g)
				}
			}
		})
	}
	if l := BCEWithLogits(nil, nil, nil, nil); l != 0 {
		t.Errorf("empty: %v", l)
	}
}

func TestBCEWithLogitsGradient(t *testing.T) {
	logits := lossTestFloats(4*5, 3)
	targets := []float32{1, 0, 0, 1, 0.3, 0, 1, 1, 0, 0.9, 1, 1, 0, 0, 0, 0.5, 0, 1, 0, 1}
	for _, pw := range [][]float32{nil, {0.5, 1, 2, 4, 0.1}} {
		d := make([]float32, len(logits))
		BCEWithLogits(logits, targets, pw, d)
		f := func() float64 { return float64(BCEWithLogits(logits, targets, pw, nil)) }
		modeltest.CheckGrad(t, "BCEWithLogits", f, logits, d, modeltest.Config{MaxChecks: -1})
	}
}

func TestLossesPanics(t *testing.T) {
	l4 := []float32{0, 0, 0, 0}
	for name, f := range map[string]func(){
		"ce weights":     func() { SoftmaxCrossEntropyWith(l4, []uint8{0, 1}, 2, CEOptions{ClassWeights: []float32{1}}, nil) },
		"ce smoothing":   func() { SoftmaxCrossEntropyWith(l4, []uint8{0, 1}, 2, CEOptions{LabelSmoothing: 1.5}, nil) },
		"ce smoothing -": func() { SoftmaxCrossEntropyWith(l4, []uint8{0, 1}, 2, CEOptions{LabelSmoothing: -0.1}, nil) },
		"ce label":       func() { SoftmaxCrossEntropyWith(l4, []uint8{0, 2}, 2, CEOptions{LabelSmoothing: 0.1}, nil) },
		"ce logits":      func() { SoftmaxCrossEntropyWith(l4, []uint8{0}, 2, CEOptions{}, nil) },
		"ce dlogits":     func() { SoftmaxCrossEntropyWith(l4, []uint8{0, 1}, 2, CEOptions{}, l4[:3]) },
		"bce targets":    func() { BCEWithLogits(l4, l4[:3], nil, nil) },
		"bce dlogits":    func() { BCEWithLogits(l4, l4, nil, l4[:1]) },
		"bce pos_weight": func() { BCEWithLogits(l4, l4, []float32{1, 1, 1}, nil) },
	} {
		t.Run(name, func(t *testing.T) { expectPanic(t, f) })
	}
}

func TestLossesAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	logits := lossTestFloats(8*10, 1)
	labels := make([]uint8, 8)
	targets := make([]float32, len(logits))
	d := make([]float32, len(logits))
	opt := CEOptions{ClassWeights: make([]float32, 10), LabelSmoothing: 0.1}
	for i := range opt.ClassWeights {
		opt.ClassWeights[i] = 1
	}
	pw := opt.ClassWeights
	if n := testing.AllocsPerRun(20, func() {
		SoftmaxCrossEntropyWith(logits, labels, 10, opt, d)
		BCEWithLogits(logits, targets, pw, d)
	}); n != 0 {
		t.Errorf("%v allocations per call, want 0", n)
	}
}

func lossTestFloats(n int, scale float64) []float32 {
	r := rand.New(rand.NewPCG(uint64(n), 7))
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(scale * r.NormFloat64())
	}
	return out
}
