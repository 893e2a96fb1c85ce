package eval

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-12 }

func TestConfusion(t *testing.T) {
	c := NewConfusion(4)
	// Predictions: 0, 1, 0 (tie → first), 2.
	c.Add([]float32{
		2, 1, 0, 0,
		0, 3, 1, 0,
		5, 0, 5, 0,
		0, 1, 2, 0,
	}, []uint8{0, 1, 2, 2})
	// A second batch: 0 (tie), 2, 3.
	c.Add([]float32{
		1, 1, 0, 0,
		0, 0, 9, 0,
		0, 0, 0, 1,
	}, []uint8{1, 0, 2})
	want := [][]int64{
		{1, 0, 1, 0},
		{1, 1, 0, 0},
		{1, 0, 1, 1},
		{0, 0, 0, 0},
	}
	got := c.Matrix()
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Fatalf("matrix %v, want %v", got, want)
		}
	}
	if c.Total() != 7 || c.Correct() != 3 || c.Count(2, 3) != 1 || !near(c.Accuracy(), 3.0/7) {
		t.Fatalf("total %d correct %d accuracy %v, want 7, 3, 3/7", c.Total(), c.Correct(), c.Accuracy())
	}
	acc := c.ClassAccuracy(nil)
	if !near(acc[0], 0.5) || !near(acc[1], 0.5) || !near(acc[2], 1.0/3) || !math.IsNaN(acc[3]) {
		t.Fatalf("per-class accuracy %v, want [1/2 1/2 1/3 NaN]", acc)
	}
	if b := c.BalancedAccuracy(); !near(b, 4.0/9) {
		t.Fatalf("balanced accuracy %v, want 4/9", b)
	}
	// Merging into an empty matrix copies; Reset empties.
	d := NewConfusion(4)
	d.Merge(c)
	d.Merge(c)
	if d.Total() != 14 || d.Count(1, 0) != 2 || !near(d.Accuracy(), 3.0/7) {
		t.Fatalf("merged twice: total %d, (1,0)=%d", d.Total(), d.Count(1, 0))
	}
	d.Reset()
	if d.Total() != 0 || d.Accuracy() != 0 || d.BalancedAccuracy() != 0 {
		t.Fatal("Reset left counts")
	}
}

func TestConfusionAllocs(t *testing.T) {
	c := NewConfusion(3)
	logits := make([]float32, 8*3)
	labels := make([]uint8, 8)
	c.Add(logits, labels) // grows the scratch once
	if n := testing.AllocsPerRun(10, func() { c.Add(logits, labels) }); n != 0 {
		t.Fatalf("Add allocates %v times", n)
	}
}

// The example of TestMultiLabel, worked by hand (logit > 0 predicts yes):
//
//	example  logits              targets    predicted
//	0        2,   -1,  0.5, -1   1 0 1 0    1 0 1 0  (exact)
//	1        -3,   1, -0.5, -1   1 1 0 0    0 1 0 0
//	2        0,    2,   -2, -1   0 1 0 0    0 1 0 0  (exact; logit 0 is no)
//	3        1,   -2,  0.5, -1   0 0 0 0    1 0 1 0
//
// class 0: TP 1 FP 1 FN 1, F1 1/2; ranked 0+ 3− 2− 1+: AP = ½·1 + ½·2/4 = 3/4
// class 1: TP 2, F1 1; ranked 2+ 1+ …: AP 1
// class 2: TP 1 FP 1, F1 2/3; examples 0+ and 3− tie at 0.5: AP = 1·1/2
// class 3: no positives, none predicted: F1 0, AP NaN (left out of mAP)
// micro F1 = 2·4/(2·4 + 2 + 1) = 8/11; macro F1 = (1/2 + 1 + 2/3 + 0)/4
// = 13/24; mAP = (3/4 + 1 + 1/2)/3 = 3/4; subset accuracy 2/4.
var (
	mlLogits = []float32{
		2, -1, 0.5, -1,
		-3, 1, -0.5, -1,
		0, 2, -2, -1,
		1, -2, 0.5, -1,
	}
	mlTargets = []float32{
		1, 0, 1, 0,
		1, 1, 0, 0,
		0, 1, 0, 0,
		0, 0, 0, 0,
	}
)

