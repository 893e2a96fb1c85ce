package tensorpar_test

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/gradsync/gradsync/internal/eval"
	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/tensorpar"
)

// naiveOrder is row's class indices sorted by logit, largest first, ties
// to the lower class index (a stable sort of the indices).
func naiveOrder(row []float32) []int {
	idx := make([]int, len(row))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return row[idx[a]] > row[idx[b]] })
	return idx
}

// testShards splits classes contiguously, or by interleaved groups
// (class c in group c mod ⌊C/3⌋, so the owners alternate along the class
// index).
func testShards(t *testing.T, classes, l int, grouped bool) [][]int {
	t.Helper()
	var shards [][]int
	var err error
	if grouped {
		gr := make([][]int, classes/3)
		for c := range classes {
			gr[c%len(gr)] = append(gr[c%len(gr)], c)
		}
		shards, err = tensorpar.FromGroups(gr, classes, l)
	} else {
		shards, err = tensorpar.Contiguous(classes, l)
	}
	if err != nil {
		t.Fatal(err)
	}
	return shards
}

type evalCase struct {
	in, classes, batch, l int
	grouped, integer      bool
}

// TestHeadEvalMatchesUnsharded checks Predict (through eval.Confusion),
// Ranks and CorrectTopK of the sharded head against the unsharded logits,
// and their communication against the formula: Predict one all-gather of
// 2b values, Ranks two all-reduces of b values.
//
// With integer weights and inputs every logit is an exact small integer
// whatever the order of the sums, so the sharded logits equal the
// unsharded ones bit for bit and many of them tie: the tie rule (the
// lower class index, eval.Argmax's) is checked across shards.
func TestHeadEvalMatchesUnsharded(t *testing.T) {
	var cases []evalCase
	for _, l := range []int{1, 2, 3, 4} {
		cases = append(cases,
			evalCase{6, 10, 16, l, false, false},
			evalCase{3, 9, 40, l, false, true},
			evalCase{3, 12, 40, l, true, true},
		)
	}
	cases = append(cases, evalCase{8, 1000, 12, 4, false, false}, evalCase{2, 1000, 12, 4, true, true})
	for ci, c := range cases {
		rng := rand.New(rand.NewPCG(uint64(ci), 17))
		gen := func(n int, scale float64) []float32 {
			if !c.integer {
				return randn(rng, n, scale)
			}
			v := make([]float32, n)
			for i := range v {
				v[i] = float32(rng.IntN(5) - 2)
			}
			return v
		}
		full := models.NewLinear(c.in, c.classes)
		full.W, full.B = gen(c.in*c.classes, 1), gen(c.classes, 1)
		full.DW, full.DB = make([]float32, len(full.W)), make([]float32, len(full.B))
		x := gen(c.batch*c.in, 1)
		labels := make([]int32, c.batch)
		for i := range labels {
			labels[i] = int32(rng.IntN(c.classes))
		}
		z := full.Forward(x, c.batch, true)
		for i := 0; i < c.batch; i += 2 { // every other label near the top, so that top-k counts are not all 0
			labels[i] = int32(naiveOrder(z[i*c.classes : (i+1)*c.classes])[rng.IntN(min(6, c.classes))])
		}
		want := eval.NewConfusion(c.classes)
		want.AddWide(z, labels)
		ks := []int{1, 2, 3, 5, c.classes}
		wantTop := make([]int, len(ks))
		wantRanks := make([]int, c.batch)
		ties := 0
		for i, y := range labels {
			row := z[i*c.classes : (i+1)*c.classes]
			wantRanks[i] = slices.Index(naiveOrder(row), int(y))
			for ki, k := range ks {
				if wantRanks[i] < k {
					wantTop[ki]++
				}
			}
			m, n := slices.Max(row), 0
			for _, v := range row {
				if v == m {
					n++
				}
			}
			if n > 1 {
				ties++
			}
		}
		if c.integer && ties == 0 {
			t.Fatalf("case %d: no tie for the top class: the tie rule is not exercised", ci)
		}
		shards := testShards(t, c.classes, c.l, c.grouped)
		gs := groups(t, c.l)
		got := make([]*eval.Confusion, c.l)
		err := each(c.l, func(ctx context.Context, r int) error {
			h, err := tensorpar.NewHead(gs[r], c.in, c.classes, shards)
			if err != nil {
				return err
			}
			h.SetFromFull(full.W, full.B)
			h.Forward(x, c.batch)
			pred, err := tensorpar.Predict(ctx, h)
			if err != nil {
				return err
			}
			if w := (tensorpar.Counts{AllGatherOps: 1, AllGatherValues: 2 * int64(c.batch)}); gs[r].Counts() != w {
				t.Errorf("case %d rank %d: Predict counts %+v, want %+v", ci, r, gs[r].Counts(), w)
			}
			got[r] = eval.NewConfusion(c.classes)
			got[r].AddPredictionsWide(pred, labels)
			gs[r].Reset()
			ranks, err := tensorpar.Ranks(ctx, h, labels)
			if err != nil {
				return err
			}
			if w := (tensorpar.Counts{AllReduceOps: 2, AllReduceValues: 2 * int64(c.batch)}); gs[r].Counts() != w {
				t.Errorf("case %d rank %d: Ranks counts %+v, want %+v", ci, r, gs[r].Counts(), w)
			}
			if !slices.Equal(ranks, wantRanks) {
				t.Errorf("case %d rank %d: ranks %v, want %v", ci, r, ranks, wantRanks)
			}
			for ki, k := range ks {
				n, err := tensorpar.CorrectTopK(ctx, h, labels, k)
				if err != nil {
					return err
				}
				if n != wantTop[ki] {
					t.Errorf("case %d rank %d: top-%d correct %d, want %d", ci, r, k, n, wantTop[ki])
				}
			}
			n, err := tensorpar.Correct(ctx, h, labels)
			if err != nil {
				return err
			}
			if n != wantTop[0] {
				t.Errorf("case %d rank %d: Correct %d, want top-1 %d", ci, r, n, wantTop[0])
			}
			return nil
		})
		if err != nil {
			t.Fatalf("case %d: %v", ci, err)
		}
		for r, g := range got {
			if !slices.EqualFunc(g.Matrix(), want.Matrix(), slices.Equal) {
				t.Errorf("case %d rank %d: confusion matrix differs from eval's on the unsharded logits", ci, r)
			}
		}
		if ci < 3 || c.classes == 1000 {
			t.Logf("case %d L=%d C=%d b=%d integer=%v: top-1/2/3/5 correct %v, %d top ties; Predict 1 all-gather of 2b=%d, Ranks 2 all-reduces of b=%d",
				ci, c.l, c.classes, c.batch, c.integer, wantTop[:4], ties, 2*c.batch, c.batch)
		}
	}
}

