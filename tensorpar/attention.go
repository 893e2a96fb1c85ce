package tensorpar

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/gradsync/gradsync/models"
)

// AttentionWeights are the tensors of a whole (unsharded) self-attention
// block in PyTorch's layout, as models.SelfAttention holds them under
// torch.nn.MultiheadAttention's names.
type AttentionWeights struct {
	InW  []float32 // in_proj_weight (3D, D): the q rows, then k, then v
	InB  []float32 // in_proj_bias (3D)
	OutW []float32 // out_proj.weight (D, D)
	OutB []float32 // out_proj.bias (D)
}

func (w AttentionWeights) check(d int) error {
	if len(w.InW) != 3*d*d || len(w.InB) != 3*d || len(w.OutW) != d*d || len(w.OutB) != d {
		return fmt.Errorf("tensorpar: attention weights have lengths in_proj_weight=%d in_proj_bias=%d out_proj.weight=%d out_proj.bias=%d, want %d, %d, %d, %d (D %d)",
			len(w.InW), len(w.InB), len(w.OutW), len(w.OutB), 3*d*d, 3*d, d*d, d, d)
	}
	return nil
}

// Attention is one rank's shard of Megatron-style multi-head
// self-attention (Shoeybi et al. 2019, §3, figure 3b), split by heads:
// the same function as models.SelfAttention (torch.nn.MultiheadAttention
// with batch_first, query = key = value = x, no mask) over inputs
// (batch, Tokens, D).
//
// The Heads heads are split contiguously over the group (Span: rank r
// holds heads HeadLo..HeadHi−1; the counts differ by at most one when T
// does not divide Heads; T > Heads is refused). The input projection is
// column-parallel: this rank holds, of the packed in_proj_weight (3D, D)
// and in_proj_bias, the rows of its heads in each of the q, k and v
// blocks — its local in-projection is (3K, D), K = (HeadHi−HeadLo)·D/Heads,
// laid out q, k, v as PyTorch's — and computes its heads' attention with
// no communication. The output projection is row-parallel: it holds the
// columns of out_proj.weight for its heads, computes a partial output,
// and one all-reduce sums the partials; out_proj.bias is whole on every
// rank and added once, after it.
//
// In Megatron's terms the input goes through f (identity forward,
// all-reduce backward) and the output through g (all-reduce forward,
// identity backward): x and dy are the same on every rank, and y and dx
// come back the same on every rank.
//
// Communication per step, b the batch and s the tokens, all within the
// group: Forward does one Sum all-reduce of b·s·D values, Backward one of
// b·s·D; nothing else. NewAttention does one Max all-reduce of 6 values
// (the shape handshake).
//
// Parameters and gradients live in one flat buffer each (Params, Grads),
// in the order in_proj_weight, in_proj_bias, out_proj.weight,
// out_proj.bias (this rank's shards); the fields are views into them.
// Arithmetic is float32 (models.FP32), each head's exactly as
// models.SelfAttention's, so that with one rank the results are bit for
// bit models'.
type Attention struct {
	D, Heads, Tokens int
	HeadLo, HeadHi   int // this rank's heads

	InW, InB, DInW, DInB []float32 // in-projection rows of this rank's heads: (3K, D), (3K)
	OutW, DOutW          []float32 // out_proj.weight's columns of this rank's heads: (D, K)
	OutB, DOutB          []float32 // out_proj.bias (D), whole on every rank

	g             Group
	params, grads []float32
	in            *models.Linear // views InW, InB, DInW, DInB
	out           rowParallel    // views OutW, OutB, DOutW, DOutB
	batch         int
	qkv           []float32 // borrowed: in's output of the last Forward (batch·Tokens, 3K)
	probs         []float32 // owned: attention weights (batch, local heads, Tokens, Tokens)
	o             []float32 // owned: this rank's heads' outputs (batch·Tokens, K)
	dqkv          []float32 // owned
	dp            []float32 // owned scratch (Tokens)
}