func checkML(t *testing.T, m *MultiLabel) {
	t.Helper()
	if m.Len() != 4 {
		t.Fatalf("Len %d, want 4", m.Len())
	}
	if f := m.ClassF1(nil); !near(f[0], 0.5) || !near(f[1], 1) || !near(f[2], 2.0/3) || f[3] != 0 {
		t.Errorf("per-class F1 %v, want [1/2 1 2/3 0]", f)
	}
	if f := m.MicroF1(); !near(f, 8.0/11) {
		t.Errorf("micro F1 %v, want 8/11", f)
	}
	if f := m.MacroF1(); !near(f, 13.0/24) {
		t.Errorf("macro F1 %v, want 13/24", f)
	}
	if a := m.SubsetAccuracy(); a != 0.5 {
		t.Errorf("subset accuracy %v, want 1/2", a)
	}
	if ap := m.ClassAP(nil); !near(ap[0], 0.75) || !near(ap[1], 1) || !near(ap[2], 0.5) || !math.IsNaN(ap[3]) {
		t.Errorf("per-class AP %v, want [3/4 1 1/2 NaN]", ap)
	}
	if v := m.MAP(); !near(v, 0.75) {
		t.Errorf("mAP %v, want 3/4", v)
	}
}

func TestMultiLabel(t *testing.T) {
	whole := NewMultiLabel(4)
	whole.Add(mlLogits, mlTargets)
	checkML(t, whole)
	// The same examples in two batches, and merged from two accumulators.
	parts := NewMultiLabel(4)
	parts.Add(mlLogits[:4], mlTargets[:4])
	parts.Add(mlLogits[4:], mlTargets[4:])
	checkML(t, parts)
	a, b := NewMultiLabel(4), NewMultiLabel(4)
	a.Add(mlLogits[:8], mlTargets[:8])
	b.Add(mlLogits[8:], mlTargets[8:])
	a.Merge(b)
	checkML(t, a)
	a.Reset()
	if a.Len() != 0 || a.MicroF1() != 0 || a.MAP() != 0 || a.SubsetAccuracy() != 0 {
		t.Fatal("Reset left examples")
	}
	a.Add(mlLogits, mlTargets)
	checkML(t, a)
}

// TestAveragePrecisionRanks compares ClassAP on tie-free random scores
// with its other definition: the mean over positives of the precision
// among the examples ranked at or above it.
func TestAveragePrecisionRanks(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const n, classes = 50, 3
	logits, targets := make([]float32, n*classes), make([]float32, n*classes)
	for i := range logits {
		logits[i] = float32(r.NormFloat64())
		if r.IntN(3) == 0 {
			targets[i] = 1
		}
	}
	m := NewMultiLabel(classes)
	m.Add(logits, targets)
	ap := m.ClassAP(nil)
	for j := range classes {
		var sum float64
		pos := 0
		for i := range n {
			if targets[i*classes+j] == 0 {
				continue
			}
			pos++
			above, hits := 0, 0
			for k := range n {
				if logits[k*classes+j] >= logits[i*classes+j] {
					above++
					if targets[k*classes+j] == 1 {
						hits++
					}
				}
			}
			sum += float64(hits) / float64(above)
		}
		if want := sum / float64(pos); math.Abs(ap[j]-want) > 1e-12 {
			t.Errorf("class %d: AP %v, by ranks %v", j, ap[j], want)
		}
	}
}

func TestMultiLabelNaNLogits(t *testing.T) {
	nan := float32(math.NaN())
	m := NewMultiLabel(1)
	m.Add([]float32{nan, 1, nan, -1}, []float32{1, 1, 0, 0})
	if ap := m.MAP(); math.IsNaN(ap) || ap <= 0 || ap > 1 {
		t.Fatalf("mAP with NaN logits = %v", ap)
	}
}

func TestPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"confusion classes":  func() { NewConfusion(0) },
		"confusion logits":   func() { NewConfusion(2).Add([]float32{1, 2, 3}, []uint8{0, 1}) },
		"confusion label":    func() { NewConfusion(2).Add([]float32{1, 2}, []uint8{2}) },
		"confusion pred":     func() { NewConfusion(2).AddPredictions([]int{2}, []uint8{0}) },
		"confusion merge":    func() { NewConfusion(2).Merge(NewConfusion(3)) },
		"multilabel classes": func() { NewMultiLabel(0) },
		"multilabel shape":   func() { NewMultiLabel(2).Add([]float32{1, 2, 3}, []float32{1, 2, 3}) },
		"multilabel targets": func() { NewMultiLabel(2).Add([]float32{1, 2}, []float32{1}) },
		"multilabel merge":   func() { NewMultiLabel(2).Merge(NewMultiLabel(3)) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if s, _ := recover().(string); len(s) < 6 || s[:6] != "eval: " {
					t.Fatalf("recovered %q, want a panic starting with \"eval: \"", s)
				}
			}()
			f()
		})
	}
}
