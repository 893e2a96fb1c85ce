package federated

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gradsync/gradsync/models"
)

func TestClassBalancedWeights(t *testing.T) {
	sum := func(w []float64) (s float64) {
		for _, v := range w {
			s += v
		}
		return s
	}
	counts := []int{1000, 100, 10, 1}
	// β = 0: no reweighting.
	w, err := ClassBalancedWeights(counts, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range w {
		if math.Abs(v-1) > 1e-12 {
			t.Fatalf("β = 0: %v, want all 1", w)
		}
	}
	// β = 0.99: by hand, w_c ∝ 0.01/(1 − 0.99^n).
	w, err = ClassBalancedWeights(counts, 0.99)
	if err != nil {
		t.Fatal(err)
	}
	raw := make([]float64, 4)
	var rs float64
	for c, n := range counts {
		raw[c] = 0.01 / (1 - math.Pow(0.99, float64(n)))
		rs += raw[c]
	}
	for c := range w {
		if want := raw[c] * 4 / rs; math.Abs(w[c]-want) > 1e-12*want {
			t.Fatalf("β = 0.99: w[%d] = %v, want %v", c, w[c], want)
		}
	}
	if math.Abs(sum(w)-4) > 1e-12 || !(w[0] < w[1] && w[1] < w[2] && w[2] < w[3]) {
		t.Fatalf("β = 0.99: %v, want increasing and summing to 4", w)
	}
	// β → 1: inverse frequency.
	w, err = ClassBalancedWeights([]int{10, 20, 40}, 1-1e-12)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(w[0]/w[1]-2) > 1e-6 || math.Abs(w[1]/w[2]-2) > 1e-6 {
		t.Fatalf("β → 1: %v, want ratios of inverse frequency", w)
	}
	// Absent classes weigh 0; the present share the total.
	w, err = ClassBalancedWeights([]int{0, 5, 0, 5}, 0.9)
	if err != nil {
		t.Fatal(err)
	}
	if w[0] != 0 || w[2] != 0 || math.Abs(w[1]-2) > 1e-12 || math.Abs(w[3]-2) > 1e-12 {
		t.Fatalf("absent classes: %v, want [0 2 0 2]", w)
	}
	if w, err = ClassBalancedWeights([]int{0, 0}, 0.9); err != nil || w[0] != 0 || w[1] != 0 {
		t.Fatalf("all absent: %v, %v", w, err)
	}
	for _, bad := range []float64{-0.1, 1, math.NaN()} {
		if _, err := ClassBalancedWeights(counts, bad); err == nil {
			t.Errorf("β = %v accepted", bad)
		}
	}
	if _, err := ClassBalancedWeights([]int{1, -1}, 0.9); err == nil {
		t.Error("negative count accepted")
	}
}

// Weighted cross-entropy (models.SoftmaxCrossEntropyWith) with equal weights is the plain loss; with unequal
// weights its gradient matches finite differences.
func TestWeightedCrossEntropy(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	const batch, classes = 6, 3
	logits := make([]float32, batch*classes)
	for i := range logits {
		logits[i] = float32(r.NormFloat64())
	}
	y := []uint8{0, 1, 2, 2, 1, 2}
	d0, d1 := make([]float32, len(logits)), make([]float32, len(logits))
	l0 := models.SoftmaxCrossEntropy(logits, y, classes, d0)
	l1 := models.SoftmaxCrossEntropyWith(logits, y, classes, models.CEOptions{ClassWeights: []float32{2, 2, 2}}, d1)
	if math.Abs(float64(l0-l1)) > 1e-6 {
		t.Fatalf("equal weights: %v, plain %v", l1, l0)
	}
	for i := range d0 {
		if math.Abs(float64(d0[i]-d1[i])) > 1e-6 {
			t.Fatalf("equal weights: dlogits[%d] %v, plain %v", i, d1[i], d0[i])
		}
	}
	w := []float32{3, 1, 0.5}
	models.SoftmaxCrossEntropyWith(logits, y, classes, models.CEOptions{ClassWeights: w}, d1)
	// The weighted mean by hand.
	var num, den float64
	for i, c := range y {
		num += float64(w[c]) * float64(models.SoftmaxCrossEntropy(logits[i*classes:(i+1)*classes], y[i:i+1], classes, nil))
		den += float64(w[c])
	}
	if l := models.SoftmaxCrossEntropyWith(logits, y, classes, models.CEOptions{ClassWeights: w}, make([]float32, len(logits))); math.Abs(float64(l)-num/den) > 1e-6 {
		t.Fatalf("weighted loss %v, want %v", l, num/den)
	}
	const eps = 1e-2
	for i := range logits {
		v := logits[i]
		logits[i] = v + eps
		up := models.SoftmaxCrossEntropyWith(logits, y, classes, models.CEOptions{ClassWeights: w}, make([]float32, len(logits)))
		logits[i] = v - eps
		down := models.SoftmaxCrossEntropyWith(logits, y, classes, models.CEOptions{ClassWeights: w}, make([]float32, len(logits)))
		logits[i] = v
		if fd := float64(up-down) / (2 * eps); math.Abs(fd-float64(d1[i])) > 1e-3 {
			t.Fatalf("dlogits[%d] = %v, finite difference %v", i, d1[i], fd)
		}
	}
}
