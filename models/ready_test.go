package models

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestBackwardNotify checks, for every architecture, that BackwardNotify
// computes what Backward does, that the offsets it reports only decrease
// and end at 0, and — what overlap relies on — that grads[from:] never
// changes after ready(from).
func TestBackwardNotify(t *testing.T) {
	t.Parallel() // as its architectures: each builds its own networks
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			opt := smallOptions(name)
			a, err := New(name, opt)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := New(name, opt)
			r := rand.New(rand.NewPCG(5, 5))
			const batch = 3
			x := randn(r, batch*a.InputSize())
			d := randn(r, batch*opt.Classes)
			a.Forward(x, batch, true)
			a.Backward(d)
			b.Forward(x, batch, true)
			type seen struct {
				from int
				tail []float32
			}
			var calls []seen
			b.BackwardNotify(d, func(from int) {
				calls = append(calls, seen{from, slices.Clone(b.Grads()[from:])})
			})
			if !slices.Equal(a.Grads(), b.Grads()) {
				t.Fatal("BackwardNotify's gradients differ from Backward's")
			}
			if len(calls) == 0 || calls[len(calls)-1].from != 0 {
				t.Fatalf("calls %d, last from %v: want a last call with 0", len(calls), calls)
			}
			prev := b.NumParams()
			final := b.Grads()
			for i, c := range calls {
				if c.from > prev {
					t.Fatalf("call %d: from %d after %d: must not increase", i, c.from, prev)
				}
				prev = c.from
				if !slices.Equal(c.tail, final[c.from:]) {
					t.Fatalf("call %d: grads[%d:] changed after it was reported final", i, c.from)
				}
			}
		})
	}
}
