package data

import (
	"math"
	"slices"
	"testing"
)

func TestSyntheticDeterministic(t *testing.T) {
	a, at, err := Synthetic(200, 50, 42)
	if err != nil {
		t.Fatal(err)
	}
	b, bt, err := Synthetic(200, 50, 42)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a.Images, b.Images) || !slices.Equal(a.Labels, b.Labels) ||
		!slices.Equal(at.Images, bt.Images) || !slices.Equal(at.Labels, bt.Labels) {
		t.Fatal("same seed gave different data")
	}
	c, _, err := Synthetic(200, 50, 43)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Equal(a.Images, c.Images) {
		t.Fatal("different seeds gave the same images")
	}
	if a.N != 200 || a.C != 1 || a.H != 28 || a.W != 28 || a.Classes != 10 || len(a.Images) != 200*784 || at.N != 50 {
		t.Fatalf("shape %d×%d×%d×%d classes %d", a.N, a.C, a.H, a.W, a.Classes)
	}
	h := Histogram(a.Labels, seq(a.N), 10)
	for k, c := range h {
		if c != 20 {
			t.Fatalf("class %d has %d examples, want 20 (balanced): %v", k, c, h)
		}
	}
}

func TestSyntheticErrors(t *testing.T) {
	for _, n := range [][2]int{{0, 1}, {1, 0}, {-1, 5}, {1 << 40, 1}} {
		if _, _, err := Synthetic(n[0], n[1], 1); err == nil {
			t.Errorf("Synthetic(%d, %d) gave no error", n[0], n[1])
		}
	}
}

// TestSyntheticLearnable trains softmax regression with plain SGD for a few
// epochs and expects high test accuracy: the set must be a usable smoke test
// for training code.
func TestSyntheticLearnable(t *testing.T) {
	train, test, err := Synthetic(2000, 500, 7)
	if err != nil {
		t.Fatal(err)
	}
	const classes, lr, epochs = 10, 0.01, 3
	d := train.ImageSize()
	w := make([]float64, classes*d)
	bias := make([]float64, classes)
	logits := make([]float64, classes)
	forward := func(x []float32) {
		for k := range classes {
			s := bias[k]
			for j, v := range x {
				s += w[k*d+j] * float64(v)
			}
			logits[k] = s
		}
		m := slices.Max(logits)
		var z float64
		for k := range logits {
			logits[k] = math.Exp(logits[k] - m)
			z += logits[k]
		}
		for k := range logits {
			logits[k] /= z
		}
	}
	s, err := NewSampler(train.N, 0, 1, 3, true, false)
	if err != nil {
		t.Fatal(err)
	}
	for e := range epochs {
		for _, i := range s.Epoch(e) {
			x := train.Image(i)
			forward(x)
			for k := range classes {
				g := logits[k]
				if k == int(train.Labels[i]) {
					g--
				}
				bias[k] -= lr * g
				for j, v := range x {
					w[k*d+j] -= lr * g * float64(v)
				}
			}
		}
	}
	correct := 0
	for i := range test.N {
		forward(test.Image(i))
		if slices.Index(logits, slices.Max(logits)) == int(test.Labels[i]) {
			correct++
		}
	}
	if acc := float64(correct) / float64(test.N); acc < 0.95 {
		t.Fatalf("softmax regression test accuracy %.3f, want ≥ 0.95", acc)
	} else {
		t.Logf("softmax regression test accuracy %.3f after %d epochs", acc, epochs)
	}
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}
func BenchmarkSynthetic(b *testing.B) {
	for b.Loop() {
		if _, _, err := Synthetic(DefaultSyntheticTrain, DefaultSyntheticTest, 1); err != nil {
			b.Fatal(err)
		}
	}
}
