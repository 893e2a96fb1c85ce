package tensorpar

import (
	"context"
	"errors"
	"fmt"

	"github.com/gradsync/gradsync/internal/kernels"
)

// Linear2D is one rank's block of a Linear(In → Out), y = x·Wᵀ + b, split
// over a q×q grid of ranks as in Optimus (Xu et al. 2021), whose matrix
// products are SUMMA's (van de Geijn and Watts 1997). The rank at grid
// row i and column j holds
//
//   - the weight block of output features Span(Out, q, j) and input
//     features Span(In, q, i): W (Out_j, In_i), PyTorch's layout;
//   - the bias block Span(Out, q, j), replicated down grid column j (its
//     gradient is all-reduced over the column, so the copies stay equal);
//   - the input block X_ij: batch rows Span(b, q, i), input features
//     Span(In, q, j); and the output block Y_ij: the same batch rows,
//     output features Span(Out, q, j) — the input's layout, so 2D layers
//     chain without re-partitioning.
//
// Every parameter, activation and gradient block is 1/q² of the whole
// (bias: 1/q), and no rank holds more than one remote block at a time.
// SetFromFull and CopyGradsTo move blocks from and to the whole layer's
// tensors in PyTorch's layout; GatherParams (gather.go) assembles them
// on every rank over the grid.
//
// Communication per step, over the row group (q ranks: grid row i) and
// the column group (grid column j), in values passed in per rank:
//
//	forward   q row broadcasts of X_it (Σ_t b_i·In_t = b_i·In)
//	          q column broadcasts of W_tj (Σ_t Out_j·In_t = Out_j·In)
//	backward  q column broadcasts of W_kj (Out_j·In), each followed by a
//	          row all-reduce of dY_ij·W_kj (Σ b_i·In_k = b_i·In), whose
//	          sum is dX_ik, kept by the rank of column k;
//	          q row broadcasts of X_ik (b_i·In), each followed by a column
//	          all-reduce of dY_ijᵀ·X_ik (Out_j·In), whose sum is the weight
//	          gradient of block (k, j), kept by the rank of row k;
//	          1 column all-reduce of the bias gradient (Out_j).
//
// SUMMA's reductions go to one root; Group has no Reduce, so they are
// all-reduces whose result only the root keeps (a ring reduce would move
// about half the values). Backward broadcasts X and W again rather than
// keeping forward's copies: memory of one block, as Optimus chooses.
type Linear2D struct {
	In, Out, Q int
	I, J       int // grid row and column

	// This rank's parameter blocks, its own buffers: W and DW are
	// (Out_j, In_i), B and DB are Out_j.
	W, DW, B, DB []float32

	row, col Group

	batch, rows int       // global batch and b_i of the last Forward
	x           []float32 // borrowed input block of the last Forward (b_i, In_j)
	y, dx       []float32 // owned, valid until the next Forward / Backward
	xt, wt, d   []float32 // scratch: a received X block, W block, weight-gradient block
}

// NewLinear2D returns this rank's block of a Linear(in → out) over the
// grid whose row and column groups are row (rank j of q: the ranks of
// this grid row, by column) and col (rank i of q). Both must have q ≥ 1
// ranks with q ≤ In and q ≤ Out. A shape handshake checks, with one Max
// all-reduce of 8 values on each group, that the row's ranks agree on q,
// In, Out and their grid row, and the column's on q, In, Out and their
// grid column. The parameters are zero; copy them in with SetFromFull.
func NewLinear2D(ctx context.Context, row, col Group, in, out int) (*Linear2D, error) {
	q := row.Size()
	if col.Size() != q {
		return nil, fmt.Errorf("tensorpar: 2D grid with a row group of %d ranks and a column group of %d (want q×q)", q, col.Size())
	}
	if in < q || out < q || in > maxExact || out > maxExact {
		return nil, fmt.Errorf("tensorpar: Linear2D In %d, Out %d on a %d×%d grid: want q ≤ each ≤ 2²⁴", in, out, q, q)
	}
	i, j := col.Rank(), row.Rank()
	if err := agree(ctx, row, "Linear2D row", []string{"q", "In", "Out", "grid row"}, q, in, out, i); err != nil {
		return nil, err
	}
	if err := agree(ctx, col, "Linear2D column", []string{"q", "In", "Out", "grid column"}, q, in, out, j); err != nil {
		return nil, err
	}
	ilo, ihi := Span(in, q, i)
	olo, ohi := Span(out, q, j)
	nw, nb := (ohi-olo)*(ihi-ilo), ohi-olo
	return &Linear2D{In: in, Out: out, Q: q, I: i, J: j,
		W: make([]float32, nw), DW: make([]float32, nw), B: make([]float32, nb), DB: make([]float32, nb),
		row: row, col: col}, nil
}

