package models

import (
	"fmt"
	"math"
)

// CEOptions are the knobs of [SoftmaxCrossEntropyWith], named as in
// torch.nn.functional.cross_entropy. The zero value is the plain loss of
// [SoftmaxCrossEntropy].
type CEOptions struct {
	// ClassWeights, if non-nil, has one weight per class (torch's weight):
	// sample i counts w[y_i] times and the mean divides by Σ_i w[y_i].
	ClassWeights []float32
	// LabelSmoothing ε ∈ [0, 1] mixes the one-hot target with the uniform
	// distribution over classes (torch's label_smoothing).
	LabelSmoothing float32
}

// SoftmaxCrossEntropyWith is torch.nn.functional.cross_entropy(logits,
// labels, weight=opt.ClassWeights, label_smoothing=opt.LabelSmoothing,
// reduction="mean"). logits is (batch, classes) row-major with batch =
// len(labels). With ℓ_ic = −log softmax(logits_i)_c, w the class weights
// (all 1 when nil) and ε the smoothing, it returns, as torch 1.13 does,
//
//	(1−ε) · Σ_i w_{y_i} ℓ_{i,y_i} / Σ_i w_{y_i}  +  (ε/C) · Σ_i Σ_c w_c ℓ_ic / Σ_i w_{y_i}
//
// so the smoothing term weighs each class's log-probability by that
// class's weight but is normalised by the weights of the true labels, not
// by Σ_c w_c. When dlogits (same shape as logits) is non-nil it receives
// the gradient, overwriting it. It allocates nothing.
//
// Where torch returns NaN (an empty batch, or Σ_i w_{y_i} = 0) this returns
// 0 with a zero gradient, so that one degenerate batch cannot poison the
// parameters. With the zero CEOptions the result is bit-identical to
// SoftmaxCrossEntropy's.
func SoftmaxCrossEntropyWith[L Label](logits []float32, labels []L, classes int, opt CEOptions, dlogits []float32) float32 {
	batch := len(labels)
	if classes < 1 || len(logits) != batch*classes {
		panic(fmt.Sprintf("models: SoftmaxCrossEntropyWith: len(logits)=%d, want %d labels × %d classes", len(logits), batch, classes))
	}
	if dlogits != nil && len(dlogits) != len(logits) {
		panic(fmt.Sprintf("models: SoftmaxCrossEntropyWith: len(dlogits)=%d, want %d", len(dlogits), len(logits)))
	}
	w := opt.ClassWeights
	if w != nil && len(w) != classes {
		panic(fmt.Sprintf("models: SoftmaxCrossEntropyWith: %d class weights for %d classes", len(w), classes))
	}
	eps := float64(opt.LabelSmoothing)
	if !(eps >= 0 && eps <= 1) {
		panic(fmt.Sprintf("models: SoftmaxCrossEntropyWith: label smoothing %v outside [0, 1]", opt.LabelSmoothing))
	}
	if w == nil && eps == 0 {
		return SoftmaxCrossEntropy(logits, labels, classes, dlogits)
	}
	// wsum = Σ_i w_{y_i}, the denominator of both terms; wall = Σ_c w_c.
	wsum, wall := float64(batch), float64(classes)
	if w != nil {
		wsum, wall = 0, 0
		for _, v := range w {
			wall += float64(v)
		}
	}
	for i, y := range labels {
		if int(y) < 0 || int(y) >= classes {
			panic(fmt.Sprintf("models: SoftmaxCrossEntropyWith: label %d of sample %d out of range [0,%d)", y, i, classes))
		}
		if w != nil {
			wsum += float64(w[y])
		}
	}
	if wsum == 0 {
		clear(dlogits)
		return 0
	}
	weight := func(c int) float64 {
		if w == nil {
			return 1
		}
		return float64(w[c])
	}
	nllScale := (1 - eps) / wsum
	smoothScale := eps / float64(classes) / wsum
	var total float64
	for i, y := range labels {
		row := logits[i*classes : (i+1)*classes]
		lse := logSumExp(row)
		wy := weight(int(y))
		// Σ_c w_c ℓ_ic = Σ_c w_c (lse − z_c).
		var smooth float64
		if eps != 0 {
			for c, v := range row {
				smooth += weight(c) * (lse - float64(v))
			}
		}
		total += nllScale*wy*(lse-float64(row[y])) + smoothScale*smooth
		if dlogits != nil {
			// ∂ℓ_ic/∂z_j = p_j − [c = j], so the row's gradient is
			// nllScale·w_y·(p_j − [y = j]) + smoothScale·(W·p_j − w_j).
			d := dlogits[i*classes : (i+1)*classes]
			for j, v := range row {
				p := math.Exp(float64(v) - lse)
				g := nllScale*wy*p + smoothScale*(wall*p-weight(j))
				if j == int(y) {
					g -= nllScale * wy
				}
				d[j] = float32(g)
			}
		}
	}
	return float32(total)
}

