// Package eval computes classification metrics from model outputs,
// accumulated batch by batch: a confusion matrix (accuracy, per-class
// accuracy, balanced accuracy) for single-label tasks, and micro/macro F1,
// subset accuracy and mean average precision for multi-label tasks.
//
// The definitions are scikit-learn's (accuracy_score, recall_score,
// balanced_accuracy_score, f1_score, average_precision_score); where
// scikit-learn warns about an undefined value the choice made here is noted
// on the method. Accumulators are not safe for concurrent use; give each
// goroutine its own and [Confusion.Merge] or [MultiLabel.Merge] them.
package eval

import (
	"fmt"
	"math"
)

// Confusion is a confusion matrix over a fixed number of classes: entry
// (t, p) counts the examples of true class t predicted as p.
//
// Up to [DenseConfusionClasses] classes the matrix is held dense
// (classes² counters). Above, it is held sparse — per class its total and
// its correct count, and the off-diagonal entries that are not zero in a
// map — so its memory grows with the examples counted, not with classes²
// (a 20,000-class matrix would take 3.2 GB dense). Every method gives the
// same figures either way.
type Confusion struct {
	classes int
	counts  []int64 // dense: (classes, classes) row-major, counts[t*classes+p]; nil when sparse

	// sparse form (classes > DenseConfusionClasses)
	rows []int64            // rows[t]: examples of class t
	diag []int64            // diag[t]: examples of class t predicted as t
	off  map[[2]int32]int64 // (t, p), t ≠ p: the non-zero off-diagonal entries

	pred []int // Add's argmax scratch, grown to the largest batch
}

// DenseConfusionClasses is the largest label space whose confusion
// matrix is held dense (1024² int64 = 8 MiB).
const DenseConfusionClasses = 1024

// NewConfusion returns an empty confusion matrix over classes ≥ 1 classes.
func NewConfusion(classes int) *Confusion {
	if classes < 1 || classes > math.MaxInt32 {
		panic(fmt.Sprintf("eval: NewConfusion: %d classes", classes))
	}
	if classes > DenseConfusionClasses {
		return &Confusion{classes: classes, rows: make([]int64, classes), diag: make([]int64, classes), off: map[[2]int32]int64{}}
	}
	return &Confusion{classes: classes, counts: make([]int64, classes*classes)}
}

// sparse reports whether c holds its matrix in the sparse form.
func (c *Confusion) sparse() bool { return c.counts == nil }

// add counts one example of class t predicted as p.
func (c *Confusion) add(t, p int, n int64) {
	if !c.sparse() {
		c.counts[t*c.classes+p] += n
		return
	}
	c.rows[t] += n
	if t == p {
		c.diag[t] += n
		return
	}
	c.off[[2]int32{int32(t), int32(p)}] += n
}

// Classes returns the number of classes.
func (c *Confusion) Classes() int { return c.classes }

// Label is the type of a single-label class index: a byte for label
// spaces of at most 256 classes, int32 or uint16 for wider ones.
type Label interface {
	~uint8 | ~uint16 | ~int32
}

// Add counts a batch: logits is (len(labels), classes) row-major and each
// prediction is the arg-max logit (the first on ties, as Argmax).
// It allocates only when the batch is larger than any before.
func (c *Confusion) Add(logits []float32, labels []uint8) { addLogits(c, logits, labels) }

// AddWide is Add for int32 labels (label spaces beyond 256 classes).
func (c *Confusion) AddWide(logits []float32, labels []int32) { addLogits(c, logits, labels) }

// AddPredictions counts a batch of predicted classes against labels.
func (c *Confusion) AddPredictions(pred []int, labels []uint8) { addPredictions(c, pred, labels) }

// AddPredictionsWide is AddPredictions for int32 labels (label spaces
// beyond 256 classes).
func (c *Confusion) AddPredictionsWide(pred []int, labels []int32) { addPredictions(c, pred, labels) }

func addLogits[L Label](c *Confusion, logits []float32, labels []L) {
	if len(logits) != len(labels)*c.classes {
		panic(fmt.Sprintf("eval: Confusion.Add: len(logits)=%d, want %d labels × %d classes", len(logits), len(labels), c.classes))
	}
	if cap(c.pred) < len(labels) {
		c.pred = make([]int, len(labels))
	}
	pred := c.pred[:len(labels)]
	Argmax(logits, c.classes, pred)
	addPredictions(c, pred, labels)
}

