package tensorpar_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/models/modeltest"
	"github.com/gradsync/gradsync/tensorpar"
)

// refBlock is vit-tiny's block from models' layers, as
// models' transformerBlocks builds it.
type refBlock struct {
	n1, n2     *models.LayerNorm
	at         *models.SelfAttention
	fc1, fc2   *models.Linear
	res1, res2 *models.Residual
}

func newRefBlock(w tensorpar.BlockWeights, d, heads, tokens, hidden int) *refBlock {
	norm := func(wt, b []float32) *models.LayerNorm {
		l := models.NewLayerNorm(d)
		l.Weight, l.Bias, l.DWeight, l.DBias = wt, b, make([]float32, d), make([]float32, d)
		return l
	}
	m := newRefMLP(w.MLP, d, hidden, d)
	r := &refBlock{n1: norm(w.Norm1W, w.Norm1B), n2: norm(w.Norm2W, w.Norm2B),
		at: refAttention(w.Attn, d, heads, tokens), fc1: m.fc1, fc2: m.fc2}
	r.res1 = &models.Residual{Body: []models.Layer{r.n1, r.at}}
	r.res2 = &models.Residual{Body: []models.Layer{r.n2, &models.Tokenwise{Layer: r.fc1, Tokens: tokens}, &models.GELU{},
		&models.Tokenwise{Layer: r.fc2, Tokens: tokens}}}
	return r
}

func (r *refBlock) grads() tensorpar.BlockWeights {
	return tensorpar.BlockWeights{Norm1W: r.n1.DWeight, Norm1B: r.n1.DBias, Norm2W: r.n2.DWeight, Norm2B: r.n2.DBias,
		Attn: tensorpar.AttentionWeights{InW: r.at.In.DW, InB: r.at.In.DB, OutW: r.at.Out.DW, OutB: r.at.Out.DB},
		MLP:  tensorpar.MLPWeights{W1: r.fc1.DW, B1: r.fc1.DB, W2: r.fc2.DW, B2: r.fc2.DB}}
}

func randBlock(rng *rand.Rand, d, hidden int) tensorpar.BlockWeights {
	return tensorpar.BlockWeights{
		Norm1W: randn(rng, d, 0.5), Norm1B: randn(rng, d, 0.2), Norm2W: randn(rng, d, 0.5), Norm2B: randn(rng, d, 0.2),
		Attn: randAttention(rng, d), MLP: randWeights(rng, d, hidden, d)}
}

func zeroBlock(d, hidden int) tensorpar.BlockWeights {
	return tensorpar.BlockWeights{Norm1W: make([]float32, d), Norm1B: make([]float32, d),
		Norm2W: make([]float32, d), Norm2B: make([]float32, d), Attn: zeroAttention(d), MLP: zeroWeights(d, hidden, d)}
}

type blockCase struct{ d, heads, tokens, hidden, batch int }

func newBlocks(t testing.TB, gs []*tensorpar.Counting, w tensorpar.BlockWeights, c blockCase) []*tensorpar.Block {
	t.Helper()
	return shards(t, gs, 8, func(ctx context.Context, g tensorpar.Group) (*tensorpar.Block, error) {
		b, err := tensorpar.NewBlock(ctx, g, c.d, c.heads, c.tokens, c.hidden)
		if err != nil {
			return nil, err
		}
		return b, b.SetFromFull(w)
	})
}

