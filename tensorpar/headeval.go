package tensorpar

import (
	"context"
	"fmt"
	"math"

	"github.com/gradsync/gradsync/models"
)

// Predict returns the predicted class of each example of the last Forward:
// the arg-max of the whole head's logits, ties to the lower class index
// (eval.Argmax's rule on the unsharded logits, so the result feeds
// eval.Confusion.AddPredictions unchanged). Each rank sends its best
// (logit, class) per example: one all-gather of 2b values, b the batch
// size, so each rank receives L·2b values, never the b·Classes logits.
// Every rank gets the same predictions.
func Predict(ctx context.Context, h *Head) ([]int, error) {
	b, k, n := h.batch, len(h.Owned), h.g.Size()
	mine := make([]float32, 2*b)
	for i := range b {
		row := h.z[i*k : (i+1)*k]
		best := 0
		for j, v := range row {
			if v > row[best] || v == row[best] && h.Owned[j] < h.Owned[best] {
				best = j
			}
		}
		mine[2*i], mine[2*i+1] = row[best], float32(h.Owned[best])
	}
	all := make([]float32, n*2*b)
	if err := h.g.AllGather(ctx, all, mine); err != nil {
		return nil, err
	}
	pred := make([]int, b)
	for i := range b {
		bv, bc := float32(math.Inf(-1)), float32(-1)
		for r := range n {
			v, c := all[r*2*b+2*i], all[r*2*b+2*i+1]
			if bc < 0 || v > bv || v == bv && c < bc {
				bv, bc = v, c
			}
		}
		pred[i] = int(bc)
	}
	return pred, nil
}

// Ranks returns, for each example of the last Forward, the rank of its
// label among the whole head's classes: how many classes c beat the
// label y, z_c > z_y or z_c = z_y and c < y (ties to the lower class
// index, as Predict). The label is among the top k exactly when its rank
// is below k, so one call answers top-k accuracy for every k; rank 0 is
// Predict's top-1. A label whose logit is NaN gets rank Classes (never in
// any top k); NaN logits of other classes beat nothing.
//
// Communication: two Sum all-reduces of b values — the label's logit from
// its owner (the other ranks add zeros, so it arrives exactly), then each
// rank's count of its classes that beat it (integers, exact in float32
// up to maxExact). That is 2b values whatever k, where all-gathering
// every rank's local top-k candidates would move 2b·k values per rank
// (logits and class indices) and (L−1)·2b·k in on each.
func Ranks[L models.Label](ctx context.Context, h *Head, labels []L) ([]int, error) {
	b, k := h.batch, len(h.Owned)
	if len(labels) != b {
		return nil, fmt.Errorf("tensorpar: %d labels for a batch of %d", len(labels), b)
	}
	for i, y := range labels {
		if int(y) < 0 || int(y) >= h.Classes {
			return nil, fmt.Errorf("tensorpar: label %d of sample %d outside [0, %d)", y, i, h.Classes)
		}
	}
	t := make([]float32, b)
	for i, y := range labels {
		if j := h.local[y]; j >= 0 {
			t[i] = h.z[i*k+j]
		}
	}
	if err := h.g.AllReduce(ctx, t, Sum); err != nil {
		return nil, err
	}
	beat := make([]float32, b)
	for i, y := range labels {
		var n int
		for j, v := range h.z[i*k : (i+1)*k] {
			if c := h.Owned[j]; v > t[i] || v == t[i] && c < int(y) {
				n++
			}
		}
		beat[i] = float32(n)
	}
	if err := h.g.AllReduce(ctx, beat, Sum); err != nil {
		return nil, err
	}
	ranks := make([]int, b)
	for i := range b {
		ranks[i] = int(beat[i])
		if t[i] != t[i] { // NaN
			ranks[i] = h.Classes
		}
	}
	return ranks, nil
}

// CorrectTopK returns how many examples of the last Forward have their
// label among the whole head's k largest logits (ties to the lower class
// index), from Ranks: two all-reduces of b values.
func CorrectTopK[L models.Label](ctx context.Context, h *Head, labels []L, k int) (int, error) {
	if k < 1 {
		return 0, fmt.Errorf("tensorpar: top-%d accuracy: want k ≥ 1", k)
	}
	ranks, err := Ranks(ctx, h, labels)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range ranks {
		if r < k {
			n++
		}
	}
	return n, nil
}
