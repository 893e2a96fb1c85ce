package tensorpar

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/gradsync/gradsync/models"
)

// Contiguous splits classes 0..classes−1 into l contiguous shards whose
// sizes differ by at most one (rank r holds [r·C/L, (r+1)·C/L)).
func Contiguous(classes, l int) ([][]int, error) {
	if l < 1 || classes < l {
		return nil, fmt.Errorf("tensorpar: cannot split %d classes over %d label shards (want 1 ≤ L ≤ classes)", classes, l)
	}
	out := make([][]int, l)
	for r := range l {
		for c := r * classes / l; c < (r+1)*classes/l; c++ {
			out[r] = append(out[r], c)
		}
	}
	return out, nil
}

// FromGroups splits classes by the user's groups (e.g. CIFAR-100's
// superclasses): groups are given to the l ranks in contiguous runs of
// ⌊G/L⌋ or ⌈G/L⌉ groups; every class must be in exactly one group.
func FromGroups(groups [][]int, classes, l int) ([][]int, error) {
	if l < 1 || len(groups) < l {
		return nil, fmt.Errorf("tensorpar: cannot give %d label groups to %d label shards", len(groups), l)
	}
	seen := make([]bool, classes)
	for gi, g := range groups {
		for _, c := range g {
			if c < 0 || c >= classes {
				return nil, fmt.Errorf("tensorpar: label group %d: class %d outside [0, %d)", gi, c, classes)
			}
			if seen[c] {
				return nil, fmt.Errorf("tensorpar: label group %d: class %d is in two groups", gi, c)
			}
			seen[c] = true
		}
	}
	if i := slices.Index(seen, false); i >= 0 {
		return nil, fmt.Errorf("tensorpar: class %d is in no label group", i)
	}
	out := make([][]int, l)
	G := len(groups)
	for r := range l {
		for gi := r * G / l; gi < (r+1)*G/l; gi++ {
			out[r] = append(out[r], groups[gi]...)
		}
		if len(out[r]) == 0 {
			return nil, fmt.Errorf("tensorpar: label shard %d would hold no class", r)
		}
	}
	return out, nil
}

// Head is one rank's shard of a label-sharded classifier head: the rows of
// a Linear(In → Classes) for the classes it owns (Owned, global indices),
// in that order. Its input is the same on every rank of the group.
//
// Communication per step, b the batch size, all within the group:
// Loss does all-reduces of b values each — the max (Max), the sum of
// exponentials and the target logit from its owner (Sum), and with label
// smoothing one more of Σ_c w_c·z_c — so 3 or 4; BCELoss (multi-label,
// bce.go) instead does one all-reduce of b values; Backward does one Sum
// all-reduce of b·In values (the input gradient). Evaluation
// (headeval.go): Predict and Correct one all-gather of 2b values; Ranks
// and CorrectTopK (top-k for any k) two all-reduces of b values.
type Head struct {
	In, Classes int
	Owned       []int
	Lin         *models.Linear // W (len(Owned), In), B, DW, DB: this rank's rows

	g     Group
	local []int // local[c] = row of global class c here, or −1
	batch int
	z, dz []float32
	// per-example reductions, reused
	m, s, t, wz []float32
	tl, pw      []float32 // BCELoss's columns of targets and posWeight
}

// NewHead returns rank g.Rank()'s shard of a head with the given shards
// (from Contiguous or FromGroups; shards[r] is rank r's classes). Its
// parameters are its own buffers, zero; copy rows in with SetFromFull.
func NewHead(g Group, in, classes int, shards [][]int) (*Head, error) {
	if len(shards) != g.Size() {
		return nil, fmt.Errorf("tensorpar: %d label shards for a group of %d", len(shards), g.Size())
	}
	if classes > maxExact {
		return nil, fmt.Errorf("tensorpar: %d classes: a label-sharded head holds at most %d (class indices travel as float32)", classes, maxExact)
	}
	local := make([]int, classes)
	for i := range local {
		local[i] = -1
	}
	own := shards[g.Rank()]
	if len(own) == 0 {
		return nil, fmt.Errorf("tensorpar: label shard %d holds no class", g.Rank())
	}
	for i, c := range own {
		if c < 0 || c >= classes || local[c] >= 0 {
			return nil, fmt.Errorf("tensorpar: label shard %d: bad or repeated class %d", g.Rank(), c)
		}
		local[c] = i
	}
	lin := models.NewLinear(in, len(own))
	lin.W, lin.DW = make([]float32, in*len(own)), make([]float32, in*len(own))
	lin.B, lin.DB = make([]float32, len(own)), make([]float32, len(own))
	return &Head{In: in, Classes: classes, Owned: own, Lin: lin, g: g, local: local}, nil
}

// SetFromFull copies this shard's rows out of a whole head's weight
// (Classes, In) and bias (Classes).
func (h *Head) SetFromFull(w, b []float32) {
	for i, c := range h.Owned {
		copy(h.Lin.W[i*h.In:(i+1)*h.In], w[c*h.In:(c+1)*h.In])
		h.Lin.B[i] = b[c]
	}
}

