package tensorpar_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/tensorpar"
)

// TestMLPOptionsMatchUnsharded checks the block with MLPOptions{ReLU,
// NoInputGrad} (mlp's fc1 and fc2 at the network's input) against
// models' Linear→ReLU→Linear with fc1.SkipInputGrad: output and every
// parameter gradient within 1e-5 of the tensor's largest entry (bit for
// bit at L = 1), no input gradient, and exactly one all-reduce of b·Out
// values a step (forward's), none backward.
func TestMLPOptionsMatchUnsharded(t *testing.T) {
	type mlpCase struct{ in, hidden, out, batch int }
	for ci, c := range []mlpCase{{9, 13, 11, 2}, {16, 600, 8, 5}} {
		for _, l := range []int{1, 2, 3} {
			t.Run(fmt.Sprintf("in%d_hidden%d_out%d_b%d_L%d", c.in, c.hidden, c.out, c.batch, l), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(ci), 7+uint64(l)))
				w := randWeights(rng, c.in, c.hidden, c.out)
				x := randn(rng, c.batch*c.in, 1)
				dy := randn(rng, c.batch*c.out, 1)
				fc1, fc2 := models.NewLinear(c.in, c.hidden), models.NewLinear(c.hidden, c.out)
				fc1.W, fc1.B, fc2.W, fc2.B = w.W1, w.B1, w.W2, w.B2
				fc1.DW, fc1.DB = make([]float32, len(w.W1)), make([]float32, len(w.B1))
				fc2.DW, fc2.DB = make([]float32, len(w.W2)), make([]float32, len(w.B2))
				fc1.SkipInputGrad = true
				var relu models.ReLU
				wantY := append([]float32(nil), fc2.Forward(relu.Forward(fc1.Forward(x, c.batch, true), c.batch, true), c.batch, true)...)
				if dx := fc1.Backward(relu.Backward(fc2.Backward(dy))); dx != nil {
					t.Fatal("the reference computed an input gradient")
				}
				want := tensorpar.MLPWeights{W1: fc1.DW, B1: fc1.DB, W2: fc2.DW, B2: fc2.DB}

				gs := groups(t, l)
				ms := shards(t, gs, 6, func(ctx context.Context, g tensorpar.Group) (*tensorpar.MLP, error) {
					m, err := tensorpar.NewMLPWith(ctx, g, c.in, c.hidden, c.out, tensorpar.MLPOptions{ReLU: true, NoInputGrad: true})
					if err != nil {
						return nil, err
					}
					return m, m.SetFromFull(w)
				})
				ys := make([][]float32, l)
				err := each(l, func(ctx context.Context, r int) error {
					y, err := ms[r].Forward(ctx, x, c.batch)
					if err != nil {
						return err
					}
					ys[r] = append([]float32(nil), y...)
					dx, err := ms[r].Backward(ctx, dy)
					if err != nil {
						return err
					}
					if dx != nil {
						t.Errorf("rank %d: an input gradient with NoInputGrad", r)
					}
					if got, want := gs[r].Counts(), (tensorpar.Counts{AllReduceOps: 1, AllReduceValues: int64(c.batch * c.out)}); got != want {
						t.Errorf("rank %d: step counts %+v, want %+v", r, got, want)
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				got := zeroWeights(c.in, c.hidden, c.out)
				for _, m := range ms {
					if err := m.CopyGradsTo(got); err != nil {
						t.Fatal(err)
					}
				}
				worst := 0.0
				for _, p := range []struct {
					name      string
					got, want []float32
				}{{"y", ys[0], wantY}, {"dW1", got.W1, want.W1}, {"dB1", got.B1, want.B1}, {"dW2", got.W2, want.W2}, {"dB2", got.B2, want.B2}} {
					var d, m float64
					for i := range p.want {
						d = math.Max(d, math.Abs(float64(p.got[i])-float64(p.want[i])))
						m = math.Max(m, math.Abs(float64(p.want[i])))
					}
					if l == 1 && d != 0 || m > 0 && d/m > 1e-5 || math.IsNaN(d) {
						t.Errorf("%s differs from the unsharded block's by %.3g (largest entry %.3g)", p.name, d, m)
					}
					if m > 0 {
						worst = math.Max(worst, d/m)
					}
				}
				t.Logf("largest difference relative to the tensor's largest entry: %.3g", worst)
			})
		}
	}
}
