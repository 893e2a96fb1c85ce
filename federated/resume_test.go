package federated

import (
	"bytes"
	"context"
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/models"
)

// TestSimResumeIsBitIdentical: a run stopped after round 3 and resumed
// from its snapshot closes the same rounds (clients, losses, accuracies)
// and ends with the same global model and server optimiser state, bit for
// bit, as an undisturbed run, for every stateful server optimiser and for
// a stateless one.
func TestSimResumeIsBitIdentical(t *testing.T) {
	t.Parallel() // as its strategies: simulations only read the datasets
	tr, te := synthetic(t, 600, 200)
	for _, strategy := range []string{"fedavg", "fedavgm", "fedadam", "fedyogi"} {
		t.Run(strategy, func(t *testing.T) {
			t.Parallel()
			cfg := SimConfig{
				Train: tr, Test: te, Partition: data.PartitionIID(tr.Labels, 8, 1), Model: "mlp",
				Rounds: 6, Fraction: 0.5, LocalEpochs: 1, LocalBatch: 20, ClientLR: 0.05, EvalEvery: 2, Seed: 5,
				Strategy: StrategyConfig{Name: strategy},
			}
			whole, err := NewSim(cfg)
			if err != nil {
				t.Fatal(err)
			}
			want, err := whole.Run(context.Background())
			if err != nil {
				t.Fatal(err)
			}

			stop := errors.New("stop after round 3")
			var snap Snapshot
			first := cfg
			var s1 *Sim
			first.AfterRound = func(r Record) error {
				if r.Round == 3 {
					snap = s1.Snapshot()
					return stop
				}
				return nil
			}
			if s1, err = NewSim(first); err != nil {
				t.Fatal(err)
			}
			if _, err := s1.Run(context.Background()); !errors.Is(err, stop) {
				t.Fatalf("first part: err %v, want %v", err, stop)
			}
			if snap.Round != 3 || snap.Completed != 3 || (strategy != "fedavg") != (len(snap.Server) > 0) {
				t.Fatalf("snapshot: round %d, completed %d, %d server tensors", snap.Round, snap.Completed, len(snap.Server))
			}

			second := cfg
			second.Resume = &snap
			s2, err := NewSim(second)
			if err != nil {
				t.Fatal(err)
			}
			got, err := s2.Run(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Records) != 3 {
				t.Fatalf("resumed run closed %d rounds, want 3", len(got.Records))
			}
			for i, r := range got.Records {
				w := want.Records[3+i]
				if r.Round != w.Round || !slices.Equal(r.Participants, w.Participants) || r.TrainLoss != w.TrainLoss ||
					r.Evaluated != w.Evaluated || r.TestAcc != w.TestAcc || r.TestLoss != w.TestLoss {
					t.Errorf("round %d: resumed %+v, undisturbed %+v", w.Round, r, w)
				}
			}
			if got.FinalAcc != want.FinalAcc || got.FinalLoss != want.FinalLoss {
				t.Errorf("final accuracy/loss %v/%v, undisturbed %v/%v", got.FinalAcc, got.FinalLoss, want.FinalAcc, want.FinalLoss)
			}
			sameTensors(t, "model", s2.Snapshot().Model, whole.Snapshot().Model)
			sameTensors(t, "server state", s2.Snapshot().Server, whole.Snapshot().Server)
		})
	}
}

func sameTensors(t *testing.T, what string, got, want map[string]models.Tensor) {
	t.Helper()
	if g, w := slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)); !slices.Equal(g, w) {
		t.Fatalf("%s: tensors %v, want %v", what, g, w)
	}
	for name, w := range want {
		if !bytes.Equal(got[name].Data, w.Data) {
			t.Errorf("%s: %s differs from the undisturbed run's", what, name)
		}
	}
}

func TestSimResumeRefusals(t *testing.T) {
	tr, te := synthetic(t, 200, 50)
	cfg := SimConfig{Train: tr, Test: te, Partition: data.PartitionIID(tr.Labels, 4, 1), Rounds: 2, Fraction: 0.5,
		Strategy: StrategyConfig{Name: "fedavgm"}, Seed: 1}
	s, err := NewSim(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	done := s.Snapshot()
	for name, mod := range map[string]func(*Snapshot){
		"finished":           func(*Snapshot) {},
		"round < completed":  func(sn *Snapshot) { sn.Completed, sn.Round = 1, 0 },
		"missing parameter":  func(sn *Snapshot) { sn.Completed = 1; delete(sn.Model, "fc.weight") },
		"foreign state":      func(sn *Snapshot) { sn.Completed = 1; sn.Server["m.fc.weight"] = sn.Server["momentum.fc.weight"] },
		"missing state part": func(sn *Snapshot) { sn.Completed = 1; delete(sn.Server, "momentum.fc.bias") },
	} {
		sn := done
		sn.Model, sn.Server = maps.Clone(done.Model), maps.Clone(done.Server)
		mod(&sn)
		c := cfg
		c.Resume = &sn
		if _, err := NewSim(c); err == nil {
			t.Errorf("%s: resumed without an error", name)
		}
	}
}
