package tensorpar

import (
	"context"
	"fmt"
)

// gatherShards all-gathers every rank's flat buffer local, of size(q)
// values on rank q, padded to the longest so that all ranks pass the same
// length: one all-gather of max_q size(q) values per rank. It returns
// rank q's buffer as part(q).
func gatherShards(ctx context.Context, g Group, local []float32, size func(q int) int) (part func(q int) []float32, err error) {
	n := g.Size()
	per := 0
	for q := range n {
		per = max(per, size(q))
	}
	if len(local) != size(g.Rank()) {
		panic(fmt.Sprintf("tensorpar: gatherShards: rank %d has %d values, want %d", g.Rank(), len(local), size(g.Rank())))
	}
	src := make([]float32, per)
	copy(src, local)
	all := make([]float32, n*per)
	if err := g.AllGather(ctx, all, src); err != nil {
		return nil, err
	}
	return func(q int) []float32 { return all[q*per : q*per+size(q)] }, nil
}

// GatherParams returns the whole block's weights, in PyTorch's layout,
// on every rank of the group (for a checkpoint: PyTorch loads them as
// from one worker): one all-gather of the longest shard's values. With
// grads it gathers the gradients instead.
func (m *MLP) GatherParams(ctx context.Context, grads bool) (MLPWeights, error) {
	buf := m.params
	if grads {
		buf = m.grads
	}
	return m.Gather(ctx, buf)
}

// Gather is GatherParams of any buffer laid out as Params (an optimiser's
// state of this rank's shard): the whole block's tensors of it, on every
// rank.
func (m *MLP) Gather(ctx context.Context, buf []float32) (MLPWeights, error) {
	if len(buf) != len(m.params) {
		return MLPWeights{}, fmt.Errorf("tensorpar: MLP.Gather: %d values, want %d (laid out as Params)", len(buf), len(m.params))
	}
	l := m.g.Size()
	part, err := gatherShards(ctx, m.g, buf, func(q int) int { return mlpLen(l, q, m.In, m.Hidden, m.Out) })
	if err != nil {
		return MLPWeights{}, fmt.Errorf("tensorpar: MLP.GatherParams: %w", err)
	}
	w := MLPWeights{W1: make([]float32, m.Hidden*m.In), B1: make([]float32, m.Hidden),
		W2: make([]float32, m.Out*m.Hidden), B2: make([]float32, m.Out)}
	for q := range l {
		// rank q's shard, bound as rank q's MLP binds its buffer.
		mq := newMLP(m.g, q, m.In, m.Hidden, m.Out, part(q), part(q))
		if err := mq.CopyParamsTo(w); err != nil {
			return MLPWeights{}, err
		}
	}
	return w, nil
}

// GatherParams returns the whole attention's weights (in_proj packed as
// PyTorch's) on every rank of the group: one all-gather of the longest
// shard's values. With grads it gathers the gradients instead.
func (a *Attention) GatherParams(ctx context.Context, grads bool) (AttentionWeights, error) {
	buf := a.params
	if grads {
		buf = a.grads
	}
	return a.Gather(ctx, buf)
}

// Gather is GatherParams of any buffer laid out as Params (an optimiser's
// state of this rank's shard): the whole attention's tensors of it, on
// every rank.
func (a *Attention) Gather(ctx context.Context, buf []float32) (AttentionWeights, error) {
	if len(buf) != len(a.params) {
		return AttentionWeights{}, fmt.Errorf("tensorpar: Attention.Gather: %d values, want %d (laid out as Params)", len(buf), len(a.params))
	}
	part, err := gatherShards(ctx, a.g, buf, func(q int) int { return attentionLen(a.g.Size(), q, a.D, a.Heads) })
	if err != nil {
		return AttentionWeights{}, fmt.Errorf("tensorpar: Attention.GatherParams: %w", err)
	}
	d := a.D
	w := AttentionWeights{InW: make([]float32, 3*d*d), InB: make([]float32, 3*d), OutW: make([]float32, d*d), OutB: make([]float32, d)}
	for q := range a.g.Size() {
		aq := newAttention(a.g, q, d, a.Heads, a.Tokens, part(q), part(q))
		if err := aq.CopyParamsTo(w); err != nil {
			return AttentionWeights{}, err
		}
	}
	return w, nil
}

// ShardOf copies this rank's shard of full (whole-attention tensors, e.g.
// an optimiser's state read from a checkpoint) into dst, laid out as
// Params.
func (a *Attention) ShardOf(dst []float32, full AttentionWeights) error {
	if len(dst) != len(a.params) {
		return fmt.Errorf("tensorpar: Attention.ShardOf: %d values, want %d (laid out as Params)", len(dst), len(a.params))
	}
	return newAttention(a.g, a.g.Rank(), a.D, a.Heads, a.Tokens, dst, dst).SetFromFull(full)
}

// GatherParams returns the whole block's weights on every rank of the
// group: the layer norms from this rank (they are replicated), the
// attention's and the MLP's gathered (two all-gathers). With grads it
// gathers the gradients instead.
func (b *Block) GatherParams(ctx context.Context, grads bool) (BlockWeights, error) {
	buf := b.params
	if grads {
		buf = b.grads
	}
	return b.Gather(ctx, buf)
}