// NewAttention returns rank g.Rank()'s shard of a self-attention block
// over (batch, tokens, d) inputs with heads heads, and zero parameters
// (set them with SetFromFull). Every rank of g must call it with the same
// sizes: one all-reduce checks so, and a rank that disagrees, or a group
// of another size, is an error on every rank.
func NewAttention(ctx context.Context, g Group, d, heads, tokens int) (*Attention, error) {
	if err := checkAttention(g, d, heads, tokens); err != nil {
		return nil, err
	}
	if err := agree(ctx, g, "attention", []string{"D", "Heads", "Tokens"}, d, heads, tokens); err != nil {
		return nil, err
	}
	n := attentionLen(g.Size(), g.Rank(), d, heads)
	return newAttention(g, g.Rank(), d, heads, tokens, make([]float32, n), make([]float32, n)), nil
}

// checkAttention refuses sizes that cannot be split over g, before any
// communication.
func checkAttention(g Group, d, heads, tokens int) error {
	if d < 1 || heads < 1 || tokens < 1 || d > maxExact || tokens > maxExact || d%heads != 0 {
		return fmt.Errorf("tensorpar: attention sizes D %d, Heads %d, Tokens %d: want D and Tokens in [1, 2²⁴] and D a multiple of Heads", d, heads, tokens)
	}
	if l := g.Size(); l < 1 || l > heads {
		return fmt.Errorf("tensorpar: cannot split %d attention heads over %d tensor-parallel ranks (want 1 ≤ T ≤ Heads)", heads, l)
	}
	return nil
}

// attentionLen is the length of rank r of l's flat parameter buffer.
func attentionLen(l, r, d, heads int) int {
	lo, hi := Span(heads, l, r)
	k := (hi - lo) * (d / heads)
	return 3*k*d + 3*k + d*k + d
}

// newAttention binds rank r's shard to params and grads (attentionLen
// values each); the sizes are checked. r is g.Rank() but for
// GatherParams's views of the other ranks' shards.
func newAttention(g Group, r, d, heads, tokens int, params, grads []float32) *Attention {
	lo, hi := Span(heads, g.Size(), r)
	k := (hi - lo) * (d / heads)
	a := &Attention{D: d, Heads: heads, Tokens: tokens, HeadLo: lo, HeadHi: hi, g: g, params: params, grads: grads}
	n1 := 3*k*d + 3*k
	views := func(b []float32) (inW, inB, outW, outB []float32) {
		return b[:3*k*d], b[3*k*d : n1], b[n1 : n1+d*k], b[n1+d*k:]
	}
	a.InW, a.InB, a.OutW, a.OutB = views(params)
	a.DInW, a.DInB, a.DOutW, a.DOutB = views(grads)
	a.in = models.NewLinear(d, 3*k)
	a.in.W, a.in.B, a.in.DW, a.in.DB = a.InW, a.InB, a.DInW, a.DInB
	a.out = rowParallel{K: k, Out: d, W: a.OutW, DW: a.DOutW, B: a.OutB, DB: a.DOutB}
	return a
}

// k is this rank's width: its heads' share of D.
func (a *Attention) k() int { return (a.HeadHi - a.HeadLo) * (a.D / a.Heads) }

// Params is this rank's flat parameter buffer (the fields' backing).
func (a *Attention) Params() []float32 { return a.params }

// Grads is this rank's flat gradient buffer, laid out as Params.
func (a *Attention) Grads() []float32 { return a.grads }

// SetFromFull copies this rank's shard out of a whole block's weights.
func (a *Attention) SetFromFull(full AttentionWeights) error {
	if err := full.check(a.D); err != nil {
		return err
	}
	a.shard(full, AttentionWeights{a.InW, a.InB, a.OutW, a.OutB}, false)
	return nil
}

// CopyParamsTo writes this rank's shard into its place in whole-block
// tensors (out_proj.bias whole), leaving the other ranks' places alone:
// every rank's call together unshard the block.
func (a *Attention) CopyParamsTo(dst AttentionWeights) error {
	if err := dst.check(a.D); err != nil {
		return err
	}
	a.shard(dst, AttentionWeights{a.InW, a.InB, a.OutW, a.OutB}, true)
	return nil
}

