package compress

import (
	"context"
	"fmt"
	"math"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/models"
)

// TopKConfig configures top-k sparsification. The zero value is usable:
// ratio 0.01, compression from step 0, error feedback on.
type TopKConfig struct {
	// Ratio is the fraction of the gradient's elements each rank sends:
	// k = max(1, ⌊Ratio·n⌋). 0 means DefaultTopKRatio; at most 1.
	Ratio float64
	// StartIter is the first compressed step; earlier steps use the plain
	// bucketed all-reduce.
	StartIter int64
	// NoErrorFeedback drops what was not sent instead of keeping it as a
	// residual for the next step.
	NoErrorFeedback bool
}

// DefaultTopKRatio is the default top-k ratio (1%).
const DefaultTopKRatio = 0.01

// TopK sends, from every rank, the k entries of largest magnitude (of the
// gradient plus the residual, with error feedback) as (index, value) pairs;
// the pairs of all ranks are all-gathered and summed in rank order, then
// divided by n. Ties in magnitude go to the lower index.
type TopK struct {
	*base
	cfg   TopKConfig
	total int
	k     int
	plain *Plain

	res  []float32 // residual (error feedback), len total
	work []float32 // gradient + residual
	keys []uint32  // scratch for selection: |x| bits
	idx  []int32   // the selected indices, ascending
	msg  []float32 // this rank's message: k (index bits, value) pairs
	all  []float32 // every rank's message
}

var (
	_ Reducer  = (*TopK)(nil)
	_ Stateful = (*TopK)(nil)
)

// NewTopK returns a top-k reducer for a gradient laid out as segs; the
// plain all-reduce before cfg.StartIter uses buckets of bucketCapBytes.
func NewTopK(ring aggregator.Ring, opts aggregator.Options, segs []models.Segment, bucketCapBytes int, cfg TopKConfig) (*TopK, error) {
	total, err := cfg.resolve(segs)
	if err != nil {
		return nil, err
	}
	b := newBase(ring, opts)
	t := newTopKCore(total, cfg)
	t.base, t.plain = b, newPlain(b, segs, bucketCapBytes)
	t.msg = make([]float32, 2*t.k)
	t.all = make([]float32, 2*t.k*b.n)
	return t, nil
}

// newTopKCore builds top-k's selection buffers and residual (cfg resolved)
// without a ring.
func newTopKCore(total int, cfg TopKConfig) *TopK {
	t := &TopK{cfg: cfg, total: total}
	t.k = topKCount(total, cfg.Ratio)
	t.work = make([]float32, total)
	if !cfg.NoErrorFeedback {
		t.res = make([]float32, total)
	}
	t.keys = make([]uint32, total)
	t.idx = make([]int32, 0, t.k)
	return t
}

// resolve replaces zero values by the defaults, checks the ranges and
// returns the length of the gradient segs lay out.
func (cfg *TopKConfig) resolve(segs []models.Segment) (int, error) {
	if cfg.Ratio == 0 {
		cfg.Ratio = DefaultTopKRatio
	}
	if !(cfg.Ratio > 0 && cfg.Ratio <= 1) {
		return 0, fmt.Errorf("compress: topk ratio %v: want 0 < ratio ≤ 1 (0: default %v)", cfg.Ratio, DefaultTopKRatio)
	}
	if cfg.StartIter < 0 {
		return 0, fmt.Errorf("compress: topk start_iter %d: want ≥ 0", cfg.StartIter)
	}
	total, err := checkSegments(segs)
	if err != nil {
		return 0, err
	}
	if total > math.MaxInt32 {
		return 0, fmt.Errorf("compress: topk: %d elements; indices are sent as 32-bit integers", total)
	}
	return total, nil
}

// topKCount is max(1, ⌊ratio·n⌋), and 0 for an empty gradient.
func topKCount(n int, ratio float64) int {
	if n == 0 {
		return 0
	}
	return min(n, max(1, int(ratio*float64(n))))
}

// K is the number of entries each rank sends per compressed step.
func (t *TopK) K() int { return t.k }

