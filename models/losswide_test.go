package models

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSoftmaxCrossEntropyWideLabels: int32 labels give bit for bit the
// loss and gradient of byte labels below 256, and above 255 (300 classes)
// the loss is the float64 reference −log softmax(row)[y].
func TestSoftmaxCrossEntropyWideLabels(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, classes := range []int{10, 256, 300} {
		const batch = 7
		logits := make([]float32, batch*classes)
		for i := range logits {
			logits[i] = float32(rng.NormFloat64() * 3)
		}
		wide := make([]int32, batch)
		for i := range wide {
			wide[i] = int32(rng.IntN(classes))
		}
		wide[0] = int32(classes - 1)
		dw := make([]float32, len(logits))
		lw := SoftmaxCrossEntropy(logits, wide, classes, dw)
		if classes <= 256 {
			narrow := make([]uint8, batch)
			for i, y := range wide {
				narrow[i] = uint8(y)
			}
			dn := make([]float32, len(logits))
			if ln := SoftmaxCrossEntropy(logits, narrow, classes, dn); ln != lw || !slices.Equal(dn, dw) {
				t.Errorf("%d classes: int32 labels loss %v, byte labels %v (gradients equal: %v)", classes, lw, ln, slices.Equal(dn, dw))
			}
			opt := CEOptions{LabelSmoothing: 0.1}
			if a, b := SoftmaxCrossEntropyWith(logits, wide, classes, opt, nil), SoftmaxCrossEntropyWith(logits, narrow, classes, opt, nil); a != b {
				t.Errorf("%d classes, smoothing: int32 labels %v, byte labels %v", classes, a, b)
			}
			continue
		}
		var want float64
		for i, y := range wide {
			row := logits[i*classes : (i+1)*classes]
			var s float64
			for _, v := range row {
				s += math.Exp(float64(v))
			}
			want += math.Log(s) - float64(row[y])
		}
		want /= batch
		if math.Abs(float64(lw)-want) > 1e-5*math.Abs(want) {
			t.Errorf("%d classes: loss %v, reference %v", classes, lw, want)
		}
	}
	for name, f := range map[string]func(){
		"negative": func() { SoftmaxCrossEntropy([]float32{1, 2}, []int32{-1}, 2, nil) },
		"too wide": func() { SoftmaxCrossEntropy([]float32{1, 2}, []int32{2}, 2, nil) },
		"with":     func() { SoftmaxCrossEntropyWith([]float32{1, 2}, []int32{-1}, 2, CEOptions{LabelSmoothing: 0.1}, nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s label: no panic", name)
				}
			}()
			f()
		}()
	}
}
