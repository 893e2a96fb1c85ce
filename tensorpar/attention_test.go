package tensorpar_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/models/modeltest"
	"github.com/gradsync/gradsync/tensorpar"
)

// refAttention is models' unsharded attention bound to w (and fresh
// gradient buffers).
func refAttention(w tensorpar.AttentionWeights, d, heads, tokens int) *models.SelfAttention {
	a := models.NewSelfAttention(d, heads, tokens)
	a.In.W, a.In.B, a.Out.W, a.Out.B = w.InW, w.InB, w.OutW, w.OutB
	a.In.DW, a.In.DB = make([]float32, len(w.InW)), make([]float32, len(w.InB))
	a.Out.DW, a.Out.DB = make([]float32, len(w.OutW)), make([]float32, len(w.OutB))
	return a
}

func zeroAttention(d int) tensorpar.AttentionWeights {
	return tensorpar.AttentionWeights{InW: make([]float32, 3*d*d), InB: make([]float32, 3*d),
		OutW: make([]float32, d*d), OutB: make([]float32, d)}
}

// randAttention draws weights with PyTorch-like scales (1/√D).
func randAttention(rng *rand.Rand, d int) tensorpar.AttentionWeights {
	s := 1 / math.Sqrt(float64(d))
	return tensorpar.AttentionWeights{InW: randn(rng, 3*d*d, s), InB: randn(rng, 3*d, 0.3),
		OutW: randn(rng, d*d, s), OutB: randn(rng, d, 0.3)}
}

// newAttentions builds every rank's shard of w over gs.
func newAttentions(t testing.TB, gs []*tensorpar.Counting, w tensorpar.AttentionWeights, d, heads, tokens int) []*tensorpar.Attention {
	t.Helper()
	return shards(t, gs, 6, func(ctx context.Context, g tensorpar.Group) (*tensorpar.Attention, error) {
		a, err := tensorpar.NewAttention(ctx, g, d, heads, tokens)
		if err != nil {
			return nil, err
		}
		return a, a.SetFromFull(w)
	})
}

// comparer checks sharded results against unsharded ones: bit for bit
// when exact (one rank), otherwise relative to the tensor's scale: every
// entry within tol·max_i |want_i| (float32 sums in another order differ
// by a few ulps of their largest terms, which is large relative to an
// entry that cancels to near zero). It keeps the largest differences for
// the log: relative to the scale, and entry by entry where |want| ≥ 1e-3.
type comparer struct {
	t        *testing.T
	exact    bool
	worstAbs float64
	worst    map[float64][2]float64 // by tolerance: largest {scale-relative, entry-relative} difference
}

func newComparer(t *testing.T, exact bool) *comparer {
	return &comparer{t: t, exact: exact, worst: map[float64][2]float64{}}
}

func (c *comparer) check(name string, got, want []float32, tol float64) {
	c.t.Helper()
	if len(got) != len(want) {
		c.t.Errorf("%s: %d values, want %d", name, len(got), len(want))
		return
	}
	if c.exact {
		if !slicesBitEqual(got, want) {
			c.t.Errorf("%s: not bit-identical to the unsharded layer with one rank", name)
		}
		return
	}
	var scale float64
	for _, v := range want {
		scale = math.Max(scale, math.Abs(float64(v)))
	}
	w := c.worst[tol]
	for i := range want {
		a, b := float64(got[i]), float64(want[i])
		d := math.Abs(a - b)
		c.worstAbs = math.Max(c.worstAbs, d)
		if scale > 0 {
			w[0] = math.Max(w[0], d/scale)
		}
		if math.Abs(b) >= 1e-3 {
			w[1] = math.Max(w[1], relErr(a, b))
		}
		if d > tol*scale && d > 1e-7 {
			c.t.Errorf("%s[%d] = %g, want %g (largest |want| %g)", name, i, a, b, scale)
			break
		}
	}
	c.worst[tol] = w
}

func (c *comparer) String() string {
	return fmt.Sprintf("largest difference %.3g absolute; relative to the largest entry %.3g output, %.3g gradients; entry-relative (where |want| ≥ 1e-3) %.3g output, %.3g gradients",
		c.worstAbs, c.worst[1e-5][0], c.worst[1e-4][0], c.worst[1e-5][1], c.worst[1e-4][1])
}