// TestBlockMatchesUnsharded checks the tensor-parallel transformer block
// against vit-tiny's block built from models' layers (Residual of
// LayerNorm and SelfAttention, Residual of LayerNorm and Linear, GELU,
// Linear), for T = 1..4: bit for bit at T = 1, otherwise within 1e-5
// (output) and 1e-4 (gradients) of each tensor's largest entry; and its
// communication exactly: 2 all-reduces of b·s·D values forward, 2 more
// backward, nothing else.
func TestBlockMatchesUnsharded(t *testing.T) {
	// the last is vit-tiny's block (D 64, 4 heads, 17 tokens, MLP 128).
	cases := []blockCase{{8, 4, 3, 10, 2}, {10, 5, 4, 7, 2}, {64, 4, 17, 128, 2}}
	for ci, c := range cases {
		for l := 1; l <= 4; l++ {
			t.Run(fmt.Sprintf("d%d_heads%d_tokens%d_hidden%d_b%d_T%d", c.d, c.heads, c.tokens, c.hidden, c.batch, l), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(ci)+10, uint64(l)))
				w := randBlock(rng, c.d, c.hidden)
				bsd := c.batch * c.tokens * c.d
				x, dy := randn(rng, bsd, 1), randn(rng, bsd, 1)
				ref := newRefBlock(w, c.d, c.heads, c.tokens, c.hidden)
				wantY := append([]float32(nil), ref.res2.Forward(ref.res1.Forward(x, c.batch, true), c.batch, true)...)
				wantDx := ref.res1.Backward(ref.res2.Backward(dy))
				want := ref.grads()

				gs := groups(t, l)
				bs := newBlocks(t, gs, w, c)
				ys, dxs := make([][]float32, l), make([][]float32, l)
				err := each(l, func(ctx context.Context, r int) error {
					y, err := bs[r].Forward(ctx, x, c.batch)
					if err != nil {
						return err
					}
					ys[r] = append([]float32(nil), y...)
					fwd := tensorpar.Counts{AllReduceOps: 2, AllReduceValues: 2 * int64(bsd)}
					if got := gs[r].Counts(); got != fwd {
						t.Errorf("rank %d: Forward counts %+v, want %+v (2 all-reduces of b·s·D = %d)", r, got, fwd, bsd)
					}
					dx, err := bs[r].Backward(ctx, dy)
					if err != nil {
						return err
					}
					dxs[r] = dx
					step := tensorpar.Counts{AllReduceOps: 4, AllReduceValues: 4 * int64(bsd)}
					if got := gs[r].Counts(); got != step {
						t.Errorf("rank %d: Forward+Backward counts %+v, want %+v", r, got, step)
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				got, back := zeroBlock(c.d, c.hidden), zeroBlock(c.d, c.hidden)
				for r, b := range bs {
					if err := b.CopyGradsTo(got); err != nil {
						t.Fatal(err)
					}
					if err := b.CopyParamsTo(back); err != nil {
						t.Fatal(err)
					}
					if !slicesBitEqual(ys[r], ys[0]) || !slicesBitEqual(dxs[r], dxs[0]) {
						t.Errorf("rank %d: output or input gradient differs from rank 0's", r)
					}
					// the replicated parameters' gradients agree bit for bit.
					for _, p := range [][2][]float32{{b.Norm1.DWeight, bs[0].Norm1.DWeight}, {b.Norm2.DBias, bs[0].Norm2.DBias},
						{b.Attn.DOutB, bs[0].Attn.DOutB}, {b.MLP.DB2, bs[0].MLP.DB2}} {
						if !slicesBitEqual(p[0], p[1]) {
							t.Errorf("rank %d: a replicated parameter's gradient differs from rank 0's", r)
						}
					}
				}
				cmpW := newComparer(t, true)
				for _, p := range flatBlock(back, w) {
					cmpW.check("unsharded "+p.name, p.got, p.want, 0)
				}
				cmp := newComparer(t, l == 1)
				cmp.check("y", ys[0], wantY, 1e-5)
				cmp.check("dx", dxs[0], wantDx, 1e-4)
				for _, p := range flatBlock(got, want) {
					cmp.check("d "+p.name, p.got, p.want, 1e-4)
				}
				t.Logf("comm per step %+v (b·s·D = %d); %v", gs[0].Counts(), bsd, cmp)
			})
		}
	}
}

type namedPair struct {
	name      string
	got, want []float32
}

