package tensorpar_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/gradsync/gradsync/tensorpar"
)

// TestFuse: every rank gets the whole images back from uneven strips,
// bit for bit, with one all-gather of batch·C·maxRows·W values; Backward
// hands each rank its rows of the gradient and communicates nothing.
func TestFuse(t *testing.T) {
	const batch, c, h, w = 2, 3, 11, 4
	for f := 1; f <= 4; f++ {
		rng := rand.New(rand.NewPCG(uint64(f), 51))
		x, dy := randn(rng, batch*c*h*w, 1), randn(rng, batch*c*h*w, 1)
		strips := tensorpar.EvenStrips(h, f)
		maxRows := 0
		for r := range f {
			maxRows = max(maxRows, strips[r+1]-strips[r])
		}
		gs := groups(t, f)
		err := each(f, func(ctx context.Context, r int) error {
			l, err := tensorpar.NewFuse(gs[r], c, w, strips)
			if err != nil {
				return err
			}
			y, err := l.Forward(ctx, stripRows(x, batch*c, h, w, l.Lo, l.Hi), batch)
			if err != nil {
				return err
			}
			if !slicesBitEqual(y, x) {
				t.Errorf("F=%d rank %d: fused images differ from the whole ones", f, r)
			}
			dx, err := l.Backward(dy)
			if err != nil {
				return err
			}
			if !slicesBitEqual(dx, stripRows(dy, batch*c, h, w, l.Lo, l.Hi)) {
				t.Errorf("F=%d rank %d: dx is not its rows of dy", f, r)
			}
			if got, want := gs[r].Counts(), (tensorpar.Counts{AllGatherOps: 1, AllGatherValues: int64(batch * c * maxRows * w)}); got != want {
				t.Errorf("F=%d rank %d: counts %+v, want %+v", f, r, got, want)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tensorpar.NewFuse(groups(t, 2)[0], 1, 1, tensorpar.Strips{0, 3}); err == nil {
		t.Error("NewFuse took one strip for two ranks")
	}
}
