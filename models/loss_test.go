package models

import (
	"math"
	"testing"
)

func TestSoftmaxCrossEntropyValues(t *testing.T) {
	cases := []struct {
		logits []float32
		labels []uint8
		want   float64
	}{
		{[]float32{0, 0}, []uint8{0}, math.Ln2},
		{[]float32{1000, 0}, []uint8{0}, 0},    // no overflow
		{[]float32{1000, 0}, []uint8{1}, 1000}, // no log(0)
		{[]float32{-1000, -1000, -1000}, []uint8{2}, math.Log(3)},
		// mean of ln 2 and −log softmax([1,2])[0] = i.e. 2 + log(1+e⁻¹) − 1
		{[]float32{5, 5, 1, 2}, []uint8{0, 0}, (math.Ln2 + 2 + math.Log(1+math.Exp(-1)) - 1) / 2},
	}
	for _, c := range cases {
		got := SoftmaxCrossEntropy(c.logits, c.labels, len(c.logits)/len(c.labels), nil)
		if math.Abs(float64(got)-c.want) > 1e-5*(1+c.want) {
			t.Errorf("CE(%v, %v) = %v, want %v", c.logits, c.labels, got, c.want)
		}
	}
}

func TestSoftmaxCrossEntropyGradientValues(t *testing.T) {
	d := []float32{9, 9, 9, 9}
	SoftmaxCrossEntropy([]float32{0, 0, 1000, 0}, []uint8{1, 0}, 2, d)
	// Row 0: (softmax − onehot)/2 = ([.5,.5] − [0,1])/2; row 1: ([1,0] − [1,0])/2.
	want := []float32{0.25, -0.25, 0, 0}
	for i := range want {
		if math.Abs(float64(d[i]-want[i])) > 1e-7 {
			t.Fatalf("dlogits=%v, want %v", d, want)
		}
	}
	if got := SoftmaxCrossEntropy(nil, []uint8(nil), 10, nil); got != 0 {
		t.Fatalf("empty batch loss = %v", got)
	}
}

func TestSoftmaxCrossEntropyPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"label range":   func() { SoftmaxCrossEntropy([]float32{0, 0}, []uint8{2}, 2, nil) },
		"logits length": func() { SoftmaxCrossEntropy([]float32{0, 0, 0}, []uint8{1}, 2, nil) },
		"dlogits":       func() { SoftmaxCrossEntropy([]float32{0, 0}, []uint8{1}, 2, make([]float32, 1)) },
	} {
		t.Run(name, func(t *testing.T) { expectPanic(t, f) })
	}
}

func expectPanic(t *testing.T, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		if s, _ := recover().(string); len(s) < 8 || s[:8] != "models: " {
			t.Fatalf("recovered %q, want a panic starting with \"models: \"", s)
		}
	}()
	f()
}