// logSumExp returns log Σ exp(row), shifting by the row's maximum so large
// logits neither overflow nor lose the small terms, and summing in float64
// (SoftmaxCrossEntropy's numerics).
func logSumExp(row []float32) float64 {
	m := row[0]
	for _, v := range row[1:] {
		m = max(m, v)
	}
	var sum float64
	for _, v := range row {
		sum += math.Exp(float64(v - m))
	}
	return float64(m) + math.Log(sum)
}

// BCEWithLogits is torch.nn.functional.binary_cross_entropy_with_logits(
// logits, targets, pos_weight=posWeight, reduction="mean"): the mean over
// all elements of
//
//	ℓ = −[p·t·log σ(x) + (1−t)·log(1−σ(x))] = (1−t)·x + (1 + (p−1)·t)·softplus(−x)
//
// with p = posWeight[j] for element j of each row (torch broadcasts
// pos_weight along the last dimension), or 1 when posWeight is nil.
// targets has the shape of logits and may be soft (in [0, 1]); with
// posWeight, logits is (n, len(posWeight)) row-major. softplus(−x) is
// computed as max(−x, 0) + log1p(exp(−|x|)), so no logit overflows. When
// dlogits is non-nil it receives the gradient of the mean,
// ((1−t) − (1 + (p−1)·t)·σ(−x)) / len(logits), overwriting it. An empty
// input returns 0 (torch: NaN). It allocates nothing.
func BCEWithLogits(logits, targets []float32, posWeight []float32, dlogits []float32) float32 {
	if len(targets) != len(logits) {
		panic(fmt.Sprintf("models: BCEWithLogits: len(targets)=%d, want len(logits)=%d", len(targets), len(logits)))
	}
	if dlogits != nil && len(dlogits) != len(logits) {
		panic(fmt.Sprintf("models: BCEWithLogits: len(dlogits)=%d, want %d", len(dlogits), len(logits)))
	}
	if posWeight != nil && (len(posWeight) == 0 || len(logits)%len(posWeight) != 0) {
		panic(fmt.Sprintf("models: BCEWithLogits: len(logits)=%d is not a multiple of len(posWeight)=%d", len(logits), len(posWeight)))
	}
	if len(logits) == 0 {
		return 0
	}
	inv := 1 / float64(len(logits))
	var total float64
	for i, v := range logits {
		x, t := float64(v), float64(targets[i])
		lw := 1.0 // 1 + (p−1)·t, the weight of the −log σ(x) term
		if posWeight != nil {
			lw = 1 + (float64(posWeight[i%len(posWeight)])-1)*t
		}
		e := math.Exp(-math.Abs(x))               // in (0, 1]: never overflows
		softplusNeg := max(-x, 0) + math.Log1p(e) // softplus(−x) = −log σ(x)
		total += (1-t)*x + lw*softplusNeg
		if dlogits != nil {
			// σ(−x) from e = exp(−|x|) without cancellation.
			sigNeg := e / (1 + e)
			if x < 0 {
				sigNeg = 1 / (1 + e)
			}
			dlogits[i] = float32(((1 - t) - lw*sigNeg) * inv)
		}
	}
	return float32(total * inv)
}
