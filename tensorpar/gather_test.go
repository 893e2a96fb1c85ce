package tensorpar_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gradsync/gradsync/tensorpar"
)

// TestGatherParams: every rank gathers the whole block — attention and
// MLP shards, uneven ones included — back into PyTorch's tensors bit for
// bit, parameters and gradients, with one all-gather of the longest
// shard per sharded layer; and the gathered gradients are the ranks'
// CopyGradsTo.
func TestGatherParams(t *testing.T) {
	c := blockCase{d: 10, heads: 5, tokens: 3, hidden: 7, batch: 2}
	for l := 1; l <= 4; l++ {
		t.Run(fmt.Sprintf("T%d", l), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(61, uint64(l)))
			w := randBlock(rng, c.d, c.hidden)
			x := randn(rng, c.batch*c.tokens*c.d, 1)
			gs := groups(t, l)
			bs := newBlocks(t, gs, w, c)
			// the longest shards: attention's heads and the MLP's hidden units.
			var attnMax, mlpMax int64
			for r := range l {
				hl, hh := tensorpar.Span(c.heads, l, r)
				k := (hh - hl) * (c.d / c.heads)
				attnMax = max(attnMax, int64(3*k*c.d+3*k+c.d*k+c.d))
				ul, uh := tensorpar.Span(c.hidden, l, r)
				k = uh - ul
				mlpMax = max(mlpMax, int64(k*c.d+k+c.d*k+c.d))
			}
			got := make([][2]tensorpar.BlockWeights, l)
			err := each(l, func(ctx context.Context, r int) error {
				if _, err := bs[r].Forward(ctx, x, c.batch); err != nil {
					return err
				}
				if _, err := bs[r].Backward(ctx, x); err != nil {
					return err
				}
				gs[r].Reset()
				p, err := bs[r].GatherParams(ctx, false)
				if err != nil {
					return err
				}
				g, err := bs[r].GatherParams(ctx, true)
				got[r] = [2]tensorpar.BlockWeights{p, g}
				want := tensorpar.Counts{AllGatherOps: 4, AllGatherValues: 2 * (attnMax + mlpMax)}
				if c := gs[r].Counts(); c != want {
					t.Errorf("rank %d: counts %+v, want %+v", r, c, want)
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			wantG := zeroBlock(c.d, c.hidden)
			for _, b := range bs {
				if err := b.CopyGradsTo(wantG); err != nil {
					t.Fatal(err)
				}
			}
			for r := range l {
				for _, p := range flatBlock(got[r][0], w) {
					if !slicesBitEqual(p.got, p.want) {
						t.Errorf("rank %d: gathered %s differs from the whole block's", r, p.name)
					}
				}
				for _, p := range flatBlock(got[r][1], wantG) {
					if !slicesBitEqual(p.got, p.want) {
						t.Errorf("rank %d: gathered gradient of %s differs from CopyGradsTo's", r, p.name)
					}
				}
			}
		})
	}
}

// TestBlockGatherAndShardOf: ShardOf of whole-block tensors (an
// optimiser's state read from a checkpoint) gives each rank its shard,
// and Gather of the shards gives the whole tensors back bit for bit on
// every rank — for T = 1..4, uneven shards included; ShardOf of the
// block's own weights is the rank's Params.
func TestBlockGatherAndShardOf(t *testing.T) {
	c := blockCase{d: 10, heads: 5, tokens: 3, hidden: 7, batch: 2}
	for l := 1; l <= 4; l++ {
		t.Run(fmt.Sprintf("T%d", l), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(67, uint64(l)))
			w, state := randBlock(rng, c.d, c.hidden), randBlock(rng, c.d, c.hidden)
			gs := groups(t, l)
			bs := newBlocks(t, gs, w, c)
			err := each(l, func(ctx context.Context, r int) error {
				buf := make([]float32, len(bs[r].Params()))
				if err := bs[r].ShardOf(buf, w); err != nil {
					return err
				}
				if !slicesBitEqual(buf, bs[r].Params()) {
					t.Errorf("rank %d: ShardOf of the whole weights differs from Params", r)
				}
				if err := bs[r].ShardOf(buf, state); err != nil {
					return err
				}
				whole, err := bs[r].Gather(ctx, buf)
				if err != nil {
					return err
				}
				for _, p := range flatBlock(whole, state) {
					if !slicesBitEqual(p.got, p.want) {
						t.Errorf("rank %d: Gather(ShardOf(%s)) differs from it", r, p.name)
					}
				}
				if err := bs[r].ShardOf(buf[1:], w); err == nil {
					t.Errorf("rank %d: ShardOf into %d values: no error", r, len(buf)-1)
				}
				if _, err := bs[r].Gather(ctx, buf[1:]); err == nil {
					t.Errorf("rank %d: Gather of %d values: no error", r, len(buf)-1)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