// Reduce implements Reducer.
func (t *TopK) Reduce(ctx context.Context, grads []float32, step int64) error {
	c, err := t.begin(grads, t.total, step)
	if err != nil {
		return err
	}
	raw := 4 * int64(len(grads))
	if before, err := c.beforeStart(ctx, t.plain, grads, step, t.cfg.StartIter); before {
		return err
	}
	w := t.work
	copy(w, grads)
	if t.res != nil {
		add(w, t.res)
	}
	t.idx = selectTopK(t.idx[:0], t.keys, w, t.k)
	for i, j := range t.idx {
		t.msg[2*i] = math.Float32frombits(uint32(j))
		t.msg[2*i+1] = w[j]
	}
	if err := c.allGather(ctx, t.all, t.msg); err != nil {
		return err // the residual is untouched
	}
	if t.res != nil {
		for _, j := range t.idx {
			w[j] = 0
		}
		t.res, t.work = w, t.res
	}
	clear(grads)
	for i := 0; i < len(t.all); i += 2 {
		j := math.Float32bits(t.all[i])
		if int(j) >= len(grads) {
			return fmt.Errorf("compress: topk: rank %d sent index %d, gradient has %d elements", i/(2*t.k), j, len(grads))
		}
		grads[j] += t.all[i+1]
	}
	scale(grads, t.inv)
	c.done(raw, 8*int64(t.k))
	return nil
}

// selectTopK appends to dst the indices of the k elements of x of largest
// magnitude, ascending; among equal magnitudes the lower indices win. It
// is a radix select over the bits of |x| (for non-negative floats the bit
// patterns order like the values), O(len(x)) with no worst case. keys is
// scratch of len(x). A NaN counts as larger than any number.
func selectTopK(dst []int32, keys []uint32, x []float32, k int) []int32 {
	if k == 0 {
		return dst
	}
	keys = keys[:len(x)]
	for i, v := range x {
		keys[i] = math.Float32bits(v) &^ (1 << 31)
	}
	// Find the k-th largest key T, one byte at a time from the top: prefix
	// holds the bytes found so far, need how many of the keys above the
	// current candidates are still to be taken.
	var prefix, mask uint32
	need := k
	for shift := 24; shift >= 0; shift -= 8 {
		var hist [256]int
		for _, key := range keys {
			if key&mask == prefix {
				hist[key>>shift&0xff]++
			}
		}
		b := 255
		for ; b > 0 && hist[b] < need; b-- {
			need -= hist[b]
		}
		prefix |= uint32(b) << shift
		mask |= 0xff << shift
	}
	// Every key > T is taken; then need keys equal to T, lowest index
	// first.
	for i, key := range keys {
		switch {
		case key > prefix:
			dst = append(dst, int32(i))
		case key == prefix && need > 0:
			dst = append(dst, int32(i))
			need--
		}
	}
	return dst
}

// State implements Stateful: "topk.residual" ([n]) with error feedback.
func (t *TopK) State() map[string]models.Tensor {
	if t.res == nil {
		return map[string]models.Tensor{}
	}
	return map[string]models.Tensor{"topk.residual": f32([]int{t.total}, t.res)}
}

// SetState implements Stateful; a missing residual is zero.
func (t *TopK) SetState(st map[string]models.Tensor) error {
	want := map[string][]int{}
	if t.res != nil {
		want["topk.residual"] = []int{t.total}
	}
	if err := checkStateNames(st, want); err != nil {
		return err
	}
	if tr, ok := st["topk.residual"]; ok {
		v, err := tr.Float32s()
		if err != nil {
			return fmt.Errorf("compress: SetState: topk.residual: %w", err)
		}
		copy(t.res, v)
	} else if t.res != nil {
		clear(t.res)
	}
	return nil
}

// FlatLen implements Stateful: no shared state; Own is the residual.
func (t *TopK) FlatLen() (shared, own int) { return 0, len(t.res) }

// CopyState implements Stateful.
func (t *TopK) CopyState(dst *Flat) {
	dst.SharedSet = false
	copy(dst.Own[:len(t.res)], t.res)
}

// RestoreState implements Stateful.
func (t *TopK) RestoreState(src *Flat) error {
	_, err := restoreFlat(src, nil, t.res)
	return err
}
