package federated

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/models"
)

// TestLowPrecisionClients: clients training in bf16 or fp16 (autocast
// semantics, fp32 master weights) reach fp32's accuracy on an easy set
// without computing the same thing bit for bit (the precision reaches
// them); fp32 and bf16 skip no step; and the fp16 history does not depend
// on how many clients train at once (each local run has a fresh scaler).
func TestLowPrecisionClients(t *testing.T) {
	t.Parallel()
	tr, te := synthetic(t, 240, 100)
	sim := func(p models.Precision, par int) History {
		t.Helper()
		h, err := Simulate(context.Background(), SimConfig{
			Train: tr, Test: te, Partition: data.PartitionIID(tr.Labels, 4, 1), Model: "logreg",
			Rounds: 3, Fraction: 1, LocalEpochs: 1, LocalBatch: 10, ClientLR: 0.05, Seed: 5,
			Precision: p, Parallel: par,
		})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	skipped := func(h History) (n int) {
		for _, r := range h.Records {
			n += r.Skipped
		}
		return n
	}
	ref := sim(models.FP32, 2)
	for _, p := range []models.Precision{models.BF16, models.FP16} {
		h := sim(p, 2)
		t.Logf("%s: accuracy %.4f (fp32 %.4f), skipped %d", p, h.FinalAcc, ref.FinalAcc, skipped(h))
		if math.Abs(h.FinalAcc-ref.FinalAcc) > 0.03 || h.FinalAcc < 0.8 {
			t.Errorf("%s: accuracy %.4f, fp32 %.4f: want within 0.03 and ≥ 0.8", p, h.FinalAcc, ref.FinalAcc)
		}
		if p == models.BF16 && skipped(h) != 0 {
			t.Errorf("bf16 skipped %d steps; it has no loss scaler", skipped(h))
		}
		if h.Records[0].TestLoss == ref.Records[0].TestLoss {
			t.Errorf("%s: the same loss as fp32 bit for bit: the precision did not reach the clients", p)
		}
		if p != models.FP16 {
			continue
		}
		for _, par := range []int{1, 3} {
			o := sim(p, par)
			for i, r := range o.Records {
				w := h.Records[i]
				if r.Skipped != w.Skipped || math.Float64bits(r.TestLoss) != math.Float64bits(w.TestLoss) || math.Float64bits(r.UpdateNorm) != math.Float64bits(w.UpdateNorm) {
					t.Fatalf("fp16, parallel %d, round %d: %+v, want %+v", par, r.Round, r, w)
				}
			}
		}
	}
	if n := skipped(ref); n != 0 {
		t.Errorf("fp32 skipped %d steps", n)
	}
}

// TestFP16ClientSkipsOverflow: a client whose fp16 gradients overflow at
// the loss scaler's scale skips those steps — its parameters stay finite
// and only the clean steps move them — and Skipped counts them; a fresh
// Train starts the scaler afresh. The start model's weights are scaled ×10
// so that the scaled backward overflows fp16's 65504.
func TestFP16ClientSkipsOverflow(t *testing.T) {
	tr, _ := synthetic(t, 40, 10)
	tn, err := NewTrainer("mlp", tr, 1, 40, 4, models.FP16)
	if err != nil {
		t.Fatal(err)
	}
	defer tn.Network().Close()
	start := slices.Clone(tn.Network().Params())
	for i := range start {
		start[i] *= 10
	}
	idx := make([]int, 40)
	for i := range idx {
		idx[i] = i
	}
	cfg := LocalConfig{Epochs: 1, Batch: 4, LR: 0.01, Seed: 1}
	tn.Train(tr, idx, start, nil, cfg)
	n := tn.Skipped()
	t.Logf("fp16, weights ×10: %d of 10 steps skipped", n)
	if n < 1 || n == 10 {
		t.Fatalf("%d of 10 steps skipped; want some (the first scales overflow) but not all (the scale backs off)", n)
	}
	if slices.Equal(tn.Network().Params(), start) {
		t.Fatal("the clean steps did not move the parameters")
	}
	for i, p := range tn.Network().Params() {
		if math.IsNaN(float64(p)) || math.IsInf(float64(p), 0) {
			t.Fatalf("parameter %d is %v after skipped steps", i, p)
		}
	}
	// The same start again gives the same count: the scaler starts afresh.
	tn.Train(tr, idx, start, nil, cfg)
	if tn.Skipped() != n {
		t.Errorf("a second Train skipped %d, the first %d: the scaler did not start afresh", tn.Skipped(), n)
	}
}
