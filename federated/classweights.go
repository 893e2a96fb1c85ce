package federated

import (
	"fmt"
	"math"
)

// ClassBalancedWeights returns per-class loss weights from the "effective
// number of samples" (Cui et al. 2019, "Class-Balanced Loss Based on
// Effective Number of Samples"): a class with n_c examples has effective
// number E(n_c) = (1 − β^{n_c}) / (1 − β), and its weight is
// w_c ∝ 1/E(n_c) = (1 − β) / (1 − β^{n_c}). The weights of the classes
// present are scaled to sum to len(counts), the number of classes (the
// paper's normalisation).
//
// β ∈ [0, 1) interpolates between no reweighting (β = 0: every present class
// weighs 1) and inverse class frequency (β → 1); Cui et al. use 0.9 to
// 0.9999, larger for larger data sets. A class with n_c = 0 has no examples
// to weigh (its 1/E would be infinite); it gets weight 0, and the others
// share the total. All counts 0 gives all weights 0.
//
// In federated training a client uses its own label histogram, so a client
// whose data is dominated by a few classes (Non-IID) does not let them
// swamp its local objective.
func ClassBalancedWeights(counts []int, beta float64) ([]float64, error) {
	if !(beta >= 0 && beta < 1) {
		return nil, fmt.Errorf("federated: class-balanced β = %v, must be in [0, 1)", beta)
	}
	w := make([]float64, len(counts))
	var sum float64
	for c, n := range counts {
		if n < 0 {
			return nil, fmt.Errorf("federated: class-balanced weights: count %d for class %d, must be ≥ 0", n, c)
		}
		if n == 0 {
			continue
		}
		// 1 − β^n computed as −expm1(n·ln β): exact for β near 1, where
		// β^n rounds towards 1. β = 0 gives −expm1(−Inf) = 1.
		oneMinusBetaN := -math.Expm1(float64(n) * math.Log(beta))
		w[c] = (1 - beta) / oneMinusBetaN
		sum += w[c]
	}
	if sum > 0 {
		scale := float64(len(counts)) / sum
		for c := range w {
			w[c] *= scale
		}
	}
	return w, nil
}