// Forward returns this rank's logits (batch, len(Owned)).
func (h *Head) Forward(x []float32, batch int) []float32 {
	h.batch = batch
	h.z = h.Lin.Forward(x, batch, true)
	return h.z
}

// Loss returns the cross-entropy of models.SoftmaxCrossEntropyWith over
// the whole head (the same value on every rank) and keeps this rank's
// logit gradient for Backward. opt.ClassWeights, if set, has all Classes
// weights (every rank knows them). Labels out of range are an error.
func Loss[L models.Label](ctx context.Context, h *Head, labels []L, opt models.CEOptions) (float32, error) {
	b, k := h.batch, len(h.Owned)
	if len(labels) != b {
		return 0, fmt.Errorf("tensorpar: %d labels for a batch of %d", len(labels), b)
	}
	w := opt.ClassWeights
	if w != nil && len(w) != h.Classes {
		return 0, fmt.Errorf("tensorpar: %d class weights for %d classes", len(w), h.Classes)
	}
	eps := float64(opt.LabelSmoothing)
	if !(eps >= 0 && eps <= 1) {
		return 0, fmt.Errorf("tensorpar: label smoothing %v outside [0, 1]", opt.LabelSmoothing)
	}
	weight := func(c int) float64 {
		if w == nil {
			return 1
		}
		return float64(w[c])
	}
	wsum, wall := float64(b), float64(h.Classes)
	if w != nil {
		wsum, wall = 0, 0
		for _, v := range w {
			wall += float64(v)
		}
	}
	for i, y := range labels {
		if int(y) < 0 || int(y) >= h.Classes {
			return 0, fmt.Errorf("tensorpar: label %d of sample %d outside [0, %d)", y, i, h.Classes)
		}
		if w != nil {
			wsum += float64(w[y])
		}
	}
	h.m, h.s, h.t = grow(h.m, b), grow(h.s, b), grow(h.t, b)
	for i := range b {
		h.m[i] = slices.Max(h.z[i*k : (i+1)*k])
	}
	if err := h.g.AllReduce(ctx, h.m, Max); err != nil {
		return 0, err
	}
	for i, y := range labels {
		var s float64
		for _, v := range h.z[i*k : (i+1)*k] {
			s += math.Exp(float64(v - h.m[i]))
		}
		h.s[i] = float32(s)
		h.t[i] = 0
		if j := h.local[y]; j >= 0 {
			h.t[i] = h.z[i*k+j]
		}
	}
	if err := h.g.AllReduce(ctx, h.s, Sum); err != nil {
		return 0, err
	}
	if err := h.g.AllReduce(ctx, h.t, Sum); err != nil {
		return 0, err
	}
	if eps != 0 {
		h.wz = grow(h.wz, b)
		for i := range b {
			var s float64
			for j, v := range h.z[i*k : (i+1)*k] {
				s += weight(h.Owned[j]) * float64(v)
			}
			h.wz[i] = float32(s)
		}
		if err := h.g.AllReduce(ctx, h.wz, Sum); err != nil {
			return 0, err
		}
	}
	h.dz = grow(h.dz, b*k)
	if wsum == 0 {
		clear(h.dz)
		return 0, nil
	}
	nllScale := (1 - eps) / wsum
	smoothScale := eps / float64(h.Classes) / wsum
	var total float64
	for i, y := range labels {
		lse := float64(h.m[i]) + math.Log(float64(h.s[i]))
		wy := weight(int(y))
		total += nllScale * wy * (lse - float64(h.t[i]))
		if eps != 0 {
			total += smoothScale * (wall*lse - float64(h.wz[i]))
		}
		for j, v := range h.z[i*k : (i+1)*k] {
			p := math.Exp(float64(v) - lse)
			g := nllScale*wy*p + smoothScale*(wall*p-weight(h.Owned[j]))
			if h.Owned[j] == int(y) {
				g -= nllScale * wy
			}
			h.dz[i*k+j] = float32(g)
		}
	}
	return float32(total), nil
}

// Backward adds this shard's parameter gradients and returns the gradient
// of the loss with respect to the (replicated) input, summed over the
// group.
func (h *Head) Backward(ctx context.Context) ([]float32, error) {
	dx := h.Lin.Backward(h.dz)
	if err := h.g.AllReduce(ctx, dx, Sum); err != nil {
		return nil, err
	}
	return dx, nil
}

// DLogits is this rank's logit gradient from the last Loss.
func (h *Head) DLogits() []float32 { return h.dz }

// Correct returns how many examples of the last Forward have their label
// as the top-1 class of the whole head (ties to the lower class index),
// from Predict's one all-gather of 2b values.
func Correct[L models.Label](ctx context.Context, h *Head, labels []L) (int, error) {
	if len(labels) != h.batch {
		return 0, fmt.Errorf("tensorpar: %d labels for a batch of %d", len(labels), h.batch)
	}
	pred, err := Predict(ctx, h)
	if err != nil {
		return 0, err
	}
	correct := 0
	for i, y := range labels {
		if pred[i] == int(y) {
			correct++
		}
	}
	return correct, nil
}

func grow(buf []float32, n int) []float32 {
	if cap(buf) < n {
		return make([]float32, n)
	}
	return buf[:n]
}
