package tensorpar_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/models/modeltest"
	"github.com/gradsync/gradsync/tensorpar"
)

// TestSpatialBatchNormMatchesUnsharded checks the strip-sharded batch
// norm against models.BatchNorm2d over the whole images, in training and
// in evaluation, for F = 1..4 strips of an odd height: outputs within
// 1e-5, input gradients and the summed dγ, dβ within 1e-4, the running
// statistics within 1e-5 and the same on every rank; and its
// communication exactly: 2 all-reduces of C values forward and 1 of 2C
// backward in training, none in evaluation.
func TestSpatialBatchNormMatchesUnsharded(t *testing.T) {
	const batch, c, h, w = 2, 3, 17, 5
	for _, train := range []bool{true, false} {
		for f := 1; f <= 4; f++ {
			t.Run(fmt.Sprintf("train%v_F%d", train, f), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(f), 31))
				gamma, beta := randn(rng, c, 0.5), randn(rng, c, 0.5)
				rmean, rvar := randn(rng, c, 0.2), []float32{0.5, 1.5, 2}
				x := randn(rng, batch*c*h*w, 2)
				for i := range x {
					x[i] += 0.7 // a mean far from 0
				}
				dy := randn(rng, len(x), 1)
				ref := models.NewBatchNorm2d(c)
				ref.Weight, ref.Bias, ref.DWeight, ref.DBias = gamma, beta, make([]float32, c), make([]float32, c)
				ref.RunningMean, ref.RunningVar = append([]float32(nil), rmean...), append([]float32(nil), rvar...)
				wantY := append([]float32(nil), ref.Forward(x, batch, train)...)
				wantDx := ref.Backward(dy)

				gs := groups(t, f)
				strips := tensorpar.EvenStrips(h, f)
				ls := shards(t, gs, 4, func(ctx context.Context, g tensorpar.Group) (*tensorpar.SpatialBatchNorm, error) {
					l, err := tensorpar.NewSpatialBatchNorm(ctx, g, c, h*w)
					if err != nil {
						return nil, err
					}
					copy(l.Weight, gamma)
					copy(l.Bias, beta)
					copy(l.RunningMean, rmean)
					copy(l.RunningVar, rvar)
					return l, nil
				})
				ys, dxs := make([][]float32, f), make([][]float32, f)
				err := each(f, func(ctx context.Context, r int) error {
					y, err := ls[r].Forward(ctx, stripRows(x, batch*c, h, w, strips[r], strips[r+1]), batch, train)
					if err != nil {
						return err
					}
					ys[r] = append([]float32(nil), y...)
					var fwd tensorpar.Counts
					if train {
						fwd = tensorpar.Counts{AllReduceOps: 2, AllReduceValues: 2 * c}
					}
					if got := gs[r].Counts(); got != fwd {
						t.Errorf("rank %d: Forward counts %+v, want %+v", r, got, fwd)
					}
					dxs[r], err = ls[r].Backward(ctx, stripRows(dy, batch*c, h, w, strips[r], strips[r+1]))
					if train {
						fwd = tensorpar.Counts{AllReduceOps: 3, AllReduceValues: 4 * c}
					}
					if got := gs[r].Counts(); got != fwd {
						t.Errorf("rank %d: Forward+Backward counts %+v, want %+v", r, got, fwd)
					}
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
				cmp := newComparer(t, false)
				dg, db := make([]float32, c), make([]float32, c)
				for r, l := range ls {
					cmp.check(fmt.Sprintf("rank %d y", r), ys[r], stripRows(wantY, batch*c, h, w, strips[r], strips[r+1]), 1e-5)
					cmp.check(fmt.Sprintf("rank %d dx", r), dxs[r], stripRows(wantDx, batch*c, h, w, strips[r], strips[r+1]), 1e-4)
					cmp.check(fmt.Sprintf("rank %d running mean", r), l.RunningMean, ref.RunningMean, 1e-5)
					cmp.check(fmt.Sprintf("rank %d running var", r), l.RunningVar, ref.RunningVar, 1e-5)
					if !slicesBitEqual(l.RunningMean, ls[0].RunningMean) || !slicesBitEqual(l.RunningVar, ls[0].RunningVar) {
						t.Errorf("rank %d: running statistics differ from rank 0's", r)
					}
					for i := range c {
						dg[i] += l.DWeight[i]
						db[i] += l.DBias[i]
					}
				}
				cmp.check("dγ summed", dg, ref.DWeight, 1e-4)
				cmp.check("dβ summed", db, ref.DBias, 1e-4)
				t.Logf("comm per step %+v; %v", gs[0].Counts(), cmp)
			})
		}
	}
}

