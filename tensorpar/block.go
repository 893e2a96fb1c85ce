package tensorpar

import (
	"context"
	"errors"
	"fmt"

	"github.com/gradsync/gradsync/models"
)

// BlockWeights are the tensors of a whole (unsharded) pre-norm
// transformer block in PyTorch's layout, as vit-tiny's blocks.i holds
// them: norm1, attn, norm2, mlp.fc1, mlp.fc2.
type BlockWeights struct {
	Norm1W, Norm1B []float32 // norm1.weight, norm1.bias (D)
	Attn           AttentionWeights
	Norm2W, Norm2B []float32  // norm2.weight, norm2.bias (D)
	MLP            MLPWeights // fc1 (Hidden, D), fc2 (D, Hidden)
}

func (w BlockWeights) check(d, hidden int) error {
	if len(w.Norm1W) != d || len(w.Norm1B) != d || len(w.Norm2W) != d || len(w.Norm2B) != d {
		return fmt.Errorf("tensorpar: block layer norms have lengths norm1 %d, %d and norm2 %d, %d, want D %d",
			len(w.Norm1W), len(w.Norm1B), len(w.Norm2W), len(w.Norm2B), d)
	}
	if err := w.Attn.check(d); err != nil {
		return err
	}
	return w.MLP.check(d, hidden, d)
}

// Block is one rank's shard of a tensor-parallel pre-norm transformer
// block, vit-tiny's (models' transformerBlocks):
//
//	h = x + attn(norm1(x));  y = h + mlp(norm2(h))
//
// over (batch, Tokens, D) inputs, with the attention split by heads
// (Attention) and the MLP D→Hidden→D split by hidden units (MLP) over the
// same group. The layer norms and the residual adds are replicated: their
// inputs are the same on every rank, so every rank computes them (and
// their gradients) identically and nothing about them is communicated.
//
// Communication per step, b the batch and s the tokens, all within the
// group: Forward does exactly two Sum all-reduces of b·s·D values (the g
// after attention and after the MLP), Backward two (the f before each):
// Megatron's "4 total communication operations in the forward and
// backward pass of a single model parallel transformer layer". NewBlock
// does one Max all-reduce of 8 values (the shape handshake).
//
// Parameters and gradients live in one flat buffer each (Params, Grads),
// in models' order: norm1.weight, norm1.bias, the attention's shard
// (Attention.Params' layout), norm2.weight, norm2.bias, the MLP's shard
// (MLP.Params' layout).
type Block struct {
	D, Heads, Tokens, Hidden int
	Norm1, Norm2             *models.LayerNorm // replicated; views into Params and Grads
	Attn                     *Attention
	MLP                      *MLP

	g             Group
	params, grads []float32
	batch         int
	h, y, dh, dx  []float32 // owned
}

// NewBlock returns rank g.Rank()'s shard of a transformer block with d
// values per token, heads attention heads, tokens tokens and an MLP of
// hidden units, with zero parameters (set them with SetFromFull). Every
// rank of g must call it with the same sizes: one all-reduce checks so.
func NewBlock(ctx context.Context, g Group, d, heads, tokens, hidden int) (*Block, error) {
	if err := checkAttention(g, d, heads, tokens); err != nil {
		return nil, err
	}
	if err := checkMLP(g, d, hidden, d); err != nil {
		return nil, err
	}
	if err := agree(ctx, g, "block", []string{"D", "Heads", "Tokens", "Hidden"}, d, heads, tokens, hidden); err != nil {
		return nil, err
	}
	na, nm := attentionLen(g.Size(), g.Rank(), d, heads), mlpLen(g.Size(), g.Rank(), d, hidden, d)
	n := 4*d + na + nm
	b := &Block{D: d, Heads: heads, Tokens: tokens, Hidden: hidden, g: g,
		params: make([]float32, n), grads: make([]float32, n)}
	norm := func(off int) *models.LayerNorm {
		l := models.NewLayerNorm(d)
		l.Weight, l.Bias = b.params[off:off+d], b.params[off+d:off+2*d]
		l.DWeight, l.DBias = b.grads[off:off+d], b.grads[off+d:off+2*d]
		return l
	}
	b.Norm1 = norm(0)
	b.Attn = newAttention(g, g.Rank(), d, heads, tokens, b.params[2*d:2*d+na], b.grads[2*d:2*d+na])
	b.Norm2 = norm(2*d + na)
	b.MLP = newMLP(g, g.Rank(), d, hidden, d, b.params[4*d+na:], b.grads[4*d+na:])
	return b, nil
}

// Params is this rank's flat parameter buffer.
func (b *Block) Params() []float32 { return b.params }

