package eval

import "fmt"

// Argmax writes into dst[i] the index of the largest of the classes logits
// of sample i (the first one on ties); logits is (len(dst), classes). It
// is the prediction every accuracy in gradsync is computed from (the
// confusion matrix, the workers' and the federated simulation's
// evaluations), so it lives here rather than with the models.
func Argmax(logits []float32, classes int, dst []int) {
	if classes < 1 || len(logits) != len(dst)*classes {
		panic(fmt.Sprintf("eval: Argmax: len(logits)=%d, want len(dst) %d × %d classes", len(logits), len(dst), classes))
	}
	for i := range dst {
		row := logits[i*classes : (i+1)*classes]
		best := 0
		for j, v := range row {
			if v > row[best] {
				best = j
			}
		}
		dst[i] = best
	}
}