// TestSpatialBatchNormGradFiniteDifference checks the training gradients
// (through the whole images' statistics) by central differences of
// Σ y·r over all ranks' rows, 3 uneven strips; γ and β, replicated, are
// perturbed on every rank, and their gradient is the ranks' shares
// summed.
func TestSpatialBatchNormGradFiniteDifference(t *testing.T) {
	const batch, c, h, w, f = 2, 2, 7, 3, 3
	rng := rand.New(rand.NewPCG(41, 42))
	x := randn(rng, batch*c*h*w, 1)
	proj := randn(rng, len(x), 1)
	params := append(randn(rng, c, 0.5), randn(rng, c, 0.5)...) // γ, β: the master copy
	strips := tensorpar.EvenStrips(h, f)
	ls := shards(t, groups(t, f), 4, func(ctx context.Context, g tensorpar.Group) (*tensorpar.SpatialBatchNorm, error) {
		return tensorpar.NewSpatialBatchNorm(ctx, g, c, h*w)
	})
	dx, dp := make([]float32, len(x)), make([]float32, len(params))
	step := func(backward bool) float64 {
		objs := make([]float64, f)
		err := each(f, func(ctx context.Context, r int) error {
			l := ls[r]
			copy(l.Params(), params)
			y, err := l.Forward(ctx, stripRows(x, batch*c, h, w, strips[r], strips[r+1]), batch, true)
			if err != nil {
				return err
			}
			pr := stripRows(proj, batch*c, h, w, strips[r], strips[r+1])
			for i, v := range y {
				objs[r] += float64(v) * float64(pr[i])
			}
			if !backward {
				return nil
			}
			clear(l.Grads())
			d, err := l.Backward(ctx, pr)
			if err != nil {
				return err
			}
			own := strips[r+1] - strips[r]
			for p := range batch * c {
				copy(dx[(p*h+strips[r])*w:(p*h+strips[r+1])*w], d[p*own*w:(p+1)*own*w])
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return objs[0] + objs[1] + objs[2]
	}
	step(true)
	for _, l := range ls {
		for i, v := range l.Grads() {
			dp[i] += v
		}
	}
	f64 := func() float64 { return step(false) }
	cfg := modeltest.Config{MaxChecks: -1}
	modeltest.CheckGrad(t, "dx", f64, x, dx, cfg)
	modeltest.CheckGrad(t, "γ, β", f64, params, dp, cfg)
}

// TestSpatialBatchNormRefused: bad sizes, ranks that disagree, bad
// lengths and a Backward without Forward are errors.
func TestSpatialBatchNormRefused(t *testing.T) {
	ctx := context.Background()
	gs := groups(t, 2)
	_, err := tensorpar.NewSpatialBatchNorm(ctx, gs[0], 0, 4)
	mustErr(t, "C 0", err, "want each in [1, 2²⁴]")
	errs := make([]error, 2)
	if err := each(2, func(ctx context.Context, r int) error {
		_, errs[r] = tensorpar.NewSpatialBatchNorm(ctx, gs[r], 3, 20+r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for r, err := range errs {
		mustErr(t, fmt.Sprintf("rank %d of mismatched H·W", r), err, "ranks disagree")
	}
	ls := shards(t, groups(t, 1), 4, func(ctx context.Context, g tensorpar.Group) (*tensorpar.SpatialBatchNorm, error) {
		return tensorpar.NewSpatialBatchNorm(ctx, g, 2, 6)
	})
	_, err = ls[0].Backward(ctx, make([]float32, 12))
	mustErr(t, "Backward first", err, "without a successful Forward")
	_, err = ls[0].Forward(ctx, make([]float32, 13), 1, true)
	mustErr(t, "bad len(x)", err, "is not batch 1 × C 2")
	_, err = ls[0].Forward(ctx, make([]float32, 14), 1, true)
	mustErr(t, "more rows than the image", err, "more than the image's 6")
}
