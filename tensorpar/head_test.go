package tensorpar_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/models/modeltest"
	"github.com/gradsync/gradsync/tensorpar"
)

// groups returns l counting groups over a fresh in-memory ring, all with id 7.
func groups(t testing.TB, l int) []*tensorpar.Counting {
	rings := aggregator.NewMemRing(l, 4)
	t.Cleanup(func() {
		for _, r := range rings {
			r.(*aggregator.MemRing).Close()
		}
	})
	gs := make([]*tensorpar.Counting, l)
	for i, r := range rings {
		g, err := tensorpar.NewRingGroup(r, 7, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		gs[i] = &tensorpar.Counting{Group: g}
	}
	return gs
}

// each runs fn on every rank concurrently and returns the first error.
func each(l int, fn func(ctx context.Context, r int) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	errs := make([]error, l)
	var wg sync.WaitGroup
	for r := range l {
		wg.Go(func() {
			errs[r] = fn(ctx, r)
			if errs[r] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func randn(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
	}
	return v
}

func relErr(a, b float64) float64 {
	return math.Abs(a-b) / math.Max(1e-6, math.Max(math.Abs(a), math.Abs(b)))
}

type headCase struct {
	in, classes, batch, l int
	opt                   models.CEOptions
}

// TestHeadMatchesUnsharded checks logits, loss, all gradients and top-1
// of the sharded head against the whole head, and the communication of a
// step against its formula.
func TestHeadMatchesUnsharded(t *testing.T) {
	var cases []headCase
	for _, l := range []int{1, 2, 3, 4} {
		cases = append(cases,
			headCase{6, 10, 5, l, models.CEOptions{}},
			headCase{5, 7, 4, l, models.CEOptions{LabelSmoothing: 0.1}},
		)
	}
	cases = append(cases, headCase{8, 1000, 6, 4, models.CEOptions{LabelSmoothing: 0.2}})
	for ci, c := range cases {
		rng := rand.New(rand.NewPCG(uint64(ci), 9))
		if ci%3 == 1 {
			c.opt.ClassWeights = make([]float32, c.classes)
			for i := range c.opt.ClassWeights {
				c.opt.ClassWeights[i] = float32(0.5 + rng.Float64())
			}
		}
		full := models.NewLinear(c.in, c.classes)
		full.W, full.B = randn(rng, c.in*c.classes, 1), randn(rng, c.classes, 1)
		full.DW, full.DB = make([]float32, len(full.W)), make([]float32, len(full.B))
		x := randn(rng, c.batch*c.in, 1)
		labels := make([]int32, c.batch)
		for i := range labels {
			labels[i] = int32(rng.IntN(c.classes))
		}
		z := full.Forward(x, c.batch, true)
		dz := make([]float32, len(z))
		wantLoss := models.SoftmaxCrossEntropyWith(z, labels, c.classes, c.opt, dz)
		wantDx := full.Backward(dz)
		wantCorrect := 0
		for i, y := range labels {
			best := 0
			for j := range c.classes {
				if z[i*c.classes+j] > z[i*c.classes+best] {
					best = j
				}
			}
			if best == int(y) {
				wantCorrect++
			}
		}

		shards, err := tensorpar.Contiguous(c.classes, c.l)
		if err != nil {
			t.Fatal(err)
		}
		gs := groups(t, c.l)
		var maxRel float64
		var mu sync.Mutex
		note := func(name string, got, want float64, tol float64) {
			mu.Lock()
			defer mu.Unlock()
			e := relErr(got, want)
			if math.Abs(got-want) > 1e-6 {
				maxRel = math.Max(maxRel, e)
			}
			if e > tol && math.Abs(got-want) > 1e-6 {
				t.Errorf("case %d (L=%d C=%d): %s = %g, want %g", ci, c.l, c.classes, name, got, want)
			}
		}
		err = each(c.l, func(ctx context.Context, r int) error {
			h, err := tensorpar.NewHead(gs[r], c.in, c.classes, shards)
			if err != nil {
				return err
			}
			// memory: this rank holds 1/L of the head's rows, ±1.
			if rows := len(h.Lin.B); math.Abs(float64(rows)-float64(c.classes)/float64(c.l)) >= 1 {
				t.Errorf("rank %d holds %d rows of %d/%d", r, rows, c.classes, c.l)
			}
			if got := len(h.Lin.W) + len(h.Lin.B); got != len(h.Owned)*(c.in+1) {
				t.Errorf("rank %d holds %d parameters", r, got)
			}
			h.SetFromFull(full.W, full.B)
			zr := h.Forward(x, c.batch)
			k := len(h.Owned)
			for i := range c.batch {
				for j, cl := range h.Owned {
					note("logit", float64(zr[i*k+j]), float64(z[i*c.classes+cl]), 1e-5)
				}
			}
			loss, err := tensorpar.Loss(ctx, h, labels, c.opt)
			if err != nil {
				return err
			}
			note("loss", float64(loss), float64(wantLoss), 1e-5)
			dx, err := h.Backward(ctx)
			if err != nil {
				return err
			}
			for i := range dx {
				note("dx", float64(dx[i]), float64(wantDx[i]), 1e-4)
			}
			for j, cl := range h.Owned {
				note("db", float64(h.Lin.DB[j]), float64(full.DB[cl]), 1e-4)
				for i := range c.in {
					note("dW", float64(h.Lin.DW[j*c.in+i]), float64(full.DW[cl*c.in+i]), 1e-4)
				}
			}
			// communication of Loss+Backward: 3 (4 with smoothing) all-reduces
			// of b values, then one of b·In.
			nar := int64(3)
			if c.opt.LabelSmoothing != 0 {
				nar = 4
			}
			want := tensorpar.Counts{AllReduceOps: nar + 1, AllReduceValues: nar*int64(c.batch) + int64(c.batch*c.in)}
			if got := gs[r].Counts(); got != want {
				t.Errorf("case %d rank %d: counts %+v, want %+v", ci, r, got, want)
			}
			got, err := tensorpar.Correct(ctx, h, labels)
			if err != nil {
				return err
			}
			if got != wantCorrect {
				t.Errorf("case %d rank %d: %d correct, want %d", ci, r, got, wantCorrect)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("case %d: %v", ci, err)
		}
		t.Logf("case %d L=%d C=%d smoothing=%v weights=%v: comm per step %+v; largest relative difference %.3g",
			ci, c.l, c.classes, c.opt.LabelSmoothing, c.opt.ClassWeights != nil, gs[0].Counts(), maxRel)
	}
}

// TestHeadGradFiniteDifference checks the sharded cross-entropy's
// gradient with respect to every shard's weights and the input by
// central differences.
func TestHeadGradFiniteDifference(t *testing.T) {
	labels := []uint8{1, 6, 3}
	opt := models.CEOptions{LabelSmoothing: 0.1}
	checkHeadFD(t, 3, func(ctx context.Context, h *tensorpar.Head) (float32, error) {
		return tensorpar.Loss(ctx, h, labels, opt)
	})
}

// checkHeadFD checks a sharded head loss's gradient with respect to every
// shard's weights and the input by central differences: a head of 7
// classes over 3 ranks, In 4, batch 3, its weights and input drawn from
// seed.
func checkHeadFD(t *testing.T, seed uint64, loss func(ctx context.Context, h *tensorpar.Head) (float32, error)) {
	t.Helper()
	const in, classes, batch, l = 4, 7, 3, 3
	rng := rand.New(rand.NewPCG(seed, seed+1))
	shards, _ := tensorpar.Contiguous(classes, l)
	gs := groups(t, l)
	heads := make([]*tensorpar.Head, l)
	for r := range l {
		h, err := tensorpar.NewHead(gs[r], in, classes, shards)
		if err != nil {
			t.Fatal(err)
		}
		copy(h.Lin.W, randn(rng, len(h.Lin.W), 1))
		copy(h.Lin.B, randn(rng, len(h.Lin.B), 1))
		heads[r] = h
	}
	x := randn(rng, batch*in, 1)
	var dx []float32
	step := func(backward bool) float64 {
		var value float32
		err := each(l, func(ctx context.Context, r int) error {
			h := heads[r]
			h.Forward(x, batch)
			v, err := loss(ctx, h)
			if err != nil {
				return err
			}
			if r == 0 {
				value = v
			}
			if backward {
				clear(h.Lin.DW)
				clear(h.Lin.DB)
				d, err := h.Backward(ctx)
				if r == 0 {
					dx = append([]float32(nil), d...)
				}
				return err
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return float64(value)
	}
	step(true)
	f := func() float64 { return step(false) }
	modeltest.CheckGrad(t, "dx", f, x, dx, modeltest.Config{MaxChecks: -1})
	for r, h := range heads {
		dw := append([]float32(nil), h.Lin.DW...)
		db := append([]float32(nil), h.Lin.DB...)
		modeltest.CheckGrad(t, "W"+string(rune('0'+r)), f, h.Lin.W, dw, modeltest.Config{MaxChecks: -1})
		modeltest.CheckGrad(t, "B"+string(rune('0'+r)), f, h.Lin.B, db, modeltest.Config{MaxChecks: -1})
	}
}

func TestFromGroups(t *testing.T) {
	// 6 classes in 3 interleaved superclasses over 2 ranks.
	sh, err := tensorpar.FromGroups([][]int{{0, 3}, {1, 4}, {2, 5}}, 6, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(sh) != 2 || len(sh[0]) != 2 || len(sh[1]) != 4 || sh[0][1] != 3 {
		t.Errorf("shards %v", sh)
	}
	for _, bad := range [][][]int{{{0, 1}, {1, 2}}, {{0, 1}, {2}}, {{0, 1, 2, 9}}} {
		if _, err := tensorpar.FromGroups(bad, 4, 1); err == nil {
			t.Errorf("groups %v accepted", bad)
		}
	}
	if _, err := tensorpar.Contiguous(3, 4); err == nil {
		t.Error("3 classes over 4 shards accepted")
	}
}

// TestWrongGroupRefused: a rank calling with another group's id makes its
// neighbour refuse the frames (ErrUnexpectedFrame), and nothing hangs.
func TestWrongGroupRefused(t *testing.T) {
	rings := aggregator.NewMemRing(2, 4)
	defer func() {
		for _, r := range rings {
			r.(*aggregator.MemRing).Close()
		}
	}()
	ga, _ := tensorpar.NewRingGroup(rings[0], 1, 0, 0)
	gb, _ := tensorpar.NewRingGroup(rings[1], 2, 0, 0)
	gs := []tensorpar.Group{ga, gb}
	bufs := [][]float32{{1, 2, 3}, {4, 5, 6}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			errs[r] = gs[r].AllReduce(ctx, bufs[r], tensorpar.Sum)
			if errs[r] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	if !errors.Is(errs[0], aggregator.ErrUnexpectedFrame) && !errors.Is(errs[1], aggregator.ErrUnexpectedFrame) {
		t.Fatalf("errors %v, want an ErrUnexpectedFrame", errs)
	}
	if bufs[0][0] != 1 && bufs[1][0] != 4 {
		t.Errorf("a refused frame was used: %v", bufs)
	}
}
