package tensorpar

import (
	"context"
	"errors"
	"fmt"

	"github.com/gradsync/gradsync/internal/kernels"
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
	act           models.GELU
	batch         int
	h             []float32 // borrowed: GELU's output of the last Forward (batch, Hi−Lo)
	y, dh         []float32 // owned
}

// NewMLP returns rank g.Rank()'s shard of an MLP block with zero
// parameters (set them with SetFromFull). Every rank of g must call it
// with the same sizes: it checks so with one all-reduce, and a rank that
// disagrees, or a group of another size, is an error on every rank.
func NewMLP(ctx context.Context, g Group, in, hidden, out int) (*MLP, error) {
	l := g.Size()
	if in < 1 || hidden < 1 || out < 1 || in > maxExact || hidden > maxExact || out > maxExact {
		return nil, fmt.Errorf("tensorpar: MLP sizes In %d, Hidden %d, Out %d: want each in [1, 2²⁴]", in, hidden, out)
	}
	if l < 1 || l > hidden {
		return nil, fmt.Errorf("tensorpar: cannot split %d hidden units over %d tensor-parallel ranks (want 1 ≤ L ≤ Hidden)", hidden, l)
	}
	// The handshake: the maxima of (sizes, −sizes) equal this rank's own
	// on every rank only when all ranks agree.
	own := []float32{float32(in), float32(hidden), float32(out)}
	hs := []float32{own[0], own[1], own[2], -own[0], -own[1], -own[2]}
	if err := g.AllReduce(ctx, hs, Max); err != nil {
		return nil, fmt.Errorf("tensorpar: MLP shape handshake: %w", err)
	}
	for i := range own {
		if hs[i] != own[i] || -hs[i+3] != own[i] {
			return nil, fmt.Errorf("tensorpar: MLP rank %d has In %d, Hidden %d, Out %d, but the group's ranks disagree (between %v and %v)",
				g.Rank(), in, hidden, out, []float32{-hs[3], -hs[4], -hs[5]}, hs[:3])
		}
	}
	lo, hi := Span(hidden, l, g.Rank())
	k := hi - lo
	n1, n2 := k*in+k, out*k+out
	m := &MLP{In: in, Hidden: hidden, Out: out, Lo: lo, Hi: hi, g: g,
		params: make([]float32, n1+n2), grads: make([]float32, n1+n2)}
	views := func(b []float32) (w1, b1, w2, b2 []float32) {
		return b[:k*in], b[k*in : n1], b[n1 : n1+out*k], b[n1+out*k:]
	}
	m.W1, m.B1, m.W2, m.B2 = views(m.params)
	m.DW1, m.DB1, m.DW2, m.DB2 = views(m.grads)
	m.fc1 = models.NewLinear(in, k)
	m.fc1.W, m.fc1.B, m.fc1.DW, m.fc1.DB = m.W1, m.B1, m.DW1, m.DB1
	return m, nil
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
	k := m.Hi - m.Lo
	// f: identity. fc1's shard and its GELU are local.
	z := m.fc1.Forward(x, batch, true)
	m.h = m.act.Forward(z, batch, true)
	// fc2's shard: a partial sum of the output.
	m.y = grow(m.y, batch*m.Out)
	beta := float32(0)
	if m.g.Size() == 1 {
		// One rank: the all-reduce is the identity, so the bias goes in
		// first, exactly as models.Linear does (bit-identical to the
		// unsharded block whatever the GEMM's blocking).
		for i := range batch {
			copy(m.y[i*m.Out:(i+1)*m.Out], m.B2)
		}
		beta = 1
	}
	kernels.Gemm(false, true, batch, m.Out, k, 1, m.h, k, m.W2, k, beta, m.y, m.Out)
	// g: all-reduce the partials, then the bias once.
	if err := m.g.AllReduce(ctx, m.y, Sum); err != nil {
		return nil, fmt.Errorf("tensorpar: MLP.Forward: %w", err)
	}
	if m.g.Size() > 1 {
		for i := range batch {
			row := m.y[i*m.Out : (i+1)*m.Out]
			for j, b := range m.B2 {
				row[j] += b
			}
		}
	}
	m.batch = batch
	return m.y, nil
}

// errNoForward is Backward's error without a successful Forward.
var errNoForward = errors.New("tensorpar: MLP.Backward without a successful Forward")

// Backward adds this rank's parameter gradients for dy (batch, Out), the
// same on every rank, and returns dx (batch, In) summed over the group:
// the same on every rank, owned and valid until the next Backward.
func (m *MLP) Backward(ctx context.Context, dy []float32) ([]float32, error) {
	if m.batch == 0 {
		return nil, errNoForward
	}
	b, k := m.batch, m.Hi-m.Lo
	if len(dy) != b*m.Out {
		return nil, fmt.Errorf("tensorpar: MLP.Backward: len(dy) = %d, want batch %d × Out %d", len(dy), b, m.Out)
	}
	// g: identity. fc2's bias (whole here) and shard, as models.Linear.
	for i := range b {
		for j, v := range dy[i*m.Out : (i+1)*m.Out] {
			m.DB2[j] += v
		}
	}
	kernels.Gemm(true, false, m.Out, k, b, 1, dy, m.Out, m.h, k, 1, m.DW2, k)
	m.dh = grow(m.dh, b*k)
	kernels.Gemm(false, false, b, k, m.Out, 1, dy, m.Out, m.W2, k, 0, m.dh, k)
	dx := m.fc1.Backward(m.act.Backward(m.dh))
	// f: all-reduce the input gradient's partials.
	if err := m.g.AllReduce(ctx, dx, Sum); err != nil {
		return nil, fmt.Errorf("tensorpar: MLP.Backward: %w", err)
	}
	return dx, nil
}