// Grads is this rank's flat gradient buffer, laid out as Params.
func (b *Block) Grads() []float32 { return b.grads }

// SetFromFull copies this rank's shard out of a whole block's weights.
func (b *Block) SetFromFull(full BlockWeights) error {
	if err := full.check(b.D, b.Hidden); err != nil {
		return err
	}
	copy(b.Norm1.Weight, full.Norm1W)
	copy(b.Norm1.Bias, full.Norm1B)
	copy(b.Norm2.Weight, full.Norm2W)
	copy(b.Norm2.Bias, full.Norm2B)
	if err := b.Attn.SetFromFull(full.Attn); err != nil {
		return err
	}
	return b.MLP.SetFromFull(full.MLP)
}

// CopyParamsTo writes this rank's shard into its place in whole-block
// tensors (the layer norms and the row-parallel biases whole): every
// rank's call together unshard the block.
func (b *Block) CopyParamsTo(dst BlockWeights) error {
	return b.copyTo(dst, false)
}

// CopyGradsTo is CopyParamsTo for the gradients.
func (b *Block) CopyGradsTo(dst BlockWeights) error {
	return b.copyTo(dst, true)
}

func (b *Block) copyTo(dst BlockWeights, grads bool) error {
	if err := dst.check(b.D, b.Hidden); err != nil {
		return err
	}
	n1, n2 := b.Norm1, b.Norm2
	copyAttn, copyMLP := b.Attn.CopyParamsTo, b.MLP.CopyParamsTo
	w1, b1, w2, b2 := n1.Weight, n1.Bias, n2.Weight, n2.Bias
	if grads {
		copyAttn, copyMLP = b.Attn.CopyGradsTo, b.MLP.CopyGradsTo
		w1, b1, w2, b2 = n1.DWeight, n1.DBias, n2.DWeight, n2.DBias
	}
	copy(dst.Norm1W, w1)
	copy(dst.Norm1B, b1)
	copy(dst.Norm2W, w2)
	copy(dst.Norm2B, b2)
	if err := copyAttn(dst.Attn); err != nil {
		return err
	}
	return copyMLP(dst.MLP)
}

// Forward returns the block's output y (batch, Tokens, D) for x (batch,
// Tokens, D), the same on every rank; y is owned, valid until the next
// Forward. The residual adds are models.Residual's (branch + input).
func (b *Block) Forward(ctx context.Context, x []float32, batch int) ([]float32, error) {
	b.batch = 0
	n := batch * b.Tokens * b.D
	if batch < 1 || len(x) != n {
		return nil, fmt.Errorf("tensorpar: Block.Forward: len(x) = %d, want batch %d × %d tokens × D %d", len(x), batch, b.Tokens, b.D)
	}
	at, err := b.Attn.Forward(ctx, b.Norm1.Forward(x, batch, true), batch)
	if err != nil {
		return nil, err
	}
	b.h = grow(b.h, n)
	for i, v := range at {
		b.h[i] = v + x[i]
	}
	m, err := b.MLP.Forward(ctx, b.Norm2.Forward(b.h, batch, true), batch*b.Tokens)
	if err != nil {
		return nil, err
	}
	b.y = grow(b.y, n)
	for i, v := range m {
		b.y[i] = v + b.h[i]
	}
	b.batch = batch
	return b.y, nil
}

// errNoBlockForward is Backward's error without a successful Forward.
var errNoBlockForward = errors.New("tensorpar: Block.Backward without a successful Forward")

// Backward adds this rank's parameter gradients for dy (batch, Tokens,
// D), the same on every rank, and returns dx, the same on every rank,
// owned and valid until the next Backward.
func (b *Block) Backward(ctx context.Context, dy []float32) ([]float32, error) {
	if b.batch == 0 {
		return nil, errNoBlockForward
	}
	n := b.batch * b.Tokens * b.D
	if len(dy) != n {
		return nil, fmt.Errorf("tensorpar: Block.Backward: len(dy) = %d, want batch %d × %d tokens × D %d", len(dy), b.batch, b.Tokens, b.D)
	}
	dm, err := b.MLP.Backward(ctx, dy)
	if err != nil {
		return nil, err
	}
	dn := b.Norm2.Backward(dm)
	b.dh = grow(b.dh, n)
	for i, v := range dn {
		b.dh[i] = v + dy[i]
	}
	da, err := b.Attn.Backward(ctx, b.dh)
	if err != nil {
		return nil, err
	}
	dn = b.Norm1.Backward(da)
	b.dx = grow(b.dx, n)
	for i, v := range dn {
		b.dx[i] = v + b.dh[i]
	}
	return b.dx, nil
}
