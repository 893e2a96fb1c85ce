package tensorpar_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gradsync/gradsync/internal/kernels"
	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/tensorpar"
)

// TestCommTable runs one training step of each layer kind at one shape on
// 2 and 4 ranks, checks every rank's communication against its formula
// exactly, and logs the rows of docs/experiments/tensorpar.md (rank 0's
// counts; go test -run TestCommTable -v ./tensorpar/).
func TestCommTable(t *testing.T) {
	const b, in, out, hidden, classes = 8, 64, 64, 256, 1000
	const s, d, heads = 16, 64, 4
	const c, h, w = 4, 16, 16
	rng := rand.New(rand.NewPCG(1, 2))
	row := func(layer string, n int, shape, got, formula string) {
		t.Logf("| %s | %d | %s | %s | %s |", layer, n, shape, got, formula)
	}
	counts := func(c tensorpar.Counts) string {
		var out string
		add := func(kind string, ops, vals int64) {
			if ops == 0 {
				return
			}
			if out != "" {
				out += "; "
			}
			out += fmt.Sprintf("%d %s, %d values", ops, kind, vals)
		}
		add("all-reduce", c.AllReduceOps, c.AllReduceValues)
		add("all-gather", c.AllGatherOps, c.AllGatherValues)
		add("broadcast", c.BroadcastOps, c.BroadcastValues)
		return out
	}
	expect := func(what string, r int, got, want tensorpar.Counts) {
		if got != want {
			t.Errorf("%s rank %d: counts %+v, want %+v", what, r, got, want)
		}
	}
	for _, n := range []int{2, 4} {
		x := randn(rng, b*in, 1)
		labels := make([]int32, b)
		for i := range labels {
			labels[i] = int32(rng.IntN(classes))
		}
		targets := make([]float32, b*classes)
		for i := range targets {
			targets[i] = float32(rng.IntN(2))
		}
		shards, _ := tensorpar.Contiguous(classes, n)

		// The label-sharded head: cross-entropy (with label smoothing), BCE,
		// and evaluation.
		for _, kind := range []string{"CE", "CE+smoothing", "BCE", "Predict", "Ranks"} {
			gs := groups(t, n)
			err := each(n, func(ctx context.Context, r int) error {
				hd, err := tensorpar.NewHead(gs[r], in, classes, shards)
				if err != nil {
					return err
				}
				hd.Forward(x, b)
				var want tensorpar.Counts
				switch kind {
				case "CE", "CE+smoothing":
					opt, k := models.CEOptions{}, int64(3)
					if kind != "CE" {
						opt.LabelSmoothing, k = 0.1, 4
					}
					if _, err := tensorpar.Loss(ctx, hd, labels, opt); err != nil {
						return err
					}
					if _, err := hd.Backward(ctx); err != nil {
						return err
					}
					want = tensorpar.Counts{AllReduceOps: k + 1, AllReduceValues: k*b + b*in}
				case "BCE":
					if _, err := tensorpar.BCELoss(ctx, hd, targets, nil, nil); err != nil {
						return err
					}
					if _, err := hd.Backward(ctx); err != nil {
						return err
					}
					want = tensorpar.Counts{AllReduceOps: 2, AllReduceValues: b + b*in}
				case "Predict":
					if _, err := tensorpar.Predict(ctx, hd); err != nil {
						return err
					}
					want = tensorpar.Counts{AllGatherOps: 1, AllGatherValues: 2 * b}
				case "Ranks":
					if _, err := tensorpar.Ranks(ctx, hd, labels); err != nil {
						return err
					}
					want = tensorpar.Counts{AllReduceOps: 2, AllReduceValues: 2 * b}
				}
				expect(kind, r, gs[r].Counts(), want)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			shape := fmt.Sprintf("b=%d, In=%d, C=%d", b, in, classes)
			switch kind {
			case "CE":
				row("label head: cross-entropy, loss + backward", n, shape, counts(gs[0].Counts()), fmt.Sprintf("3 all-reduces of b (max, Σexp, target logit) + 1 of b·In (dx): 4, 3·%d + %d·%d = %d", b, b, in, 3*b+b*in))
			case "CE+smoothing":
				row("label head: cross-entropy with label smoothing", n, shape, counts(gs[0].Counts()), fmt.Sprintf("4 all-reduces of b (+ Σ w·z) + 1 of b·In: 5, 4·%d + %d·%d = %d", b, b, in, 4*b+b*in))
			case "BCE":
				row("label head: BCE-with-logits (multi-label)", n, shape, counts(gs[0].Counts()), fmt.Sprintf("1 all-reduce of b (the loss's value; the gradient needs none) + 1 of b·In: 2, %d + %d·%d = %d", b, b, in, b+b*in))
			case "Predict":
				row("label head: Predict / top-1 / confusion", n, shape, counts(gs[0].Counts()), fmt.Sprintf("1 all-gather of 2b (each rank's best logit and class): 1, %d", 2*b))
			case "Ranks":
				row("label head: Ranks / top-k (any k)", n, shape, counts(gs[0].Counts()), fmt.Sprintf("2 all-reduces of b (the label's logit, the count of classes beating it): 2, %d", 2*b))
			}
		}

		// 1D tensor parallelism: the Megatron MLP, attention and block.
		xs := randn(rng, b*s*d, 1)
		for _, kind := range []string{"MLP", "attention", "block"} {
			gs := groups(t, n)
			err := each(n, func(ctx context.Context, r int) error {
				type layer interface {
					Forward(context.Context, []float32, int) ([]float32, error)
					Backward(context.Context, []float32) ([]float32, error)
				}
				var l layer
				var err error
				xin, rows, width := xs, b*s, d
				switch kind {
				case "MLP":
					l, err = tensorpar.NewMLP(ctx, gs[r], in, hidden, out)
					xin, rows, width = x, b, in
				case "attention":
					l, err = tensorpar.NewAttention(ctx, gs[r], d, heads, s)
				case "block":
					l, err = tensorpar.NewBlock(ctx, gs[r], d, heads, s, hidden)
				}
				if err != nil {
					return err
				}
				gs[r].Reset() // the shape handshake
				batch := b
				y, err := l.Forward(ctx, xin, batch)
				if err != nil {
					return err
				}
				if _, err := l.Backward(ctx, y); err != nil {
					return err
				}
				k := int64(2)
				if kind == "block" {
					k = 4
				}
				expect(kind, r, gs[r].Counts(), tensorpar.Counts{AllReduceOps: k, AllReduceValues: k * int64(rows*width)})
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			switch kind {
			case "MLP":
				row("tensor (1D): Megatron MLP", n, fmt.Sprintf("b=%d, %d→%d→%d", b, in, hidden, out), counts(gs[0].Counts()), fmt.Sprintf("1 all-reduce of b·Out forward + 1 of b·In backward: 2, %d", b*out+b*in))
			case "attention":
				row("tensor (1D): attention by heads", n, fmt.Sprintf("b=%d, s=%d, D=%d, %d heads", b, s, d, heads), counts(gs[0].Counts()), fmt.Sprintf("1 all-reduce of b·s·D forward + 1 backward: 2, 2·%d", b*s*d))
			case "block":
				row("tensor (1D): transformer block", n, fmt.Sprintf("b=%d, s=%d, D=%d, hidden %d", b, s, d, hidden), counts(gs[0].Counts()), fmt.Sprintf("2 all-reduces of b·s·D forward + 2 backward: 4, 4·%d", b*s*d))
			}
		}

		// Spatial: a k×k stride-1 "same" convolution, batch norm, fuse.
		strips := tensorpar.EvenStrips(h, n)
		img := randn(rng, b*c*h*w, 1)
		for _, k := range []int{3, 5} {
			hs := halos(n)
			geom := kernels.ConvGeom{C: c, H: h, W: w, KH: k, KW: k, StrideH: 1, StrideW: 1, PadH: (k - 1) / 2, PadW: (k - 1) / 2}
			got := make([]tensorpar.HaloCounts, n)
			err := each(n, func(ctx context.Context, r int) error {
				l, err := tensorpar.NewSpatialConv(ctx, hs[r], geom, c, true, strips, strips)
				if err != nil {
					return err
				}
				hs[r].Reset()
				y, err := l.Forward(ctx, stripRows(img, b*c, h, w, strips[r], strips[r+1]), b)
				if err != nil {
					return err
				}
				if _, err := l.Backward(ctx, y); err != nil {
					return err
				}
				got[r] = hs[r].Counts()
				// (k−1)/2 rows per image per channel per interior side, each
				// way (forward the rows, backward their gradients).
				side := int64(2 * b * c * w * (k - 1) / 2)
				want := tensorpar.HaloCounts{Exchanges: 2}
				if r > 0 {
					want.SentAbove, want.RecvAbove = side, side
				}
				if r < n-1 {
					want.SentBelow, want.RecvBelow = side, side
				}
				if got[r] != want {
					t.Errorf("conv k=%d rank %d: halo counts %+v, want %+v", k, r, got[r], want)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			row(fmt.Sprintf("spatial: conv %d×%d, stride 1, pad %d", k, k, (k-1)/2), n, fmt.Sprintf("b=%d, C=%d, %d×%d, even strips", b, c, h, w),
				fmt.Sprintf("2 exchanges; %d values sent per interior side", got[0].SentBelow),
				fmt.Sprintf("(k−1)/2 rows per image per channel per interior side, each way (rows forward, their gradients backward): 2, 2·%d·%d·%d·%d", b, c, w, (k-1)/2))
		}
		gs := groups(t, n)
		err := each(n, func(ctx context.Context, r int) error {
			bn, err := tensorpar.NewSpatialBatchNorm(ctx, gs[r], c, h*w)
			if err != nil {
				return err
			}
			gs[r].Reset()
			y, err := bn.Forward(ctx, stripRows(img, b*c, h, w, strips[r], strips[r+1]), b, true)
			if err != nil {
				return err
			}
			if _, err := bn.Backward(ctx, y); err != nil {
				return err
			}
			expect("batch norm", r, gs[r].Counts(), tensorpar.Counts{AllReduceOps: 3, AllReduceValues: 4 * c})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		row("spatial: batch norm (training)", n, fmt.Sprintf("C=%d", c), counts(gs[0].Counts()), fmt.Sprintf("2 all-reduces of C forward + 1 of 2C backward: 3, 4·%d", c))
		gs = groups(t, n)
		maxRows := 0
		for r := range n {
			maxRows = max(maxRows, strips[r+1]-strips[r])
		}
		err = each(n, func(ctx context.Context, r int) error {
			f, err := tensorpar.NewFuse(gs[r], c, w, strips)
			if err != nil {
				return err
			}
			y, err := f.Forward(ctx, stripRows(img, b*c, h, w, strips[r], strips[r+1]), b)
			if err != nil {
				return err
			}
			if _, err := f.Backward(y); err != nil {
				return err
			}
			expect("fuse", r, gs[r].Counts(), tensorpar.Counts{AllGatherOps: 1, AllGatherValues: int64(b * c * maxRows * w)})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		row("spatial: Fuse before the head", n, fmt.Sprintf("b=%d, C=%d, %d×%d", b, c, h, w), counts(gs[0].Counts()), fmt.Sprintf("1 all-gather of b·C·maxRows·W forward, none backward: 1, %d·%d·%d·%d", b, c, maxRows, w))
	}

	// 2D tensor parallelism on a 2×2 grid: rank 0's row and column groups.
	const q = 2
	rows, cols := grid(t, q)
	ls := newLinear2Ds(t, rows, cols, in, out, make([]float32, in*out), make([]float32, out))
	x := randn(rng, b*in, 1)
	err := each(q*q, func(ctx context.Context, r int) error {
		y, err := ls[r].Forward(ctx, block(x, b, in, q, r/q, r%q), b)
		if err != nil {
			return err
		}
		_, err = ls[r].Backward(ctx, y)
		bi, oj := int64(b/q), int64(out/q)
		expect("2D row", r, rows[r].Counts(), tensorpar.Counts{BroadcastOps: 2 * q, BroadcastValues: 2 * bi * in, AllReduceOps: q, AllReduceValues: bi * in})
		expect("2D column", r, cols[r].Counts(), tensorpar.Counts{BroadcastOps: 2 * q, BroadcastValues: 2 * oj * in, AllReduceOps: q + 1, AllReduceValues: oj*in + oj})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	shape := fmt.Sprintf("b=%d, %d→%d, grid %d×%d", b, in, out, q, q)
	bi, oj := b/q, out/q
	row("tensor (2D): Linear, row group", q*q, shape, counts(rows[0].Counts()),
		fmt.Sprintf("q broadcasts of X blocks forward and q backward, 2·b_i·In: %d, 2·%d·%d; q all-reduces of dX blocks, b_i·In: %d, %d·%d", 2*q, bi, in, q, bi, in))
	row("tensor (2D): Linear, column group", q*q, shape, counts(cols[0].Counts()),
		fmt.Sprintf("q broadcasts of W blocks forward and q backward, 2·Out_j·In: %d, 2·%d·%d; q all-reduces of dW blocks + 1 of db, Out_j·In + Out_j: %d, %d·%d + %d", 2*q, oj, in, q+1, oj, in, oj))
}
