package federated

import (
	"context"
	"errors"
	"testing"

	"github.com/gradsync/gradsync/data"
)

func synthetic(t *testing.T, nTrain, nTest int) (*data.Dataset, *data.Dataset) {
	t.Helper()
	tr, te, err := data.Synthetic(nTrain, nTest, 7)
	if err != nil {
		t.Fatal(err)
	}
	return tr, te
}

func TestSimulateFedAvgIID(t *testing.T) {
	tr, te := synthetic(t, 1000, 300)
	cfg := SimConfig{
		Train: tr, Test: te, Partition: data.PartitionIID(tr.Labels, 10, 1),
		Rounds: 5, Fraction: 0.5, LocalEpochs: 1, LocalBatch: 10, ClientLR: 0.05, Seed: 3,
	}
	var seen int
	cfg.Progress = func(r Record) {
		seen++
		t.Logf("round %d acc %.3f loss %.3f train %.3f norm %.3f clients %v", r.Round, r.TestAcc, r.TestLoss, r.TrainLoss, r.UpdateNorm, r.Participants)
	}
	h, err := Simulate(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Records) != 5 || seen != 5 {
		t.Fatalf("%d records, %d progress calls, want 5", len(h.Records), seen)
	}
	if h.FinalAcc < 0.9 {
		t.Fatalf("final accuracy %.3f, want ≥ 0.9", h.FinalAcc)
	}
}

// Non-IID smoke comparison: the same job on a Dirichlet(0.1) split and an
// IID split. Few clients per round and many local epochs make client drift
// visible; the IID run must do at least as well.
func TestSimulateDirichletVsIID(t *testing.T) {
	tr, te := synthetic(t, 1000, 300)
	dir, err := data.PartitionDirichlet(tr.Labels, tr.Classes, 10, 0.1, 5)
	if err != nil {
		t.Fatal(err)
	}
	run := func(name string, part [][]int, strategy string, mu float32, rw string, w Weighting) History {
		h, err := Simulate(context.Background(), SimConfig{
			Train: tr, Test: te, Partition: part, Rounds: 4, Fraction: 0.3, LocalEpochs: 3, LocalBatch: 20,
			ClientLR: 0.05, Mu: mu, Reweighting: rw, Strategy: StrategyConfig{Name: strategy, Weighting: w}, Seed: 11,
		})
		if err != nil {
			t.Fatal(err)
		}
		accs := make([]float64, len(h.Records))
		for i, r := range h.Records {
			accs[i] = r.TestAcc
		}
		t.Logf("%-28s accuracy by round %.3f", name, accs)
		return h
	}
	iid := run("iid fedavg", data.PartitionIID(tr.Labels, 10, 5), "fedavg", 0, "", WeightExamples)
	non := run("dirichlet(0.1) fedavg", dir, "fedavg", 0, "", WeightExamples)
	run("dirichlet(0.1) fedprox μ=0.1", dir, "fedprox", 0.1, "", WeightExamples)
	run("dirichlet(0.1) label-balanced", dir, "fedavg", 0, "", WeightLabelBalanced)
	run("dirichlet(0.1) class-balanced", dir, "fedavg", 0, "class-balanced", WeightExamples)
	run("dirichlet(0.1) fedavgm", dir, "fedavgm", 0, "", WeightExamples)
	if iid.FinalAcc < 0.9 {
		t.Errorf("IID final accuracy %.3f, want ≥ 0.9", iid.FinalAcc)
	}
	if non.FinalAcc > iid.FinalAcc {
		t.Errorf("Dirichlet(0.1) %.3f beat IID %.3f", non.FinalAcc, iid.FinalAcc)
	}
	// The participants' label histograms show the skew.
	for _, r := range non.Records {
		for i, h := range r.LabelHists {
			present := 0
			for _, n := range h {
				if n > 0 {
					present++
				}
			}
			t.Logf("round %d client %d: %d classes %v", r.Round, r.Participants[i], present, h)
		}
	}
}

func TestSimulateStrategiesAndStragglers(t *testing.T) {
	tr, te := synthetic(t, 600, 200)
	part := data.PartitionIID(tr.Labels, 8, 2)
	for _, c := range []struct {
		strategy string
		lr       float64
	}{{"fedadam", 0.03}, {"fedyogi", 0.03}, {"median", 0}, {"trimmed-mean", 0}} {
		h, err := Simulate(context.Background(), SimConfig{
			Train: tr, Test: te, Partition: part, Rounds: 4, Fraction: 0.5, LocalBatch: 10,
			Strategy: StrategyConfig{Name: c.strategy, ServerLR: c.lr}, Seed: 1,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: final accuracy %.3f", c.strategy, h.FinalAcc)
		if h.FinalAcc < 0.8 {
			t.Errorf("%s: final accuracy %.3f, want ≥ 0.8", c.strategy, h.FinalAcc)
		}
	}
	cfg := SimConfig{
		Train: tr, Test: te, Partition: part, Rounds: 4, Fraction: 1, LocalBatch: 10,
		StragglerProb: 0.3, MinClients: 2, MaxRetries: 2, EvalEvery: 2, Seed: 4,
	}
	h, err := Simulate(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	missing := 0
	for i, r := range h.Records {
		missing += len(r.Missing)
		if r.Evaluated != (i%2 == 1) {
			t.Errorf("round %d evaluated = %v with EvalEvery 2", i+1, r.Evaluated)
		}
		if len(r.Participants)+len(r.Missing) != 8 || len(r.LabelHists) != len(r.Participants) {
			t.Errorf("record %+v", r)
		}
	}
	if missing == 0 || h.FinalAcc < 0.8 {
		t.Errorf("stragglers: %d missing answers, final accuracy %.3f", missing, h.FinalAcc)
	}
	h2, err := Simulate(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if h2.FinalAcc != h.FinalAcc || h2.FinalLoss != h.FinalLoss || h2.Records[3].UpdateNorm != h.Records[3].UpdateNorm {
		t.Errorf("rerun differs: %v/%v vs %v/%v", h2.FinalAcc, h2.FinalLoss, h.FinalAcc, h.FinalLoss)
	}
}

func TestSimulateErrors(t *testing.T) {
	tr, te := synthetic(t, 100, 50)
	part := data.PartitionIID(tr.Labels, 4, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Simulate(ctx, SimConfig{Train: tr, Test: te, Partition: part, Rounds: 2, Fraction: 1}); err != context.Canceled {
		t.Errorf("cancelled: %v", err)
	}
	for name, cfg := range map[string]SimConfig{
		"no data":        {Partition: part, Rounds: 1},
		"no clients":     {Train: tr, Test: te, Rounds: 1},
		"bad index":      {Train: tr, Test: te, Partition: [][]int{{0, 100}}, Rounds: 1},
		"bad model":      {Train: tr, Test: te, Partition: part, Rounds: 1, Model: "gpt"},
		"bad strategy":   {Train: tr, Test: te, Partition: part, Rounds: 1, Strategy: StrategyConfig{Name: "x"}},
		"bad reweighing": {Train: tr, Test: te, Partition: part, Rounds: 1, Reweighting: "focal"},
	} {
		if _, err := Simulate(context.Background(), cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// Every client straggles: the job fails with too few clients.
	h, err := Simulate(context.Background(), SimConfig{Train: tr, Test: te, Partition: part, Rounds: 2, Fraction: 1, StragglerProb: 1, MaxRetries: 1})
	var few *TooFewClientsError
	if !errors.As(err, &few) || h.FailedRounds != 2 {
		t.Errorf("all stragglers: %v, %d failed rounds", err, h.FailedRounds)
	}
}