type attnCase struct{ d, heads, tokens, batch int }

// TestAttentionMatchesUnsharded checks the output, the input gradient and
// every parameter gradient of the head-sharded attention against models'
// SelfAttention for T = 1..4 (head counts T does not divide among them):
// bit for bit at T = 1, and otherwise within 1e-5 (output) and 1e-4
// (gradients) relative to each tensor's largest entry; and the
// communication of a step against its formula, b·s·D values each way.
func TestAttentionMatchesUnsharded(t *testing.T) {
	// the last is vit-tiny's (D 64, 4 heads, 17 tokens for 28×28 images).
	cases := []attnCase{{8, 4, 3, 2}, {10, 5, 4, 2}, {12, 6, 5, 1}, {64, 4, 17, 2}}
	for ci, c := range cases {
		for l := 1; l <= min(4, c.heads); l++ {
			name := fmt.Sprintf("d%d_heads%d_tokens%d_b%d_T%d", c.d, c.heads, c.tokens, c.batch, l)
			t.Run(name, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(ci), uint64(l)))
				w := randAttention(rng, c.d)
				n := c.batch * c.tokens * c.d
				x, dy := randn(rng, n, 1), randn(rng, n, 1)
				ref := refAttention(w, c.d, c.heads, c.tokens)
				wantY := append([]float32(nil), ref.Forward(x, c.batch, true)...)
				wantDx := ref.Backward(dy)
				want := tensorpar.AttentionWeights{InW: ref.In.DW, InB: ref.In.DB, OutW: ref.Out.DW, OutB: ref.Out.DB}

				gs := groups(t, l)
				as := newAttentions(t, gs, w, c.d, c.heads, c.tokens)
				ys, dxs := make([][]float32, l), make([][]float32, l)
				err := each(l, func(ctx context.Context, r int) error {
					a := as[r]
					if nh := a.HeadHi - a.HeadLo; math.Abs(float64(nh)-float64(c.heads)/float64(l)) >= 1 {
						t.Errorf("rank %d holds %d heads of %d/%d", r, nh, c.heads, l)
					}
					y, err := a.Forward(ctx, x, c.batch)
					if err != nil {
						return err
					}
					ys[r] = append([]float32(nil), y...)
					fwd := tensorpar.Counts{AllReduceOps: 1, AllReduceValues: int64(n)}
					if got := gs[r].Counts(); got != fwd {
						t.Errorf("rank %d: Forward counts %+v, want %+v", r, got, fwd)
					}
					dx, err := a.Backward(ctx, dy)
					if err != nil {
						return err
					}
					dxs[r] = dx
					step := tensorpar.Counts{AllReduceOps: 2, AllReduceValues: 2 * int64(n)}
					if got := gs[r].Counts(); got != step {
						t.Errorf("rank %d: Forward+Backward counts %+v, want %+v", r, got, step)
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				got, back := zeroAttention(c.d), zeroAttention(c.d)
				for r, a := range as {
					if err := a.CopyGradsTo(got); err != nil {
						t.Fatal(err)
					}
					if err := a.CopyParamsTo(back); err != nil {
						t.Fatal(err)
					}
					if !slicesBitEqual(a.DOutB, as[0].DOutB) {
						t.Errorf("rank %d: out_proj.bias gradient differs from rank 0's", r)
					}
					if !slicesBitEqual(ys[r], ys[0]) || !slicesBitEqual(dxs[r], dxs[0]) {
						t.Errorf("rank %d: output or input gradient differs from rank 0's", r)
					}
				}
				for _, p := range [][2][]float32{{back.InW, w.InW}, {back.InB, w.InB}, {back.OutW, w.OutW}, {back.OutB, w.OutB}} {
					if !slicesBitEqual(p[0], p[1]) {
						t.Errorf("the unsharded parameters differ from the originals")
					}
				}
				cmp := newComparer(t, l == 1)
				cmp.check("y", ys[0], wantY, 1e-5)
				cmp.check("dx", dxs[0], wantDx, 1e-4)
				cmp.check("d in_proj_weight", got.InW, want.InW, 1e-4)
				cmp.check("d in_proj_bias", got.InB, want.InB, 1e-4)
				cmp.check("d out_proj.weight", got.OutW, want.OutW, 1e-4)
				cmp.check("d out_proj.bias", got.OutB, want.OutB, 1e-4)
				t.Logf("comm per step %+v; %v", gs[0].Counts(), cmp)
			})
		}
	}
}