// CopyGradsTo is CopyParamsTo for the gradients.
func (a *Attention) CopyGradsTo(dst AttentionWeights) error {
	if err := dst.check(a.D); err != nil {
		return err
	}
	a.shard(dst, AttentionWeights{a.DInW, a.DInB, a.DOutW, a.DOutB}, true)
	return nil
}

// shard copies between whole-block tensors full and this rank's shard
// local: into local (scatter), or into full when gather. Head h's rows of
// block j (q, k, v) are j·D + h·D/Heads … in in_proj; its columns of
// out_proj.weight are h·D/Heads ….
func (a *Attention) shard(full, local AttentionWeights, gather bool) {
	d, k := a.D, a.k()
	c := a.HeadLo * (d / a.Heads) // this rank's first row (column) in each block
	cp := func(f, l []float32) {
		if gather {
			copy(f, l)
		} else {
			copy(l, f)
		}
	}
	for j := range 3 {
		cp(full.InW[(j*d+c)*d:(j*d+c+k)*d], local.InW[j*k*d:(j+1)*k*d])
		cp(full.InB[j*d+c:j*d+c+k], local.InB[j*k:(j+1)*k])
	}
	for o := range d {
		cp(full.OutW[o*d+c:o*d+c+k], local.OutW[o*k:(o+1)*k])
	}
	cp(full.OutB, local.OutB)
}

// Forward returns the block's output y (batch, Tokens, D) for x (batch,
// Tokens, D), the same on every rank; x is borrowed until Backward and y
// is owned, valid until the next Forward. All ranks must pass the same
// batch (a rank that does not makes the all-reduce fail on the ranks it
// meets).
func (a *Attention) Forward(ctx context.Context, x []float32, batch int) ([]float32, error) {
	a.batch = 0
	d, t := a.D, a.Tokens
	if batch < 1 || len(x) != batch*t*d {
		return nil, fmt.Errorf("tensorpar: Attention.Forward: len(x) = %d, want batch %d × %d tokens × D %d", len(x), batch, t, d)
	}
	// f: identity. The in-projection of this rank's heads and their
	// attention are local.
	a.qkv = a.in.Forward(x, batch*t, true)
	a.attend(batch)
	// out_proj's shard, then g: the partial outputs all-reduced.
	y, err := a.out.forward(ctx, a.g, a.o, batch*t)
	if err != nil {
		return nil, fmt.Errorf("tensorpar: Attention.Forward: %w", err)
	}
	a.batch = batch
	return y, nil
}

// attend computes softmax(q_h·k_hᵀ/√(D/Heads))·v_h for this rank's heads
// into a.o, with models.SelfAttention's arithmetic (the same loops over a
// row stride of 3K instead of 3D).
func (a *Attention) attend(batch int) {
	t, nh, dh, k := a.Tokens, a.HeadHi-a.HeadLo, a.D/a.Heads, a.k()
	s3 := 3 * k
	scale := float32(1 / math.Sqrt(float64(dh)))
	a.probs = grow(a.probs, batch*nh*t*t)
	a.o = grow(a.o, batch*t*k)
	for n := range batch {
		qkv := a.qkv[n*t*s3 : (n+1)*t*s3]
		for hd := range nh {
			p := a.probs[(n*nh+hd)*t*t : (n*nh+hd+1)*t*t]
			for i := range t {
				q := qkv[i*s3+hd*dh : i*s3+hd*dh+dh]
				row := p[i*t : (i+1)*t]
				m := float32(math.Inf(-1))
				for j := range t {
					kj := qkv[j*s3+k+hd*dh : j*s3+k+hd*dh+dh]
					row[j] = dot(q, kj) * scale
					m = max(m, row[j])
				}
				var s float32
				for j, v := range row {
					e := float32(math.Exp(float64(v - m)))
					row[j] = e
					s += e
				}
				inv := 1 / s
				o := a.o[(n*t+i)*k+hd*dh : (n*t+i)*k+hd*dh+dh]
				clear(o)
				for j := range row {
					row[j] *= inv
					v := qkv[j*s3+2*k+hd*dh : j*s3+2*k+hd*dh+dh]
					axpy(o, row[j], v)
				}
			}
		}
	}
}