// blockViews splits buf, laid out as Params, into its parts: the layer
// norms, the attention's shard and the MLP's.
func (b *Block) blockViews(buf []float32) (n1w, n1b, attn, n2w, n2b, mlp []float32) {
	d, na := b.D, len(b.Attn.params)
	return buf[:d], buf[d : 2*d], buf[2*d : 2*d+na], buf[2*d+na : 3*d+na], buf[3*d+na : 4*d+na], buf[4*d+na:]
}

// Gather is GatherParams of any buffer laid out as Params (an optimiser's
// state of this rank's shard): the whole block's tensors of it, on every
// rank, its layer norms' from this rank.
func (b *Block) Gather(ctx context.Context, buf []float32) (BlockWeights, error) {
	if len(buf) != len(b.params) {
		return BlockWeights{}, fmt.Errorf("tensorpar: Block.Gather: %d values, want %d (laid out as Params)", len(buf), len(b.params))
	}
	n1w, n1b, attn, n2w, n2b, mlp := b.blockViews(buf)
	at, err := b.Attn.Gather(ctx, attn)
	if err != nil {
		return BlockWeights{}, err
	}
	m, err := b.MLP.Gather(ctx, mlp)
	if err != nil {
		return BlockWeights{}, err
	}
	cl := func(s []float32) []float32 { return append([]float32(nil), s...) }
	return BlockWeights{Norm1W: cl(n1w), Norm1B: cl(n1b), Attn: at, Norm2W: cl(n2w), Norm2B: cl(n2b), MLP: m}, nil
}

// ShardOf copies this rank's shard of full (whole-block tensors, e.g. an
// optimiser's state read from a checkpoint) into dst, laid out as Params.
func (b *Block) ShardOf(dst []float32, full BlockWeights) error {
	if len(dst) != len(b.params) {
		return fmt.Errorf("tensorpar: Block.ShardOf: %d values, want %d (laid out as Params)", len(dst), len(b.params))
	}
	if err := full.check(b.D, b.Hidden); err != nil {
		return err
	}
	n1w, n1b, attn, n2w, n2b, mlp := b.blockViews(dst)
	copy(n1w, full.Norm1W)
	copy(n1b, full.Norm1B)
	copy(n2w, full.Norm2W)
	copy(n2b, full.Norm2B)
	if err := b.Attn.ShardOf(attn, full.Attn); err != nil {
		return err
	}
	return b.MLP.ShardOf(mlp, full.MLP)
}

// GatherParams returns the whole layer's weight (Out, In) and bias (Out),
// in PyTorch's layout, on every rank of the grid (for a checkpoint): one
// all-gather down the column of the weight blocks (max_i Out_j·In_i
// values per rank), which gives each rank its column's (Out_j, In) slab,
// then one along the row of the slabs with their bias blocks
// (max_j Out_j·(In+1)). With grads it gathers the gradients instead.
func (l *Linear2D) GatherParams(ctx context.Context, grads bool) (w, b []float32, err error) {
	wb, bb := l.W, l.B
	if grads {
		wb, bb = l.DW, l.DB
	}
	q := l.Q
	olo, ohi := Span(l.Out, q, l.J)
	no := ohi - olo
	inBlock := func(i int) (lo, n int) {
		lo, hi := Span(l.In, q, i)
		return lo, hi - lo
	}
	colPart, err := gatherShards(ctx, l.col, wb, func(i int) int {
		_, n := inBlock(i)
		return no * n
	})
	if err != nil {
		return nil, nil, fmt.Errorf("tensorpar: Linear2D.GatherParams: %w", err)
	}
	slab := make([]float32, no*l.In+no) // (Out_j, In), then the bias block
	for i := range q {
		lo, n := inBlock(i)
		p := colPart(i)
		for o := range no {
			copy(slab[o*l.In+lo:o*l.In+lo+n], p[o*n:(o+1)*n])
		}
	}
	copy(slab[no*l.In:], bb)
	rowPart, err := gatherShards(ctx, l.row, slab, func(j int) int {
		lo, hi := Span(l.Out, q, j)
		return (hi - lo) * (l.In + 1)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("tensorpar: Linear2D.GatherParams: %w", err)
	}
	w, b = make([]float32, l.Out*l.In), make([]float32, l.Out)
	for j := range q {
		lo, hi := Span(l.Out, q, j)
		p := rowPart(j)
		copy(w[lo*l.In:hi*l.In], p[:(hi-lo)*l.In])
		copy(b[lo:hi], p[(hi-lo)*l.In:])
	}
	return w, b, nil
}

// ShardOf copies this rank's shard of full (whole-block tensors, e.g. an
// optimiser's state read from a checkpoint) into dst, laid out as Params.
func (m *MLP) ShardOf(dst []float32, full MLPWeights) error {
	if len(dst) != len(m.params) {
		return fmt.Errorf("tensorpar: MLP.ShardOf: %d values, want %d (laid out as Params)", len(dst), len(m.params))
	}
	if err := full.check(m.In, m.Hidden, m.Out); err != nil {
		return err
	}
	mv := newMLP(m.g, m.g.Rank(), m.In, m.Hidden, m.Out, dst, dst)
	m.scatter(mv.W1, mv.B1, mv.W2, mv.B2, full)
	return nil
}
