package tensorpar

import (
	"context"
	"fmt"

	"github.com/gradsync/gradsync/models"
)

// BCELoss is models.BCEWithLogits over the whole head for a multi-label
// task, whose classes split naturally over the label shards: the mean
// over the b·Classes (example, class) terms, each term owned by the rank
// that holds its class. It returns the same loss on every rank and keeps
// this rank's logit gradient for Backward.
//
// targets is the whole batch's (b, Classes) row-major, every rank holding
// it (values in [0, 1], soft allowed); posWeight is nil or the Classes
// positive weights (torch's pos_weight). If perExample is non-nil it
// receives each example's loss, the mean over its Classes terms (the
// loss is their mean).
//
// Communication: one Sum all-reduce of b values, each example's sum of
// its terms on this rank. The gradient needs none: a term's gradient
// depends on its own logit and target only, and the normaliser b·Classes
// is known to every rank; the all-reduce is only for the loss's value.
func BCELoss(ctx context.Context, h *Head, targets, posWeight, perExample []float32) (float32, error) {
	b, k, C := h.batch, len(h.Owned), h.Classes
	if len(targets) != b*C {
		return 0, fmt.Errorf("tensorpar: %d targets for a batch of %d × %d classes", len(targets), b, C)
	}
	if posWeight != nil && len(posWeight) != C {
		return 0, fmt.Errorf("tensorpar: %d positive weights for %d classes", len(posWeight), C)
	}
	if perExample != nil && len(perExample) != b {
		return 0, fmt.Errorf("tensorpar: per-example losses of length %d for a batch of %d", len(perExample), b)
	}
	for i, t := range targets {
		if !(t >= 0 && t <= 1) {
			return 0, fmt.Errorf("tensorpar: target %v of sample %d, class %d outside [0, 1]", t, i/C, i%C)
		}
	}
	// This rank's columns of targets and posWeight, in Owned's order, so
	// that models.BCEWithLogits computes each row's terms (one formula for
	// the sharded and the unsharded head).
	h.tl = grow(h.tl, b*k)
	for i := range b {
		for j, c := range h.Owned {
			h.tl[i*k+j] = targets[i*C+c]
		}
	}
	var pw []float32
	if posWeight != nil {
		h.pw = grow(h.pw, k)
		for j, c := range h.Owned {
			h.pw[j] = posWeight[c]
		}
		pw = h.pw
	}
	h.dz = grow(h.dz, b*k)
	h.s = grow(h.s, b)
	// BCEWithLogits divides each row's terms and gradients by k; the
	// head's mean divides by b·C.
	scale := float64(k) / float64(b*C)
	for i := range b {
		row := i * k
		m := models.BCEWithLogits(h.z[row:row+k], h.tl[row:row+k], pw, h.dz[row:row+k])
		h.s[i] = float32(float64(m) * float64(k))
		for j := row; j < row+k; j++ {
			h.dz[j] = float32(float64(h.dz[j]) * scale)
		}
	}
	if err := h.g.AllReduce(ctx, h.s, Sum); err != nil {
		return 0, err
	}
	var total float64
	for i, s := range h.s {
		total += float64(s)
		if perExample != nil {
			perExample[i] = float32(float64(s) / float64(C))
		}
	}
	if b == 0 {
		return 0, nil
	}
	return float32(total / float64(b*C)), nil
}