// TestAttentionGradFiniteDifference checks the sharded attention's
// gradients with respect to the input and every rank's parameters by
// central differences of Σ y·r (r fixed, so dy = r), with 5 heads over 3
// ranks (shards of 1, 2 and 2 heads).
func TestAttentionGradFiniteDifference(t *testing.T) {
	const d, heads, tokens, batch, l = 10, 5, 3, 2, 3
	rng := rand.New(rand.NewPCG(7, 8))
	w := randAttention(rng, d)
	x := randn(rng, batch*tokens*d, 1)
	proj := randn(rng, batch*tokens*d, 1)
	gs := groups(t, l)
	as := newAttentions(t, gs, w, d, heads, tokens)
	var dx []float32
	step := objective(t, as, x, proj, batch, &dx, nil)
	step(true)
	f := func() float64 { return step(false) }
	cfg := modeltest.Config{MaxChecks: -1}
	modeltest.CheckGrad(t, "dx", f, x, dx, cfg)
	grads := make([][]float32, l)
	for r, a := range as {
		grads[r] = append([]float32(nil), a.Grads()...)
	}
	for r, a := range as {
		// out_proj.bias last: every rank adds its own replica, and the
		// objective reads rank 0's y, so only rank 0's is checked.
		n := len(a.Params())
		if r != 0 {
			n -= d
		}
		modeltest.CheckGrad(t, fmt.Sprintf("rank %d params", r), f, a.Params()[:n], grads[r][:n], cfg)
	}
}

// TestAttentionRefused: head counts that cannot be split, ranks that
// disagree, bad lengths and a Backward without Forward are errors, never
// a panic or a hang.
func TestAttentionRefused(t *testing.T) {
	ctx := context.Background()
	gs := groups(t, 3)
	for r := range 3 {
		_, err := tensorpar.NewAttention(ctx, gs[r], 8, 2, 3)
		mustErr(t, "T > Heads", err, "cannot split 2 attention heads over 3")
		if c := gs[r].Counts(); c != (tensorpar.Counts{}) {
			t.Errorf("T > Heads communicated: %+v", c)
		}
	}
	_, err := tensorpar.NewAttention(ctx, gs[0], 10, 4, 3)
	mustErr(t, "D not a multiple of Heads", err, "D a multiple of Heads")

	gs = groups(t, 2)
	errs := make([]error, 2)
	if err := each(2, func(ctx context.Context, r int) error {
		_, errs[r] = tensorpar.NewAttention(ctx, gs[r], 8, 4, 3+r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for r, err := range errs {
		mustErr(t, fmt.Sprintf("rank %d of mismatched Tokens", r), err, "ranks disagree")
		gs[r].Reset()
	}

	as := newAttentions(t, groups(t, 2), zeroAttention(8), 8, 4, 3)
	a := as[0]
	_, err = a.Backward(ctx, make([]float32, 24))
	mustErr(t, "Backward before Forward", err, "without a successful Forward")
	_, err = a.Forward(ctx, make([]float32, 25), 1)
	mustErr(t, "bad len(x)", err, "want batch 1 × 3 tokens × D 8")
	bad := zeroAttention(8)
	bad.InW = bad.InW[1:]
	mustErr(t, "SetFromFull", a.SetFromFull(bad), "want 192, 24, 64, 8")
	mustErr(t, "CopyGradsTo", a.CopyGradsTo(bad), "want 192, 24, 64, 8")
	mustErr(t, "CopyParamsTo", a.CopyParamsTo(tensorpar.AttentionWeights{}), "want 192, 24, 64, 8")
}
