package federated

import (
	"fmt"
	"slices"
)

// Rule combines the round's client deltas into one pseudo-gradient Δ (the
// direction the server moves the global model in).
type Rule interface {
	// Combine writes into dst (length P) the combination of the deltas of
	// updates (each of length P, at least one, sorted by Client with no
	// duplicates). w holds one unnormalised weight ≥ 0 per update with a
	// positive sum; unweighted rules ignore it. Combine neither keeps nor
	// modifies updates and w.
	Combine(dst []float32, updates []Update, w []float64) error
}

// Mean is the weighted mean Σ_k w_k Δ_k / Σ_k w_k (FedAvg's rule). It is
// accumulated in float64 in the updates' (canonical, sorted by client)
// order and rounded once, so the result is bit-identical whatever order
// the updates arrived in.
type Mean struct {
	acc []float64 // scratch, length P
}

// Combine implements Rule.
func (m *Mean) Combine(dst []float32, updates []Update, w []float64) error {
	if cap(m.acc) < len(dst) {
		m.acc = make([]float64, len(dst))
	}
	acc := m.acc[:len(dst)]
	clear(acc)
	var sum float64
	for i, u := range updates {
		wi := w[i]
		sum += wi
		if wi == 0 {
			continue
		}
		for j, v := range u.Delta {
			acc[j] += wi * float64(v)
		}
	}
	if !(sum > 0) {
		return ErrNoExamples
	}
	for j, a := range acc {
		dst[j] = float32(a / sum)
	}
	return nil
}

// Median is the coordinate-wise median of the deltas (Yin et al. 2018),
// unweighted; with an even number of clients, the mean of the two middle
// values. It tolerates fewer than half the clients sending arbitrary
// values, at the price of ignoring example counts and of a noisier
// estimate than the mean on honest IID clients.
type Median struct {
	col []float32 // scratch: one coordinate across clients
}

// Combine implements Rule.
func (m *Median) Combine(dst []float32, updates []Update, _ []float64) error {
	k := len(updates)
	m.col = slices.Grow(m.col[:0], k)[:k]
	for j := range dst {
		for i := range updates {
			m.col[i] = updates[i].Delta[j]
		}
		slices.Sort(m.col)
		if k%2 == 1 {
			dst[j] = m.col[k/2]
		} else {
			dst[j] = float32((float64(m.col[k/2-1]) + float64(m.col[k/2])) / 2)
		}
	}
	return nil
}

// TrimmedMean is the coordinate-wise β-trimmed mean (Yin et al. 2018),
// unweighted: for each coordinate the ⌊β·K⌋ largest and ⌊β·K⌋ smallest of
// the K values are dropped and the rest averaged. Beta is in [0, 0.5);
// 0 is the plain unweighted mean. It tolerates up to ⌊β·K⌋ arbitrary
// clients and is less noisy than the median.
type TrimmedMean struct {
	Beta float64
	col  []float32 // scratch: one coordinate across clients
}

// Combine implements Rule.
func (m *TrimmedMean) Combine(dst []float32, updates []Update, _ []float64) error {
	if !(m.Beta >= 0 && m.Beta < 0.5) {
		return fmt.Errorf("federated: trimmed mean β = %v, must be in [0, 0.5)", m.Beta)
	}
	k := len(updates)
	trim := int(m.Beta * float64(k))
	keep := k - 2*trim
	m.col = slices.Grow(m.col[:0], k)[:k]
	for j := range dst {
		for i := range updates {
			m.col[i] = updates[i].Delta[j]
		}
		slices.Sort(m.col)
		var s float64
		for _, v := range m.col[trim : k-trim] {
			s += float64(v)
		}
		dst[j] = float32(s / float64(keep))
	}
	return nil
}