// flatBlock pairs the tensors of two blocks' weights by PyTorch name.
func flatBlock(got, want tensorpar.BlockWeights) []namedPair {
	return []namedPair{
		{"norm1.weight", got.Norm1W, want.Norm1W}, {"norm1.bias", got.Norm1B, want.Norm1B},
		{"attn.in_proj_weight", got.Attn.InW, want.Attn.InW}, {"attn.in_proj_bias", got.Attn.InB, want.Attn.InB},
		{"attn.out_proj.weight", got.Attn.OutW, want.Attn.OutW}, {"attn.out_proj.bias", got.Attn.OutB, want.Attn.OutB},
		{"norm2.weight", got.Norm2W, want.Norm2W}, {"norm2.bias", got.Norm2B, want.Norm2B},
		{"mlp.fc1.weight", got.MLP.W1, want.MLP.W1}, {"mlp.fc1.bias", got.MLP.B1, want.MLP.B1},
		{"mlp.fc2.weight", got.MLP.W2, want.MLP.W2}, {"mlp.fc2.bias", got.MLP.B2, want.MLP.B2},
	}
}

// TestBlockGradFiniteDifference checks the block's gradients with
// respect to the input and every rank's parameters by central
// differences of Σ y·r, with 3 heads and 5 hidden units over 2 ranks
// (uneven shards of both).
func TestBlockGradFiniteDifference(t *testing.T) {
	c := blockCase{d: 6, heads: 3, tokens: 3, hidden: 5, batch: 2}
	const l = 2
	rng := rand.New(rand.NewPCG(11, 12))
	w := randBlock(rng, c.d, c.hidden)
	x := randn(rng, c.batch*c.tokens*c.d, 1)
	proj := randn(rng, len(x), 1)
	gs := groups(t, l)
	bs := newBlocks(t, gs, w, c)
	var dx []float32
	// The replicated tensors are one parameter: a perturbation of rank
	// 0's is made on every rank.
	sync := func() {
		for _, b := range bs[1:] {
			for _, p := range [][2][]float32{{b.Norm1.Weight, bs[0].Norm1.Weight}, {b.Norm1.Bias, bs[0].Norm1.Bias},
				{b.Norm2.Weight, bs[0].Norm2.Weight}, {b.Norm2.Bias, bs[0].Norm2.Bias}, {b.Attn.OutB, bs[0].Attn.OutB}, {b.MLP.B2, bs[0].MLP.B2}} {
				copy(p[0], p[1])
			}
		}
	}
	step := objective(t, bs, x, proj, c.batch, &dx, sync)
	step(true)
	f := func() float64 { return step(false) }
	cfg := modeltest.Config{MaxChecks: -1}
	modeltest.CheckGrad(t, "dx", f, x, dx, cfg)
	// Rank 0's whole buffer (its replicated tensors perturbed on every
	// rank); on rank 1 only its sharded tensors. Rank 1's replicated
	// gradients equal rank 0's (checked in TestBlockMatchesUnsharded).
	b0, b1 := bs[0], bs[1]
	g0 := append([]float32(nil), b0.Grads()...)
	modeltest.CheckGrad(t, "rank 0 params", f, b0.Params(), g0, cfg)
	a, m := b1.Attn, b1.MLP
	for _, p := range []struct {
		name string
		w, g []float32
	}{{"rank 1 in_proj", a.InW, a.DInW}, {"rank 1 in_proj_bias", a.InB, a.DInB}, {"rank 1 out_proj.weight", a.OutW, a.DOutW},
		{"rank 1 fc1.weight", m.W1, m.DW1}, {"rank 1 fc1.bias", m.B1, m.DB1}, {"rank 1 fc2.weight", m.W2, m.DW2}} {
		modeltest.CheckGrad(t, p.name, f, p.w, append([]float32(nil), p.g...), cfg)
	}
}

