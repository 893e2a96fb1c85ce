package tensorpar

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/gradsync/gradsync/models"
)

// maxExact is the largest size the shape handshake carries exactly in a
// float32 (2²⁴).
const maxExact = 1 << 24

// Span returns rank r's share [lo, hi) of n items split contiguously over
// l ranks: [r·n/l, (r+1)·n/l), so shares differ in size by at most one
// (the same split as Contiguous).
func Span(n, l, r int) (lo, hi int) {
	return r * n / l, (r + 1) * n / l
}

// MLPWeights are the tensors of a whole (unsharded) MLP block
// fc2(GELU(fc1(x))) in PyTorch's layout, as models.Linear holds them.
type MLPWeights struct {
	W1 []float32 // fc1.weight (Hidden, In)
	B1 []float32 // fc1.bias (Hidden)
	W2 []float32 // fc2.weight (Out, Hidden)
	B2 []float32 // fc2.bias (Out)
}

func (w MLPWeights) check(in, hidden, out int) error {
	if len(w.W1) != hidden*in || len(w.B1) != hidden || len(w.W2) != out*hidden || len(w.B2) != out {
		return fmt.Errorf("tensorpar: MLP weights have lengths W1=%d B1=%d W2=%d B2=%d, want %d, %d, %d, %d (In %d, Hidden %d, Out %d)",
			len(w.W1), len(w.B1), len(w.W2), len(w.B2), hidden*in, hidden, out*hidden, out, in, hidden, out)
	}
	return nil
}

// MLP is one rank's shard of a Megatron-style tensor-parallel MLP block
// (Shoeybi et al. 2019, §3): y = GELU(x·W1ᵀ + b1)·W2ᵀ + b2, fc1 In→Hidden
// and fc2 Hidden→Out, with the hidden units split contiguously over the
// group (Span; shards may differ by one unit when L does not divide
// Hidden, and L > Hidden is refused). fc1 is column-parallel: this rank
// holds the rows Lo..Hi−1 of fc1.weight and fc1.bias and computes its
// hidden units and their GELU with no communication. fc2 is
// row-parallel: it holds the columns Lo..Hi−1 of fc2.weight, computes a
// partial output, and the partials are summed by one all-reduce; fc2.bias
// is whole on every rank and added once, after that all-reduce.
//
// In Megatron's terms the block's input goes through f (identity forward,
// all-reduce backward) and its output through g (all-reduce forward,
// identity backward). The input x and the output gradient dy are the same
// on every rank; the output y and the input gradient dx come back the
// same on every rank.
//
// Communication per step, b the batch size, all within the group: Forward
// does one Sum all-reduce of b·Out values, Backward one of b·In values;
// nothing else. NewMLP does one Max all-reduce of 6 values (the shape
// handshake).
//
// Parameters and gradients live in one flat buffer each (Params, Grads),
// in the order fc1.weight, fc1.bias, fc2.weight, fc2.bias; the fields
// are views into them. Arithmetic is float32 (models.FP32).
type MLP struct {
	In, Hidden, Out int
	Lo, Hi          int // this rank's hidden units

	W1, B1, DW1, DB1 []float32 // fc1's rows Lo..Hi−1: W1 (Hi−Lo, In), B1 (Hi−Lo)
	W2, DW2          []float32 // fc2's columns Lo..Hi−1: (Out, Hi−Lo)
	B2, DB2          []float32 // fc2.bias (Out), whole on every rank

	g             Group
	params, grads []float32
	fc1           *models.Linear // views W1, B1, DW1, DB1
	fc2           rowParallel    // views W2, B2, DW2, DB2
	act           activation     // GELU, or ReLU (MLPOptions)
	noInputGrad   bool
	batch         int
}

// activation is the element-wise layer between fc1 and fc2.
type activation interface {
	Forward(x []float32, batch int, train bool) []float32
	Backward(dy []float32) []float32
}

// MLPOptions vary the block for models other than the ViT's: ReLU
// instead of GELU between fc1 and fc2 (the mlp model's fc1, fc2), and
// NoInputGrad for a block at the network's input, whose Backward then
// computes no input gradient and does no all-reduce (returning nil).
type MLPOptions struct {
	ReLU        bool
	NoInputGrad bool
}

// NewMLP returns rank g.Rank()'s shard of an MLP block with zero
// parameters (set them with SetFromFull). Every rank of g must call it
// with the same sizes: it checks so with one all-reduce, and a rank that
// disagrees, or a group of another size, is an error on every rank.
func NewMLP(ctx context.Context, g Group, in, hidden, out int) (*MLP, error) {
	return NewMLPWith(ctx, g, in, hidden, out, MLPOptions{})
}

