package federated

import (
	"context"
	"math"
	"testing"

	"github.com/gradsync/gradsync/data"
)

// TestSimulateParallelIsDeterministic: 1, 2 and 5 clients training at once
// give the same history bit for bit — with dropout (cnn) and batch-norm
// buffers (resnet8), and stragglers.
func TestSimulateParallelIsDeterministic(t *testing.T) {
	t.Parallel() // as its models: simulations only read the datasets
	tr, te := synthetic(t, 300, 100)
	for _, model := range []string{"cnn", "resnet8"} {
		t.Run(model, func(t *testing.T) {
			t.Parallel()
			var ref History
			for _, par := range []int{1, 2, 5} {
				cfg := SimConfig{
					Train: tr, Test: te, Partition: data.PartitionIID(tr.Labels, 5, 1), Model: model,
					Rounds: 2, Fraction: 1, LocalEpochs: 1, LocalBatch: 20, ClientLR: 0.05, Seed: 4,
					StragglerProb: 0.2, MinClients: 1, Parallel: par,
				}
				h, err := Simulate(context.Background(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				if par == 1 {
					ref = h
					continue
				}
				if len(h.Records) != len(ref.Records) {
					t.Fatalf("parallel %d: %d records, want %d", par, len(h.Records), len(ref.Records))
				}
				for i, r := range h.Records {
					w := ref.Records[i]
					if math.Float64bits(r.TestAcc) != math.Float64bits(w.TestAcc) || math.Float64bits(r.TestLoss) != math.Float64bits(w.TestLoss) ||
						math.Float64bits(r.UpdateNorm) != math.Float64bits(w.UpdateNorm) || math.Float64bits(r.TrainLoss) != math.Float64bits(w.TrainLoss) {
						t.Fatalf("parallel %d, round %d: %+v, want %+v", par, r.Round, r, w)
					}
				}
			}
		})
	}
}
