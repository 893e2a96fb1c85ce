package tensorpar

import (
	"context"

	"github.com/gradsync/gradsync/internal/kernels"
)

// rowParallel is the row-parallel half of a Megatron pair (g in the
// paper): a Linear In→Out of which this rank holds K input columns of the
// weight, W (Out, K), and the whole bias B (Out). Its input x (rows, K) is
// this rank's slice of the layer's input; the partial outputs x·Wᵀ are
// summed by one all-reduce and the bias is added once, after it. The
// views are bound by the owning layer.
type rowParallel struct {
	K, Out       int
	W, DW, B, DB []float32
	x            []float32 // borrowed input of the last forward (rows, K)
	rows         int
	y, dx        []float32 // owned
}

// forward returns y (rows, Out), the same on every rank of g, owned and
// valid until the next forward; x is borrowed until backward.
func (l *rowParallel) forward(ctx context.Context, g Group, x []float32, rows int) ([]float32, error) {
	l.x, l.rows = x, rows
	l.y = grow(l.y, rows*l.Out)
	beta := float32(0)
	one := g.Size() == 1
	if one {
		// One rank: the all-reduce is the identity, so the bias goes in
		// first, exactly as models.Linear does (bit-identical to the
		// unsharded layer whatever the GEMM's blocking).
		for i := range rows {
			copy(l.y[i*l.Out:(i+1)*l.Out], l.B)
		}
		beta = 1
	}
	kernels.Gemm(false, true, rows, l.Out, l.K, 1, x, l.K, l.W, l.K, beta, l.y, l.Out)
	if err := g.AllReduce(ctx, l.y, Sum); err != nil {
		return nil, err
	}
	if !one {
		for i := range rows {
			row := l.y[i*l.Out : (i+1)*l.Out]
			for j, b := range l.B {
				row[j] += b
			}
		}
	}
	return l.y, nil
}

// backward adds dW += dyᵀ·x and dB += Σ dy for dy (rows, Out), the same
// on every rank, and returns this rank's dx = dy·W (rows, K): no
// communication (g is the identity backward). dx is owned, valid until
// the next backward.
func (l *rowParallel) backward(dy []float32) []float32 {
	for i := range l.rows {
		for j, v := range dy[i*l.Out : (i+1)*l.Out] {
			l.DB[j] += v
		}
	}
	kernels.Gemm(true, false, l.Out, l.K, l.rows, 1, dy, l.Out, l.x, l.K, 1, l.DW, l.K)
	l.dx = grow(l.dx, l.rows*l.K)
	kernels.Gemm(false, false, l.rows, l.K, l.Out, 1, dy, l.Out, l.W, l.K, 0, l.dx, l.K)
	return l.dx
}