// NewMLPWith is NewMLP with options.
func NewMLPWith(ctx context.Context, g Group, in, hidden, out int, opt MLPOptions) (*MLP, error) {
	if err := checkMLP(g, in, hidden, out); err != nil {
		return nil, err
	}
	if err := agree(ctx, g, "MLP", []string{"In", "Hidden", "Out"}, in, hidden, out); err != nil {
		return nil, err
	}
	n := mlpLen(g.Size(), g.Rank(), in, hidden, out)
	m := newMLP(g, g.Rank(), in, hidden, out, make([]float32, n), make([]float32, n))
	if opt.ReLU {
		m.act = &models.ReLU{}
	}
	m.noInputGrad = opt.NoInputGrad
	m.fc1.SkipInputGrad = opt.NoInputGrad
	return m, nil
}

// checkMLP refuses sizes that cannot be split over g, before any
// communication.
func checkMLP(g Group, in, hidden, out int) error {
	l := g.Size()
	if in < 1 || hidden < 1 || out < 1 || in > maxExact || hidden > maxExact || out > maxExact {
		return fmt.Errorf("tensorpar: MLP sizes In %d, Hidden %d, Out %d: want each in [1, 2²⁴]", in, hidden, out)
	}
	if l < 1 || l > hidden {
		return fmt.Errorf("tensorpar: cannot split %d hidden units over %d tensor-parallel ranks (want 1 ≤ L ≤ Hidden)", hidden, l)
	}
	return nil
}

// mlpLen is the length of rank r of l's flat parameter buffer.
func mlpLen(l, r, in, hidden, out int) int {
	lo, hi := Span(hidden, l, r)
	k := hi - lo
	return k*in + k + out*k + out
}

// agree checks with one Max all-reduce of 2·len(sizes) values that every
// rank of g passes the same sizes: the maxima of (sizes, −sizes) equal
// this rank's own on every rank only when all ranks agree. Sizes are at
// most maxExact, so float32 carries them exactly.
func agree(ctx context.Context, g Group, what string, names []string, sizes ...int) error {
	n := len(sizes)
	hs := make([]float32, 2*n)
	for i, s := range sizes {
		hs[i], hs[n+i] = float32(s), -float32(s)
	}
	if err := g.AllReduce(ctx, hs, Max); err != nil {
		return fmt.Errorf("tensorpar: %s shape handshake: %w", what, err)
	}
	for i, s := range sizes {
		if hs[i] != float32(s) || -hs[n+i] != float32(s) {
			var own, lo, hi []string
			for j, name := range names {
				own = append(own, fmt.Sprintf("%s %d", name, sizes[j]))
				lo = append(lo, fmt.Sprint(-hs[n+j]))
				hi = append(hi, fmt.Sprint(hs[j]))
			}
			return fmt.Errorf("tensorpar: %s rank %d has %s, but the group's ranks disagree (between %v and %v)",
				what, g.Rank(), strings.Join(own, ", "), lo, hi)
		}
	}
	return nil
}

// newMLP binds rank r's shard to params and grads (mlpLen values each);
// the sizes are checked. r is g.Rank() but for GatherParams's views of
// the other ranks' shards.
func newMLP(g Group, r, in, hidden, out int, params, grads []float32) *MLP {
	lo, hi := Span(hidden, g.Size(), r)
	k := hi - lo
	n1 := k*in + k
	m := &MLP{In: in, Hidden: hidden, Out: out, Lo: lo, Hi: hi, g: g, params: params, grads: grads, act: &models.GELU{}}
	views := func(b []float32) (w1, b1, w2, b2 []float32) {
		return b[:k*in], b[k*in : n1], b[n1 : n1+out*k], b[n1+out*k:]
	}
	m.W1, m.B1, m.W2, m.B2 = views(m.params)
	m.DW1, m.DB1, m.DW2, m.DB2 = views(m.grads)
	m.fc1 = models.NewLinear(in, k)
	m.fc1.W, m.fc1.B, m.fc1.DW, m.fc1.DB = m.W1, m.B1, m.DW1, m.DB1
	m.fc2 = rowParallel{K: k, Out: out, W: m.W2, DW: m.DW2, B: m.B2, DB: m.DB2}
	return m
}

// Params is this rank's flat parameter buffer (the fields' backing).
func (m *MLP) Params() []float32 { return m.params }

