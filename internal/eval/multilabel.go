package eval

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// MultiLabel accumulates multi-label predictions: each example has an
// independent yes/no target per class, and the model's logit for class j
// predicts yes when sigmoid(logit) > 0.5, that is logit > 0 (a logit of
// exactly 0 is a no, as torchmetrics' preds > threshold).
//
// It keeps every logit and target, which average precision needs (it ranks
// all examples per class): 5 bytes per example and class.
type MultiLabel struct {
	classes    int
	tp, fp, fn []int64 // per class, at threshold 0.5
	exact      int64   // examples whose every class was predicted right
	logits     []float32
	targets    []bool // (examples, classes) row-major, like logits
	order      []int  // AP's sort scratch
}

// NewMultiLabel returns an empty accumulator over classes ≥ 1 classes.
func NewMultiLabel(classes int) *MultiLabel {
	if classes < 1 {
		panic(fmt.Sprintf("eval: NewMultiLabel: %d classes", classes))
	}
	return &MultiLabel{classes: classes, tp: make([]int64, classes), fp: make([]int64, classes), fn: make([]int64, classes)}
}

// Classes returns the number of classes.
func (m *MultiLabel) Classes() int { return m.classes }

// Len returns the number of examples added.
func (m *MultiLabel) Len() int { return len(m.targets) / m.classes }

// Add records a batch: logits and targets are (batch, classes) row-major;
// a target above 0.5 is a positive (multi-hot 1), anything else negative.
func (m *MultiLabel) Add(logits, targets []float32) {
	if len(logits) != len(targets) || len(logits)%m.classes != 0 {
		panic(fmt.Sprintf("eval: MultiLabel.Add: len(logits)=%d, len(targets)=%d, want equal multiples of %d classes", len(logits), len(targets), m.classes))
	}
	for i := 0; i < len(logits); i += m.classes {
		allRight := true
		for j := range m.classes {
			pos, yes := targets[i+j] > 0.5, logits[i+j] > 0
			switch {
			case pos && yes:
				m.tp[j]++
			case yes:
				m.fp[j]++
				allRight = false
			case pos:
				m.fn[j]++
				allRight = false
			}
			m.targets = append(m.targets, pos)
		}
		if allRight {
			m.exact++
		}
	}
	m.logits = append(m.logits, logits...)
}

// Merge appends o's examples to m.
func (m *MultiLabel) Merge(o *MultiLabel) {
	if o.classes != m.classes {
		panic(fmt.Sprintf("eval: MultiLabel.Merge: %d classes into %d", o.classes, m.classes))
	}
	for j := range m.classes {
		m.tp[j] += o.tp[j]
		m.fp[j] += o.fp[j]
		m.fn[j] += o.fn[j]
	}
	m.exact += o.exact
	m.logits = append(m.logits, o.logits...)
	m.targets = append(m.targets, o.targets...)
}

// Reset forgets every example, keeping the storage.
func (m *MultiLabel) Reset() {
	clear(m.tp)
	clear(m.fp)
	clear(m.fn)
	m.exact = 0
	m.logits, m.targets = m.logits[:0], m.targets[:0]
}

// SubsetAccuracy returns the fraction of examples whose whole label set was
// predicted exactly (scikit-learn's accuracy_score on multi-label input),
// or 0 when there are none.
func (m *MultiLabel) SubsetAccuracy() float64 {
	if m.Len() == 0 {
		return 0
	}
	return float64(m.exact) / float64(m.Len())
}

// f1 is 2TP / (2TP + FP + FN), and 0 when that is 0/0 (no positives and
// none predicted): scikit-learn's default zero_division.
func f1(tp, fp, fn int64) float64 {
	if d := 2*tp + fp + fn; d > 0 {
		return float64(2*tp) / float64(d)
	}
	return 0
}

// MicroF1 returns F1 over the pooled counts of all classes,
// 2ΣTP / (2ΣTP + ΣFP + ΣFN) (f1_score(average="micro")).
func (m *MultiLabel) MicroF1() float64 {
	var tp, fp, fn int64
	for j := range m.classes {
		tp, fp, fn = tp+m.tp[j], fp+m.fp[j], fn+m.fn[j]
	}
	return f1(tp, fp, fn)
}

// ClassF1 writes each class's F1 into dst (grown or allocated as needed)
// and returns it; a class never present nor predicted has F1 0.
func (m *MultiLabel) ClassF1(dst []float64) []float64 {
	dst = resize(dst, m.classes)
	for j := range m.classes {
		dst[j] = f1(m.tp[j], m.fp[j], m.fn[j])
	}
	return dst
}

// MacroF1 returns the unweighted mean of ClassF1 over all classes
// (f1_score(average="macro"), zero_division 0).
func (m *MultiLabel) MacroF1() float64 {
	var sum float64
	for _, v := range m.ClassF1(nil) {
		sum += v
	}
	return sum / float64(m.classes)
}

// ClassAP writes each class's average precision into dst (grown or
// allocated as needed) and returns it: with the examples ranked by
// descending logit and P_k, R_k the precision and recall at the k-th
// distinct logit (ties form one threshold), AP = Σ_k (R_k − R_{k−1})·P_k,
// scikit-learn's average_precision_score (no interpolation). A class with
// no positive examples gets NaN.
func (m *MultiLabel) ClassAP(dst []float64) []float64 {
	dst = resize(dst, m.classes)
	n := m.Len()
	if cap(m.order) < n {
		m.order = make([]int, n)
	}
	order := m.order[:n]
	for j := range m.classes {
		var pos int64
		for i := range n {
			order[i] = i
			if m.targets[i*m.classes+j] {
				pos++
			}
		}
		if pos == 0 {
			dst[j] = math.NaN()
			continue
		}
		score := func(i int) float32 { return m.logits[i*m.classes+j] }
		slices.SortFunc(order, func(a, b int) int { return cmp.Compare(score(b), score(a)) })
		var ap float64
		var tp, seen int64
		for k := 0; k < n; {
			// Take every example tied at this logit as one threshold.
			s := score(order[k])
			var gain int64
			// cmp.Compare, unlike ==, holds a NaN equal to itself.
			for ; k < n && cmp.Compare(score(order[k]), s) == 0; k++ {
				seen++
				if m.targets[order[k]*m.classes+j] {
					gain++
				}
			}
			tp += gain
			if gain > 0 {
				ap += float64(gain) / float64(pos) * float64(tp) / float64(seen)
			}
		}
		dst[j] = ap
	}
	return dst
}

// MAP returns the mean of ClassAP over the classes with at least one
// positive example, or 0 when no class has one.
func (m *MultiLabel) MAP() float64 {
	return meanFinite(m.ClassAP(nil))
}
