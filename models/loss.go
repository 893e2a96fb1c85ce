package models

import (
	"fmt"
	"math"
)

// Label is the type of a single-label class index: int32 for the data
// sets (any label space up to 2^20 classes), a byte or uint16 where a
// caller's labels are narrower.
type Label interface {
	~uint8 | ~uint16 | ~int32
}

// SoftmaxCrossEntropy returns the mean over the batch of the cross-entropy
// between softmax(logits) and the labels, as torch.nn.CrossEntropyLoss with
// reduction "mean". logits is (batch, classes) row-major with batch =
// len(labels). When dlogits (same shape) is non-nil it receives
// d(mean loss)/d(logits) = (softmax − onehot)/batch, overwriting it.
// Each row is shifted by its maximum and summed in float64, so large logits
// neither overflow nor lose the small probabilities. An empty batch
// returns 0.
//
// Labels may be of any [Label] type; the arithmetic is the same.
func SoftmaxCrossEntropy[L Label](logits []float32, labels []L, classes int, dlogits []float32) (loss float32) {
	batch := len(labels)
	if classes < 1 || len(logits) != batch*classes {
		panic(fmt.Sprintf("models: SoftmaxCrossEntropy: len(logits)=%d, want %d labels × %d classes", len(logits), batch, classes))
	}
	if dlogits != nil && len(dlogits) != len(logits) {
		panic(fmt.Sprintf("models: SoftmaxCrossEntropy: len(dlogits)=%d, want %d", len(dlogits), len(logits)))
	}
	if batch == 0 {
		return 0
	}
	var total float64
	inv := 1 / float64(batch)
	for i, y := range labels {
		if int(y) < 0 || int(y) >= classes {
			panic(fmt.Sprintf("models: SoftmaxCrossEntropy: label %d of sample %d out of range [0,%d)", y, i, classes))
		}
		row := logits[i*classes : (i+1)*classes]
		lse := logSumExp(row)
		total += lse - float64(row[y])
		if dlogits != nil {
			d := dlogits[i*classes : (i+1)*classes]
			for j, v := range row {
				p := math.Exp(float64(v) - lse)
				if j == int(y) {
					p--
				}
				d[j] = float32(p * inv)
			}
		}
	}
	return float32(total * inv)
}