// SetFromFull copies this rank's blocks out of a whole layer's weight
// (Out, In) and bias (Out).
func (l *Linear2D) SetFromFull(w, b []float32) error {
	if len(w) != l.Out*l.In || len(b) != l.Out {
		return fmt.Errorf("tensorpar: Linear2D.SetFromFull: %d weights and %d biases, want %d×%d and %d", len(w), len(b), l.Out, l.In, l.Out)
	}
	ilo, ihi := Span(l.In, l.Q, l.I)
	olo, ohi := Span(l.Out, l.Q, l.J)
	k := ihi - ilo
	for o := olo; o < ohi; o++ {
		copy(l.W[(o-olo)*k:(o-olo+1)*k], w[o*l.In+ilo:o*l.In+ihi])
	}
	copy(l.B, b[olo:ohi])
	return nil
}

// CopyGradsTo writes this rank's gradient blocks into a whole layer's
// weight gradient (Out, In) and bias gradient (Out); together the q²
// ranks fill them (each bias block q times, with equal values).
func (l *Linear2D) CopyGradsTo(dw, db []float32) error {
	if len(dw) != l.Out*l.In || len(db) != l.Out {
		return fmt.Errorf("tensorpar: Linear2D.CopyGradsTo: %d weights and %d biases, want %d×%d and %d", len(dw), len(db), l.Out, l.In, l.Out)
	}
	ilo, ihi := Span(l.In, l.Q, l.I)
	olo, ohi := Span(l.Out, l.Q, l.J)
	k := ihi - ilo
	for o := olo; o < ohi; o++ {
		copy(dw[o*l.In+ilo:o*l.In+ihi], l.DW[(o-olo)*k:(o-olo+1)*k])
	}
	copy(db[olo:ohi], l.DB)
	return nil
}

// Forward returns this rank's output block Y_ij (b_i, Out_j) for its input
// block x = X_ij (b_i, In_j), b the whole batch (every rank passes the
// same; b ≥ q). x is borrowed until Backward; y is owned, valid until the
// next Forward.
func (l *Linear2D) Forward(ctx context.Context, x []float32, batch int) ([]float32, error) {
	l.batch = 0
	q := l.Q
	if batch < q || batch > maxExact {
		return nil, fmt.Errorf("tensorpar: Linear2D.Forward: batch %d on a %d×%d grid: want q ≤ batch ≤ 2²⁴", batch, q, q)
	}
	blo, bhi := Span(batch, q, l.I)
	rows := bhi - blo
	jlo, jhi := Span(l.In, q, l.J)
	if len(x) != rows*(jhi-jlo) {
		return nil, fmt.Errorf("tensorpar: Linear2D.Forward: len(x) = %d, want batch rows %d × input features %d", len(x), rows, jhi-jlo)
	}
	olo, ohi := Span(l.Out, q, l.J)
	no := ohi - olo
	l.y = grow(l.y, rows*no)
	// The bias first, then the products accumulate: at q = 1 exactly
	// models.Linear's order.
	for r := range rows {
		copy(l.y[r*no:(r+1)*no], l.B)
	}
	for t := range q {
		tlo, thi := Span(l.In, q, t)
		nt := thi - tlo
		xt, wt := x, l.W // the roots send their own blocks
		if l.J != t {
			l.xt = grow(l.xt, rows*nt)
			xt = l.xt
		}
		if err := l.row.Broadcast(ctx, xt, t); err != nil {
			return nil, err
		}
		if l.I != t {
			l.wt = grow(l.wt, no*nt)
			wt = l.wt
		}
		if err := l.col.Broadcast(ctx, wt, t); err != nil {
			return nil, err
		}
		kernels.Gemm(false, true, rows, no, nt, 1, xt, nt, wt, nt, 1, l.y, no)
	}
	l.x, l.batch, l.rows = x, batch, rows
	return l.y, nil
}