// Grads is this rank's flat gradient buffer, laid out as Params.
func (m *MLP) Grads() []float32 { return m.grads }

// SetFromFull copies this rank's shard out of a whole block's weights.
func (m *MLP) SetFromFull(full MLPWeights) error {
	if err := full.check(m.In, m.Hidden, m.Out); err != nil {
		return err
	}
	m.scatter(m.W1, m.B1, m.W2, m.B2, full)
	return nil
}

// CopyParamsTo writes this rank's shard into its place in whole-block
// tensors (fc2.bias whole), leaving the other ranks' places alone: every
// rank's call together unshard the block.
func (m *MLP) CopyParamsTo(dst MLPWeights) error {
	return m.gather(dst, m.W1, m.B1, m.W2, m.B2)
}

// CopyGradsTo is CopyParamsTo for the gradients.
func (m *MLP) CopyGradsTo(dst MLPWeights) error {
	return m.gather(dst, m.DW1, m.DB1, m.DW2, m.DB2)
}

// scatter copies full's shard into w1, b1, w2, b2 (this rank's shapes).
func (m *MLP) scatter(w1, b1, w2, b2 []float32, full MLPWeights) {
	k := m.Hi - m.Lo
	copy(w1, full.W1[m.Lo*m.In:m.Hi*m.In])
	copy(b1, full.B1[m.Lo:m.Hi])
	for o := range m.Out {
		copy(w2[o*k:(o+1)*k], full.W2[o*m.Hidden+m.Lo:o*m.Hidden+m.Hi])
	}
	copy(b2, full.B2)
}

// gather is scatter's inverse.
func (m *MLP) gather(dst MLPWeights, w1, b1, w2, b2 []float32) error {
	if err := dst.check(m.In, m.Hidden, m.Out); err != nil {
		return err
	}
	k := m.Hi - m.Lo
	copy(dst.W1[m.Lo*m.In:m.Hi*m.In], w1)
	copy(dst.B1[m.Lo:m.Hi], b1)
	for o := range m.Out {
		copy(dst.W2[o*m.Hidden+m.Lo:o*m.Hidden+m.Hi], w2[o*k:(o+1)*k])
	}
	copy(dst.B2, b2)
	return nil
}

// Forward returns the block's output y (batch, Out) for x (batch, In), the
// same on every rank; x is borrowed until Backward and y is owned, valid
// until the next Forward. All ranks must pass the same batch (a rank that
// does not makes the all-reduce fail on the ranks it meets).
func (m *MLP) Forward(ctx context.Context, x []float32, batch int) ([]float32, error) {
	m.batch = 0
	if batch < 1 || len(x) != batch*m.In {
		return nil, fmt.Errorf("tensorpar: MLP.Forward: len(x) = %d, want batch %d × In %d", len(x), batch, m.In)
	}
	// f: identity. fc1's shard and its GELU are local.
	z := m.fc1.Forward(x, batch, true)
	h := m.act.Forward(z, batch, true)
	// fc2's shard, then g: the partial outputs all-reduced, the bias once.
	y, err := m.fc2.forward(ctx, m.g, h, batch)
	if err != nil {
		return nil, fmt.Errorf("tensorpar: MLP.Forward: %w", err)
	}
	m.batch = batch
	return y, nil
}

// errNoForward is Backward's error without a successful Forward.
var errNoForward = errors.New("tensorpar: MLP.Backward without a successful Forward")

// Backward adds this rank's parameter gradients for dy (batch, Out), the
// same on every rank, and returns dx (batch, In) summed over the group:
// the same on every rank, owned and valid until the next Backward (nil,
// and no communication, with MLPOptions.NoInputGrad).
func (m *MLP) Backward(ctx context.Context, dy []float32) ([]float32, error) {
	if m.batch == 0 {
		return nil, errNoForward
	}
	b := m.batch
	if len(dy) != b*m.Out {
		return nil, fmt.Errorf("tensorpar: MLP.Backward: len(dy) = %d, want batch %d × Out %d", len(dy), b, m.Out)
	}
	// g: identity. fc2's bias (whole here) and shard, as models.Linear.
	dx := m.fc1.Backward(m.act.Backward(m.fc2.backward(dy)))
	if m.noInputGrad {
		return nil, nil
	}
	// f: all-reduce the input gradient's partials.
	if err := m.g.AllReduce(ctx, dx, Sum); err != nil {
		return nil, fmt.Errorf("tensorpar: MLP.Backward: %w", err)
	}
	return dx, nil
}