// TestBlockRefused: sizes that cannot be split and bad lengths are errors.
func TestBlockRefused(t *testing.T) {
	ctx := context.Background()
	gs := groups(t, 3)
	if _, err := tensorpar.NewBlock(ctx, gs[0], 8, 2, 3, 16); err == nil || !strings.Contains(err.Error(), "cannot split 2 attention heads over 3") {
		t.Errorf("T > Heads: %v", err)
	}
	if _, err := tensorpar.NewBlock(ctx, gs[0], 6, 3, 3, 2); err == nil || !strings.Contains(err.Error(), "cannot split 2 hidden units over 3") {
		t.Errorf("T > Hidden: %v", err)
	}
	bs := newBlocks(t, groups(t, 1), zeroBlock(4, 4), blockCase{d: 4, heads: 2, tokens: 2, hidden: 4})
	if _, err := bs[0].Backward(ctx, make([]float32, 8)); err == nil || !strings.Contains(err.Error(), "without a successful Forward") {
		t.Errorf("Backward first: %v", err)
	}
	if _, err := bs[0].Forward(ctx, make([]float32, 9), 1); err == nil || !strings.Contains(err.Error(), "want batch 1 × 2 tokens × D 4") {
		t.Errorf("bad len(x): %v", err)
	}
	bad := zeroBlock(4, 4)
	bad.Norm2B = nil
	if err := bs[0].SetFromFull(bad); err == nil || !strings.Contains(err.Error(), "want D 4") {
		t.Errorf("SetFromFull: %v", err)
	}
}

// BenchmarkBlock times one forward and backward step of vit-tiny's block
// (batch 32, 17 tokens, D 64, 4 heads, MLP 128) on T in-process ranks.
func BenchmarkBlock(b *testing.B) {
	c := blockCase{d: 64, heads: 4, tokens: 17, hidden: 128, batch: 32}
	for _, l := range []int{1, 2} {
		b.Run(fmt.Sprintf("T=%d", l), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			w := randBlock(rng, c.d, c.hidden)
			x := randn(rng, c.batch*c.tokens*c.d, 1)
			dy := randn(rng, len(x), 1)
			gs := groups(b, l)
			bs := newBlocks(b, gs, w, c)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				err := each(l, func(ctx context.Context, r int) error {
					if _, err := bs[r].Forward(ctx, x, c.batch); err != nil {
						return err
					}
					_, err := bs[r].Backward(ctx, dy)
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(gs[0].Counts().AllReduceValues)/float64(b.N), "values-reduced/op")
		})
	}
}

// TestBlockWrongGroupRefused: a rank whose block's collectives after the
// handshake go to another tensor group makes the first all-reduce
// (attention's g) refuse the frames: ErrUnexpectedFrame, no output, no
// hang.
func TestBlockWrongGroupRefused(t *testing.T) {
	rings := aggregator.NewMemRing(2, 4)
	t.Cleanup(func() {
		for _, r := range rings {
			r.(*aggregator.MemRing).Close()
		}
	})
	mk := func(r aggregator.Ring, id uint32) tensorpar.Group {
		g, err := tensorpar.NewRingGroup(r, id, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	gs := []tensorpar.Group{mk(rings[0], 7), &switching{first: mk(rings[1], 7), then: mk(rings[1], 8)}}
	c := blockCase{d: 4, heads: 2, tokens: 2, hidden: 4, batch: 1}
	bs := make([]*tensorpar.Block, 2)
	if err := each(2, func(ctx context.Context, r int) error {
		var err error
		bs[r], err = tensorpar.NewBlock(ctx, gs[r], c.d, c.heads, c.tokens, c.hidden)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	x := make([]float32, c.tokens*c.d)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // bounds a hang only
	defer cancel()
	ys, errs := make([][]float32, 2), make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			ys[r], errs[r] = bs[r].Forward(ctx, x, 1)
			if errs[r] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	if !errors.Is(errs[0], aggregator.ErrUnexpectedFrame) && !errors.Is(errs[1], aggregator.ErrUnexpectedFrame) {
		t.Fatalf("errors %v, want an ErrUnexpectedFrame", errs)
	}
	for r := range 2 {
		if errs[r] == nil || ys[r] != nil {
			t.Errorf("rank %d: error %v, output %v: want an error and no output", r, errs[r], ys[r] != nil)
		}
	}
	if _, err := bs[0].Backward(ctx, x); err == nil {
		t.Error("Backward after a failed Forward")
	}
}