// errNoAttentionForward is Backward's error without a successful Forward.
var errNoAttentionForward = errors.New("tensorpar: Attention.Backward without a successful Forward")

// Backward adds this rank's parameter gradients for dy (batch, Tokens,
// D), the same on every rank, and returns dx (batch, Tokens, D) summed
// over the group: the same on every rank, owned and valid until the next
// Backward.
func (a *Attention) Backward(ctx context.Context, dy []float32) ([]float32, error) {
	if a.batch == 0 {
		return nil, errNoAttentionForward
	}
	d, t, nh, dh, k := a.D, a.Tokens, a.HeadHi-a.HeadLo, a.D/a.Heads, a.k()
	if len(dy) != a.batch*t*d {
		return nil, fmt.Errorf("tensorpar: Attention.Backward: len(dy) = %d, want batch %d × %d tokens × D %d", len(dy), a.batch, t, d)
	}
	// g: identity. out_proj's bias (whole here) and shard.
	do := a.out.backward(dy)
	s3 := 3 * k
	scale := float32(1 / math.Sqrt(float64(dh)))
	a.dqkv = grow(a.dqkv, len(a.qkv))
	clear(a.dqkv)
	a.dp = grow(a.dp, t)
	for n := range a.batch {
		qkv := a.qkv[n*t*s3 : (n+1)*t*s3]
		dqkv := a.dqkv[n*t*s3 : (n+1)*t*s3]
		for hd := range nh {
			p := a.probs[(n*nh+hd)*t*t : (n*nh+hd+1)*t*t]
			for i := range t {
				doi := do[(n*t+i)*k+hd*dh : (n*t+i)*k+hd*dh+dh]
				row := p[i*t : (i+1)*t]
				// dP[i,j] = dO_i·V_j; dV_j += P[i,j]·dO_i
				var s float32
				for j, pij := range row {
					v := qkv[j*s3+2*k+hd*dh : j*s3+2*k+hd*dh+dh]
					a.dp[j] = dot(doi, v)
					s += pij * a.dp[j]
					axpy(dqkv[j*s3+2*k+hd*dh:j*s3+2*k+hd*dh+dh], pij, doi)
				}
				// dS = P ⊙ (dP − Σ P·dP); dQ_i += scale·Σ_j dS_ij K_j; dK_j += scale·dS_ij Q_i
				q := qkv[i*s3+hd*dh : i*s3+hd*dh+dh]
				dq := dqkv[i*s3+hd*dh : i*s3+hd*dh+dh]
				for j, pij := range row {
					ds := pij * (a.dp[j] - s) * scale
					axpy(dq, ds, qkv[j*s3+k+hd*dh:j*s3+k+hd*dh+dh])
					axpy(dqkv[j*s3+k+hd*dh:j*s3+k+hd*dh+dh], ds, q)
				}
			}
		}
	}
	dx := a.in.Backward(a.dqkv)
	// f: all-reduce the input gradient's partials.
	if err := a.g.AllReduce(ctx, dx, Sum); err != nil {
		return nil, fmt.Errorf("tensorpar: Attention.Backward: %w", err)
	}
	return dx, nil
}

// dot returns Σ a[i]·b[i] over len(a) (b at least as long), in index
// order as models' attention does.
func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s float32
	for i, v := range a {
		s += v * b[i]
	}
	return s
}

// axpy sets y += alpha·x over len(y) (x at least as long).
func axpy(y []float32, alpha float32, x []float32) {
	x = x[:len(y)]
	for i, v := range x {
		y[i] += alpha * v
	}
}