func addPredictions[L Label](c *Confusion, pred []int, labels []L) {
	if len(pred) != len(labels) {
		panic(fmt.Sprintf("eval: Confusion.AddPredictions: %d predictions for %d labels", len(pred), len(labels)))
	}
	for i, y := range labels {
		p := pred[i]
		if int(y) < 0 || int(y) >= c.classes || p < 0 || p >= c.classes {
			panic(fmt.Sprintf("eval: Confusion.AddPredictions: sample %d: label %d, prediction %d, want both in [0, %d)", i, y, p, c.classes))
		}
		c.add(int(y), p, 1)
	}
}

// Merge adds o's counts into c (for example, from another worker's shard).
func (c *Confusion) Merge(o *Confusion) {
	if o.classes != c.classes {
		panic(fmt.Sprintf("eval: Confusion.Merge: %d classes into %d", o.classes, c.classes))
	}
	if !o.sparse() { // c is dense too: the form follows the class count
		for i, v := range o.counts {
			c.counts[i] += v
		}
		return
	}
	for t := range o.classes {
		if d := o.diag[t]; d != 0 {
			c.add(t, t, d)
		}
	}
	for k, v := range o.off {
		c.add(int(k[0]), int(k[1]), v)
	}
}

// Reset clears the counts.
func (c *Confusion) Reset() {
	if !c.sparse() {
		clear(c.counts)
		return
	}
	clear(c.rows)
	clear(c.diag)
	clear(c.off)
}

// Count returns how many examples of class label were predicted as pred.
func (c *Confusion) Count(label, pred int) int64 {
	if !c.sparse() {
		return c.counts[label*c.classes+pred]
	}
	if label < 0 || label >= c.classes || pred < 0 || pred >= c.classes {
		panic(fmt.Sprintf("eval: Confusion.Count(%d, %d) of %d classes", label, pred, c.classes))
	}
	if label == pred {
		return c.diag[label]
	}
	return c.off[[2]int32{int32(label), int32(pred)}]
}

// Matrix returns a copy of the counts as rows by true class: classes²
// values, whichever form c holds (callers bound classes first).
func (c *Confusion) Matrix() [][]int64 {
	m := make([][]int64, c.classes)
	for t := range m {
		if !c.sparse() {
			m[t] = append([]int64(nil), c.counts[t*c.classes:(t+1)*c.classes]...)
			continue
		}
		m[t] = make([]int64, c.classes)
		m[t][t] = c.diag[t]
	}
	if c.sparse() {
		for k, v := range c.off {
			m[k[0]][k[1]] = v
		}
	}
	return m
}

// Total returns the number of examples counted.
func (c *Confusion) Total() int64 {
	var n int64
	for _, v := range c.counts {
		n += v
	}
	for _, v := range c.rows {
		n += v
	}
	return n
}

// Correct returns the number of examples predicted correctly (the trace).
func (c *Confusion) Correct() int64 {
	var n int64
	for t := range c.classes {
		n += c.diagonal(t)
	}
	return n
}

// diagonal returns entry (t, t).
func (c *Confusion) diagonal(t int) int64 {
	if c.sparse() {
		return c.diag[t]
	}
	return c.counts[t*c.classes+t]
}

// row returns how many examples of class t were counted.
func (c *Confusion) row(t int) int64 {
	if c.sparse() {
		return c.rows[t]
	}
	var n int64
	for _, v := range c.counts[t*c.classes : (t+1)*c.classes] {
		n += v
	}
	return n
}

// Accuracy returns the fraction of examples predicted correctly, or 0 when
// none have been counted.
func (c *Confusion) Accuracy() float64 {
	n := c.Total()
	if n == 0 {
		return 0
	}
	return float64(c.Correct()) / float64(n)
}

// ClassAccuracy writes into dst (grown or allocated as needed) and returns
// each class's accuracy: the fraction of its examples predicted correctly
// (its recall). A class with no examples gets NaN, not a made-up 0 or 1.
func (c *Confusion) ClassAccuracy(dst []float64) []float64 {
	dst = resize(dst, c.classes)
	for t := range c.classes {
		n := c.row(t)
		dst[t] = math.NaN()
		if n > 0 {
			dst[t] = float64(c.diagonal(t)) / float64(n)
		}
	}
	return dst
}

// BalancedAccuracy returns the mean of ClassAccuracy over the classes that
// have examples (scikit-learn's balanced_accuracy_score), or 0 when none do.
func (c *Confusion) BalancedAccuracy() float64 {
	return meanFinite(c.ClassAccuracy(nil))
}

// meanFinite returns the mean of the non-NaN values of v, or 0 if none.
func meanFinite(v []float64) float64 {
	var sum float64
	n := 0
	for _, x := range v {
		if !math.IsNaN(x) {
			sum += x
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

func resize(dst []float64, n int) []float64 {
	if cap(dst) < n {
		return make([]float64, n)
	}
	return dst[:n]
}