var errNoForward2D = errors.New("tensorpar: Linear2D.Backward without a successful Forward")

// Backward adds this rank's parameter gradients for dy = dY_ij (b_i,
// Out_j), the gradient of the last Forward's output block, and returns
// the input block's gradient dX_ij (b_i, In_j), owned, valid until the
// next Backward.
func (l *Linear2D) Backward(ctx context.Context, dy []float32) ([]float32, error) {
	if l.batch == 0 {
		return nil, errNoForward2D
	}
	q, rows := l.Q, l.rows
	olo, ohi := Span(l.Out, q, l.J)
	no := ohi - olo
	if len(dy) != rows*no {
		return nil, fmt.Errorf("tensorpar: Linear2D.Backward: len(dy) = %d, want batch rows %d × output features %d", len(dy), rows, no)
	}
	// dX_ik = Σ_j dY_ij·W_kj: W_kj down the column from row k, the
	// products summed along the row; column k keeps the sum.
	jlo, jhi := Span(l.In, q, l.J)
	l.dx = grow(l.dx, rows*(jhi-jlo))
	for k := range q {
		klo, khi := Span(l.In, q, k)
		nk := khi - klo
		wk := l.W
		if l.I != k {
			l.wt = grow(l.wt, no*nk)
			wk = l.wt
		}
		if err := l.col.Broadcast(ctx, wk, k); err != nil {
			return nil, err
		}
		c := l.dx // column k's rank sums straight into its dX block
		if l.J != k {
			l.xt = grow(l.xt, rows*nk)
			c = l.xt
		}
		kernels.Gemm(false, false, rows, nk, no, 1, dy, no, wk, nk, 0, c, nk)
		if err := l.row.AllReduce(ctx, c, Sum); err != nil {
			return nil, err
		}
	}
	// dW_kj = Σ_i dY_ijᵀ·X_ik: X_ik along the row from column k, the
	// products summed down the column; row k keeps the sum.
	for k := range q {
		klo, khi := Span(l.In, q, k)
		nk := khi - klo
		xk := l.x
		if l.J != k {
			l.xt = grow(l.xt, rows*nk)
			xk = l.xt
		}
		if err := l.row.Broadcast(ctx, xk, k); err != nil {
			return nil, err
		}
		l.d = grow(l.d, no*nk)
		kernels.Gemm(true, false, no, nk, rows, 1, dy, no, xk, nk, 0, l.d, nk)
		if err := l.col.AllReduce(ctx, l.d, Sum); err != nil {
			return nil, err
		}
		if l.I == k {
			for n, v := range l.d {
				l.DW[n] += v
			}
		}
	}
	// The bias block is replicated down the column: its gradient is the
	// column's sum.
	l.d = grow(l.d, no)
	clear(l.d)
	for r := range rows {
		for o, v := range dy[r*no : (r+1)*no] {
			l.d[o] += v
		}
	}
	if err := l.col.AllReduce(ctx, l.d, Sum); err != nil {
		return nil, err
	}
	for o, v := range l.d {
		l.DB[o] += v
	}
	return l.dx, nil
}
