package eval

import "testing"

// TestConfusionWide: int32 labels beyond 255 are counted in their own
// row, and byte and int32 labels count alike.
func TestConfusionWide(t *testing.T) {
	c := NewConfusion(300)
	c.AddPredictionsWide([]int{299, 43, 299}, []int32{299, 299, 43})
	if c.Count(299, 299) != 1 || c.Count(299, 43) != 1 || c.Count(43, 299) != 1 || c.Total() != 3 {
		t.Errorf("counts (299,299)=%d (299,43)=%d (43,299)=%d total %d; want 1 1 1 3",
			c.Count(299, 299), c.Count(299, 43), c.Count(43, 299), c.Total())
	}
	logits := make([]float32, 2*300)
	logits[299] = 1     // sample 0 predicts 299
	logits[300+256] = 1 // sample 1 predicts 256
	c.Reset()
	c.AddWide(logits, []int32{299, 257})
	if c.Correct() != 1 || c.Count(257, 256) != 1 {
		t.Errorf("AddWide: correct %d, (257,256)=%d; want 1, 1", c.Correct(), c.Count(257, 256))
	}
	a, b := NewConfusion(4), NewConfusion(4)
	a.AddPredictions([]int{0, 3, 2}, []uint8{0, 1, 2})
	b.AddPredictionsWide([]int{0, 3, 2}, []int32{0, 1, 2})
	for y := range 4 {
		for p := range 4 {
			if a.Count(y, p) != b.Count(y, p) {
				t.Fatalf("(%d,%d): byte labels %d, int32 %d", y, p, a.Count(y, p), b.Count(y, p))
			}
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("a negative label: no panic")
		}
	}()
	c.AddPredictionsWide([]int{0}, []int32{-1})
}
