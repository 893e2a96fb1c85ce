package optim

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestClipNorm: an optimiser with ClipNorm takes the step that clipping
// with ClipGradNorm and then stepping takes (torch's clip_grad_norm_ then
// optimizer.step()), for SGD with momentum and for AdamW; a gradient
// already inside the norm is untouched.
func TestClipNorm(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	const n = 50
	params := make([]float32, n)
	for i := range params {
		params[i] = float32(r.NormFloat64())
	}
	type opt interface{ Step(params, grads []float32) }
	for _, c := range []struct {
		name            string
		clipped, byHand opt
		maxNorm         float32
	}{
		{"sgd", &SGD{LR: 0.1, Momentum: 0.9, ClipNorm: 0.5}, &SGD{LR: 0.1, Momentum: 0.9}, 0.5},
		{"adamw", &Adam{LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.1, Decoupled: true, ClipNorm: 0.5},
			&Adam{LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.1, Decoupled: true}, 0.5},
		{"inside the norm", &SGD{LR: 0.1, ClipNorm: 1e6}, &SGD{LR: 0.1}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			p1, p2 := slices.Clone(params), slices.Clone(params)
			for range 3 {
				g := make([]float32, n)
				for i := range g {
					g[i] = float32(r.NormFloat64())
				}
				g2 := slices.Clone(g)
				c.clipped.Step(p1, g)
				if c.maxNorm > 0 {
					if total := ClipGradNorm(g2, c.maxNorm); !(total > c.maxNorm) {
						t.Fatalf("test gradient norm %v is not above the clip norm", total)
					}
				}
				c.byHand.Step(p2, g2)
				if !slices.Equal(p1, p2) {
					t.Fatal("ClipNorm's step differs from ClipGradNorm then Step")
				}
			}
		})
	}
}