// TestHeadBCEMatchesUnsharded checks BCELoss's loss, per-example losses
// and every gradient against models.BCEWithLogits on the whole head, and
// its communication: one all-reduce of b values, then Backward's b·In.
func TestHeadBCEMatchesUnsharded(t *testing.T) {
	type bceCase struct {
		in, classes, batch, l int
		pos, grouped          bool
	}
	var cases []bceCase
	for _, l := range []int{1, 2, 3, 4} {
		cases = append(cases, bceCase{5, 9, 4, l, false, false}, bceCase{4, 12, 3, l, true, true})
	}
	cases = append(cases, bceCase{8, 1000, 5, 4, true, false})
	for ci, c := range cases {
		rng := rand.New(rand.NewPCG(uint64(ci), 23))
		full := models.NewLinear(c.in, c.classes)
		full.W, full.B = randn(rng, c.in*c.classes, 1), randn(rng, c.classes, 1)
		full.DW, full.DB = make([]float32, len(full.W)), make([]float32, len(full.B))
		x := randn(rng, c.batch*c.in, 1)
		targets := make([]float32, c.batch*c.classes)
		for i := range targets {
			switch rng.IntN(3) {
			case 0:
				targets[i] = 1
			case 1:
				targets[i] = float32(rng.Float64()) // soft
			}
		}
		var pos []float32
		if c.pos {
			pos = make([]float32, c.classes)
			for i := range pos {
				pos[i] = float32(0.25 + 3*rng.Float64())
			}
		}
		z := full.Forward(x, c.batch, true)
		dz := make([]float32, len(z))
		wantLoss := models.BCEWithLogits(z, targets, pos, dz)
		wantEx := make([]float64, c.batch)
		for i := range c.batch {
			var pw []float32
			if pos != nil {
				pw = pos
			}
			wantEx[i] = float64(models.BCEWithLogits(z[i*c.classes:(i+1)*c.classes], targets[i*c.classes:(i+1)*c.classes], pw, nil))
		}
		wantDx := full.Backward(dz)
		shards := testShards(t, c.classes, c.l, c.grouped)
		gs := groups(t, c.l)
		var mu sync.Mutex
		var maxRel float64
		note := func(name string, got, want, tol float64) {
			mu.Lock()
			defer mu.Unlock()
			if math.Abs(got-want) <= 1e-7 {
				return
			}
			e := relErr(got, want)
			maxRel = math.Max(maxRel, e)
			if e > tol {
				t.Errorf("case %d (L=%d C=%d): %s = %g, want %g", ci, c.l, c.classes, name, got, want)
			}
		}
		err := each(c.l, func(ctx context.Context, r int) error {
			h, err := tensorpar.NewHead(gs[r], c.in, c.classes, shards)
			if err != nil {
				return err
			}
			h.SetFromFull(full.W, full.B)
			h.Forward(x, c.batch)
			ex := make([]float32, c.batch)
			loss, err := tensorpar.BCELoss(ctx, h, targets, pos, ex)
			if err != nil {
				return err
			}
			note("loss", float64(loss), float64(wantLoss), 1e-5)
			for i := range ex {
				note("per-example loss", float64(ex[i]), wantEx[i], 1e-5)
			}
			k := len(h.Owned)
			for i := range c.batch {
				for j, cl := range h.Owned {
					note("dlogit", float64(h.DLogits()[i*k+j]), float64(dz[i*c.classes+cl]), 1e-4)
				}
			}
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
			want := tensorpar.Counts{AllReduceOps: 2, AllReduceValues: int64(c.batch + c.batch*c.in)}
			if got := gs[r].Counts(); got != want {
				t.Errorf("case %d rank %d: counts %+v, want %+v", ci, r, got, want)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("case %d: %v", ci, err)
		}
		t.Logf("case %d L=%d C=%d pos_weight=%v grouped=%v: comm %+v; largest relative difference %.3g",
			ci, c.l, c.classes, c.pos, c.grouped, gs[0].Counts(), maxRel)
	}
}

// TestHeadBCEFiniteDifference checks BCELoss's gradient with respect to
// every shard's weights and the input by central differences.
func TestHeadBCEFiniteDifference(t *testing.T) {
	const classes, batch = 7, 3 // checkHeadFD's head
	rng := rand.New(rand.NewPCG(5, 6))
	targets := make([]float32, batch*classes)
	for i := range targets {
		targets[i] = float32(rng.Float64())
	}
	pos := []float32{1, 2, 0.5, 3, 1, 1.5, 0.75}
	checkHeadFD(t, 5, func(ctx context.Context, h *tensorpar.Head) (float32, error) {
		return tensorpar.BCELoss(ctx, h, targets, pos, nil)
	})
}

// TestHeadEvalRefusals: bad input to the evaluation and BCE functions is
// an error on every rank before any communication, never a crash.
func TestHeadEvalRefusals(t *testing.T) {
	gs := groups(t, 1)
	shards, _ := tensorpar.Contiguous(4, 1)
	h, err := tensorpar.NewHead(gs[0], 2, 4, shards)
	if err != nil {
		t.Fatal(err)
	}
	h.Forward([]float32{1, 2, 3, 4}, 2)
	ctx := context.Background()
	ok := make([]float32, 8)
	for name, fn := range map[string]func() error{
		"top-0":             func() error { _, err := tensorpar.CorrectTopK(ctx, h, []uint8{0, 1}, 0); return err },
		"ranks labels":      func() error { _, err := tensorpar.Ranks(ctx, h, []uint8{0}); return err },
		"ranks label range": func() error { _, err := tensorpar.Ranks(ctx, h, []int32{0, 4}); return err },
		"correct labels":    func() error { _, err := tensorpar.Correct(ctx, h, []uint8{0, 1, 2}); return err },
		"bce targets":       func() error { _, err := tensorpar.BCELoss(ctx, h, ok[:7], nil, nil); return err },
		"bce target 2": func() error {
			_, err := tensorpar.BCELoss(ctx, h, []float32{0, 0, 2, 0, 0, 0, 0, 0}, nil, nil)
			return err
		},
		"bce target NaN": func() error {
			_, err := tensorpar.BCELoss(ctx, h, []float32{0, 0, 0, 0, 0, float32(math.NaN()), 0, 0}, nil, nil)
			return err
		},
		"bce pos_weight":   func() error { _, err := tensorpar.BCELoss(ctx, h, ok, []float32{1, 1}, nil); return err },
		"bce per-example":  func() error { _, err := tensorpar.BCELoss(ctx, h, ok, nil, make([]float32, 3)); return err },
		"too many classes": func() error { _, err := tensorpar.NewHead(gs[0], 1, 1<<24+1, [][]int{{0}}); return err },
	} {
		err := fn()
		if err == nil {
			t.Errorf("%s: accepted", name)
		} else if !strings.HasPrefix(err.Error(), "tensorpar: ") {
			t.Errorf("%s: error %q lacks the package prefix", name, err)
		}
	}
	if c := gs[0].Counts(); c != (tensorpar.Counts{}) {
		t.Errorf("refused calls communicated: %+v", c)
	}
}
