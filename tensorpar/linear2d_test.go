package tensorpar_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/models/modeltest"
	"github.com/gradsync/gradsync/tensorpar"
)

// grid returns, for each rank r = i·q + j of a q×q grid, its row group
// (grid row i, rank j) and column group (grid column j, rank i), each a
// counting group over its own in-memory ring with its own id.
func grid(t testing.TB, q int) (rows, cols []*tensorpar.Counting) {
	t.Helper()
	rg, cg := gridGroups(t, q, nil)
	rows, cols = make([]*tensorpar.Counting, q*q), make([]*tensorpar.Counting, q*q)
	for r := range q * q {
		rows[r], cols[r] = &tensorpar.Counting{Group: rg[r]}, &tensorpar.Counting{Group: cg[r]}
	}
	return rows, cols
}

// gridGroups returns the row and column groups of grid's ranks: ring
// groups with ids 100+i (row i) and 200+j (column j), except that col,
// if not nil, makes rank r's column group over its ring and id.
func gridGroups(t testing.TB, q int, col func(r aggregator.Ring, id uint32, rank int) tensorpar.Group) (rows, cols []tensorpar.Group) {
	t.Helper()
	mk := func(r aggregator.Ring, id uint32, _ int) tensorpar.Group {
		g, err := tensorpar.NewRingGroup(r, id, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	if col == nil {
		col = mk
	}
	rows, cols = make([]tensorpar.Group, q*q), make([]tensorpar.Group, q*q)
	for line := range q {
		rr, cr := aggregator.NewMemRing(q, 4), aggregator.NewMemRing(q, 4)
		t.Cleanup(func() {
			for n := range q {
				rr[n].(*aggregator.MemRing).Close()
				cr[n].(*aggregator.MemRing).Close()
			}
		})
		for n := range q {
			rows[line*q+n] = mk(rr[n], uint32(100+line), line*q+n)  // row line, column n
			cols[n*q+line] = col(cr[n], uint32(200+line), n*q+line) // column line, row n
		}
	}
	return rows, cols
}

// block copies the (rows Span(n, q, i), columns Span(m, q, j)) block out
// of a (n, m) row-major matrix.
func block(a []float32, n, m, q, i, j int) []float32 {
	rlo, rhi := tensorpar.Span(n, q, i)
	clo, chi := tensorpar.Span(m, q, j)
	out := make([]float32, 0, (rhi-rlo)*(chi-clo))
	for r := rlo; r < rhi; r++ {
		out = append(out, a[r*m+clo:r*m+chi]...)
	}
	return out
}

// unblock copies a block back into its place in a (n, m) matrix.
func unblock(a, b []float32, n, m, q, i, j int) {
	rlo, rhi := tensorpar.Span(n, q, i)
	clo, chi := tensorpar.Span(m, q, j)
	for r := rlo; r < rhi; r++ {
		copy(a[r*m+clo:r*m+chi], b[(r-rlo)*(chi-clo):(r-rlo+1)*(chi-clo)])
	}
}

// newLinear2Ds builds every rank's block of the layer (w, b) over the grid,
// checks the handshake's communication (one Max all-reduce of 8 values
// on each group) and zeroes the counts.
func newLinear2Ds(t testing.TB, rows, cols []*tensorpar.Counting, in, out int, w, b []float32) []*tensorpar.Linear2D {
	t.Helper()
	ls := make([]*tensorpar.Linear2D, len(rows))
	err := each(len(rows), func(ctx context.Context, r int) error {
		l, err := tensorpar.NewLinear2D(ctx, rows[r], cols[r], in, out)
		if err != nil {
			return err
		}
		ls[r] = l
		return l.SetFromFull(w, b)
	})
	if err != nil {
		t.Fatal(err)
	}
	for r := range rows {
		for _, g := range []*tensorpar.Counting{rows[r], cols[r]} {
			if got, want := g.Counts(), (tensorpar.Counts{AllReduceOps: 1, AllReduceValues: 8}); got != want {
				t.Errorf("rank %d: handshake counts %+v, want %+v", r, got, want)
			}
			g.Reset()
		}
	}
	return ls
}

// closeTo reports the largest difference of got from want relative to
// want's largest entry, and fails if it exceeds tol.
func closeTo(t *testing.T, name string, got, want []float32, tol float64) float64 {
	t.Helper()
	var top, worst float64
	for _, v := range want {
		top = math.Max(top, math.Abs(float64(v)))
	}
	for i := range want {
		worst = math.Max(worst, math.Abs(float64(got[i])-float64(want[i])))
	}
	rel := worst / math.Max(top, 1e-30)
	if rel > tol {
		t.Errorf("%s: largest difference %.3g of largest entry %.3g (%.3g relative), want ≤ %g", name, worst, top, rel, tol)
	}
	return rel
}

// TestLinear2DMatchesUnsharded checks the output, the input gradient and
// both parameter gradients of the 2D layer against models.Linear, for q
// = 1, 2 (4 ranks) and 3 (9 ranks) and shapes q does not divide: within
// 1e-5 (output) and 1e-4 (gradients) of each tensor's largest entry (bit
// for bit at q = 1); and each group's communication against the formula.
func TestLinear2DMatchesUnsharded(t *testing.T) {
	type c2 struct{ q, in, out, batch int }
	// In 1030: past OpenBLAS's 512-deep K blocks.
	for ci, c := range []c2{{1, 5, 3, 4}, {1, 1030, 9, 6}, {2, 6, 4, 4}, {2, 7, 5, 5}, {2, 1030, 9, 7}, {2, 2, 3, 2}, {3, 10, 8, 7}} {
		t.Run(fmt.Sprintf("q%d_in%d_out%d_b%d", c.q, c.in, c.out, c.batch), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(ci), 31))
			ref := models.NewLinear(c.in, c.out)
			ref.W, ref.B = randn(rng, c.out*c.in, 1/math.Sqrt(float64(c.in))), randn(rng, c.out, 0.5)
			ref.DW, ref.DB = make([]float32, len(ref.W)), make([]float32, len(ref.B))
			x := randn(rng, c.batch*c.in, 1)
			dy := randn(rng, c.batch*c.out, 1)
			wantY := append([]float32(nil), ref.Forward(x, c.batch, true)...)
			wantDx := ref.Backward(dy)

			q := c.q
			rows, cols := grid(t, q)
			ls := newLinear2Ds(t, rows, cols, c.in, c.out, ref.W, ref.B)
			y, dx := make([]float32, len(wantY)), make([]float32, len(wantDx))
			dw, db := make([]float32, len(ref.DW)), make([]float32, len(ref.DB))
			var mu sync.Mutex
			err := each(q*q, func(ctx context.Context, r int) error {
				l, i, j := ls[r], r/q, r%q
				if l.I != i || l.J != j {
					return fmt.Errorf("rank %d at grid (%d, %d), want (%d, %d)", r, l.I, l.J, i, j)
				}
				yb, err := l.Forward(ctx, block(x, c.batch, c.in, q, i, j), c.batch)
				if err != nil {
					return err
				}
				dxb, err := l.Backward(ctx, block(dy, c.batch, c.out, q, i, j))
				if err != nil {
					return err
				}
				mu.Lock()
				defer mu.Unlock()
				unblock(y, yb, c.batch, c.out, q, i, j)
				unblock(dx, dxb, c.batch, c.in, q, i, j)
				return l.CopyGradsTo(dw, db)
			})
			if err != nil {
				t.Fatal(err)
			}
			tol := func(v float64) float64 {
				if q == 1 {
					return 0
				}
				return v
			}
			ry := closeTo(t, "y", y, wantY, tol(1e-5))
			rdx := closeTo(t, "dx", dx, wantDx, tol(1e-4))
			rdw := closeTo(t, "dW", dw, ref.DW, tol(1e-4))
			rdb := closeTo(t, "db", db, ref.DB, tol(1e-4))
			// The formula of Linear2D's doc, per rank and group.
			for r := range q * q {
				i, j := r/q, r%q
				blo, bhi := tensorpar.Span(c.batch, q, i)
				olo, ohi := tensorpar.Span(c.out, q, j)
				bi, oj, q64 := int64(bhi-blo), int64(ohi-olo), int64(q)
				in := int64(c.in)
				wantRow := tensorpar.Counts{BroadcastOps: 2 * q64, BroadcastValues: 2 * bi * in, AllReduceOps: q64, AllReduceValues: bi * in}
				wantCol := tensorpar.Counts{BroadcastOps: 2 * q64, BroadcastValues: 2 * oj * in, AllReduceOps: q64 + 1, AllReduceValues: oj*in + oj}
				if got := rows[r].Counts(); got != wantRow {
					t.Errorf("rank %d row group: counts %+v, want %+v", r, got, wantRow)
				}
				if got := cols[r].Counts(); got != wantCol {
					t.Errorf("rank %d column group: counts %+v, want %+v", r, got, wantCol)
				}
			}
			t.Logf("largest differences relative to the largest entry: y %.3g, dx %.3g, dW %.3g, db %.3g; rank 0 row %+v, column %+v",
				ry, rdx, rdw, rdb, rows[0].Counts(), cols[0].Counts())
		})
	}
}

// TestLinear2DChain: two 2D layers chain on the grid (the output blocks
// are the next input blocks) and match two models.Linear in sequence.
func TestLinear2DChain(t *testing.T) {
	const q, in, hid, out, batch = 2, 5, 7, 3, 6
	rng := rand.New(rand.NewPCG(8, 9))
	ref1, ref2 := models.NewLinear(in, hid), models.NewLinear(hid, out)
	for _, l := range []*models.Linear{ref1, ref2} {
		l.W, l.B = randn(rng, l.Out*l.In, 1), randn(rng, l.Out, 1)
		l.DW, l.DB = make([]float32, len(l.W)), make([]float32, len(l.B))
	}
	x, dy := randn(rng, batch*in, 1), randn(rng, batch*out, 1)
	wantY := append([]float32(nil), ref2.Forward(ref1.Forward(x, batch, true), batch, true)...)
	wantDx := ref1.Backward(ref2.Backward(dy))
	rows, cols := grid(t, q)
	l1 := newLinear2Ds(t, rows, cols, in, hid, ref1.W, ref1.B)
	l2 := newLinear2Ds(t, rows, cols, hid, out, ref2.W, ref2.B)
	y, dx := make([]float32, len(wantY)), make([]float32, len(wantDx))
	dw1, db1 := make([]float32, len(ref1.W)), make([]float32, len(ref1.B))
	dw2, db2 := make([]float32, len(ref2.W)), make([]float32, len(ref2.B))
	var mu sync.Mutex
	err := each(q*q, func(ctx context.Context, r int) error {
		i, j := r/q, r%q
		h, err := l1[r].Forward(ctx, block(x, batch, in, q, i, j), batch)
		if err != nil {
			return err
		}
		yb, err := l2[r].Forward(ctx, h, batch)
		if err != nil {
			return err
		}
		dh, err := l2[r].Backward(ctx, block(dy, batch, out, q, i, j))
		if err != nil {
			return err
		}
		dxb, err := l1[r].Backward(ctx, dh)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		unblock(y, yb, batch, out, q, i, j)
		unblock(dx, dxb, batch, in, q, i, j)
		if err := l1[r].CopyGradsTo(dw1, db1); err != nil {
			return err
		}
		return l2[r].CopyGradsTo(dw2, db2)
	})
	if err != nil {
		t.Fatal(err)
	}
	closeTo(t, "y", y, wantY, 1e-5)
	closeTo(t, "dx", dx, wantDx, 1e-4)
	closeTo(t, "dW1", dw1, ref1.DW, 1e-4)
	closeTo(t, "db1", db1, ref1.DB, 1e-4)
	closeTo(t, "dW2", dw2, ref2.DW, 1e-4)
	closeTo(t, "db2", db2, ref2.DB, 1e-4)
}

// TestLinear2DFiniteDifference checks the gradients of L = Σ ρ·y (ρ a fixed
// random tensor) with respect to every rank's input, weight and bias
// blocks by central differences on a 2×2 grid with uneven blocks.
func TestLinear2DFiniteDifference(t *testing.T) {
	const q, in, out, batch = 2, 5, 3, 3
	rng := rand.New(rand.NewPCG(10, 11))
	w, b := randn(rng, out*in, 1), randn(rng, out, 1)
	rows, cols := grid(t, q)
	ls := newLinear2Ds(t, rows, cols, in, out, w, b)
	x := randn(rng, batch*in, 1)
	rho := randn(rng, batch*out, 1)
	xs, rhos := make([][]float32, q*q), make([][]float32, q*q)
	for r := range q * q {
		xs[r], rhos[r] = block(x, batch, in, q, r/q, r%q), block(rho, batch, out, q, r/q, r%q)
	}
	dxs := make([][]float32, q*q)
	step := func(backward bool) float64 {
		var mu sync.Mutex
		var loss float64
		err := each(q*q, func(ctx context.Context, r int) error {
			y, err := ls[r].Forward(ctx, xs[r], batch)
			if err != nil {
				return err
			}
			var s float64
			for n, v := range y {
				s += float64(rhos[r][n]) * float64(v)
			}
			mu.Lock()
			loss += s
			mu.Unlock()
			if backward {
				clear(ls[r].DW)
				clear(ls[r].DB)
				dx, err := ls[r].Backward(ctx, rhos[r])
				dxs[r] = append([]float32(nil), dx...)
				return err
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return loss
	}
	step(true)
	f := func() float64 { return step(false) }
	for r, l := range ls {
		modeltest.CheckGrad(t, fmt.Sprintf("x%d", r), f, xs[r], dxs[r], modeltest.Config{MaxChecks: -1})
		// The bias is replicated down a column: the loss's gradient with
		// respect to one copy is its own rows' share, so check the weight
		// only, and the bias through the sum over the column below.
		modeltest.CheckGrad(t, fmt.Sprintf("W%d", r), f, l.W, append([]float32(nil), l.DW...), modeltest.Config{MaxChecks: -1})
	}
	// Perturbing bias entry o of column j in every copy at once moves the
	// loss by Σ_rows ρ — the all-reduced DB each copy holds.
	for j := range q {
		for o := range ls[j].B {
			db := float64(ls[j].DB[o])
			const h = 1e-2
			set := func(d float32) {
				for i := range q {
					ls[i*q+j].B[o] += d
				}
			}
			set(h)
			up := f()
			set(-2 * h)
			down := f()
			set(h)
			if fd := (up - down) / (2 * h); math.Abs(fd-db) > 1e-3+1e-2*math.Abs(fd) {
				t.Errorf("bias column %d entry %d: gradient %g, finite difference %g", j, o, db, fd)
			}
		}
	}
}

// TestLinear2DRefusals: bad grids, shapes and calls are errors, never a
// crash or a hang.
func TestLinear2DRefusals(t *testing.T) {
	ctx := context.Background()
	one := groups(t, 1)[0]
	two := groups(t, 2)
	if _, err := tensorpar.NewLinear2D(ctx, one, two[0], 4, 4); err == nil || !strings.Contains(err.Error(), "q×q") {
		t.Errorf("row of 1 and column of 2: %v", err)
	}
	rows, cols := grid(t, 2)
	err := each(4, func(ctx context.Context, r int) error {
		_, err := tensorpar.NewLinear2D(ctx, rows[r], cols[r], 1, 4)
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "q ≤ each") {
		t.Errorf("In 1 on a 2×2 grid: %v", err)
	}
	// Ranks that disagree on Out fail the handshake on every rank.
	errs := make([]error, 4)
	_ = each(4, func(ctx context.Context, r int) error {
		_, errs[r] = tensorpar.NewLinear2D(ctx, rows[r], cols[r], 4, 4+r%2)
		return nil
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "disagree") {
			t.Errorf("rank %d with mismatched Out: %v", r, err)
		}
	}
	l, err := tensorpar.NewLinear2D(ctx, one, one, 3, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Backward(ctx, make([]float32, 2)); err == nil {
		t.Error("Backward before Forward accepted")
	}
	if _, err := l.Forward(ctx, make([]float32, 5), 2); err == nil {
		t.Error("len(x) 5 for batch 2 × In 3 accepted")
	}
	if _, err := l.Forward(ctx, nil, 0); err == nil {
		t.Error("batch 0 accepted")
	}
	if err := l.SetFromFull(make([]float32, 5), make([]float32, 2)); err == nil {
		t.Error("SetFromFull with 5 weights accepted")
	}
	if _, err := l.Forward(ctx, make([]float32, 6), 2); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Backward(ctx, make([]float32, 3)); err == nil {
		t.Error("len(dy) 3 for batch 2 × Out 2 accepted")
	}
}

// TestLinear2DWrongGroupRefused: on a 2×2 grid, a rank whose column group
// is another group's fails the handshake, and a rank whose Forward reaches
// another column group's frames gets ErrUnexpectedFrame on some rank, no
// output with an error, and nothing hangs (each cancels the others).
func TestLinear2DWrongGroupRefused(t *testing.T) {
	const q = 2
	mk := func(r aggregator.Ring, id uint32) tensorpar.Group {
		g, err := tensorpar.NewRingGroup(r, id, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	build := func(col3 func(r aggregator.Ring, id uint32) tensorpar.Group) (rows, cols []tensorpar.Group) {
		return gridGroups(t, q, func(r aggregator.Ring, id uint32, rank int) tensorpar.Group {
			if rank == q*q-1 {
				return col3(r, id)
			}
			return mk(r, id)
		})
	}
	// Rank 3's column group carries another id from the start.
	rows, cols := build(func(r aggregator.Ring, id uint32) tensorpar.Group { return mk(r, id+50) })
	err := each(q*q, func(ctx context.Context, r int) error {
		_, err := tensorpar.NewLinear2D(ctx, rows[r], cols[r], 4, 4)
		return err
	})
	if !errors.Is(err, aggregator.ErrUnexpectedFrame) {
		t.Fatalf("NewLinear2D with a foreign column group: %v, want an ErrUnexpectedFrame", err)
	}
	// Rank 3's column group switches to another id after the handshake.
	rows, cols = build(func(r aggregator.Ring, id uint32) tensorpar.Group {
		return &switching{first: mk(r, id), then: mk(r, id+50)}
	})
	ls := make([]*tensorpar.Linear2D, q*q)
	if err := each(q*q, func(ctx context.Context, r int) error {
		var err error
		ls[r], err = tensorpar.NewLinear2D(ctx, rows[r], cols[r], 4, 4)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ys := make([][]float32, q*q)
	errs := make([]error, q*q)
	_ = each(q*q, func(ctx context.Context, r int) error {
		ys[r], errs[r] = ls[r].Forward(ctx, make([]float32, 4), 4)
		return errs[r]
	})
	found := false
	for r, err := range errs {
		found = found || errors.Is(err, aggregator.ErrUnexpectedFrame)
		if err != nil && ys[r] != nil {
			t.Errorf("rank %d returned an output with its error", r)
		}
	}
	if !found {
		t.Fatalf("errors %v, want an ErrUnexpectedFrame", errs)
	}
}

// TestLinear2DGatherParams: every rank of the grid gathers the whole
// weight and bias (and their gradients) bit for bit, with one all-gather
// on each group of the formula's length.
func TestLinear2DGatherParams(t *testing.T) {
	for _, c := range []struct{ q, in, out, batch int }{{1, 3, 2, 2}, {2, 7, 5, 4}, {3, 10, 8, 6}} {
		t.Run(fmt.Sprintf("q%d_in%d_out%d", c.q, c.in, c.out), func(t *testing.T) {
			q := c.q
			rng := rand.New(rand.NewPCG(uint64(q), 3))
			w, b := randn(rng, c.out*c.in, 1), randn(rng, c.out, 1)
			x, dy := randn(rng, c.batch*c.in, 1), randn(rng, c.batch*c.out, 1)
			rows, cols := grid(t, q)
			ls := newLinear2Ds(t, rows, cols, c.in, c.out, w, b)
			dw, db := make([]float32, len(w)), make([]float32, len(b))
			var mu sync.Mutex
			if err := each(q*q, func(ctx context.Context, r int) error {
				if _, err := ls[r].Forward(ctx, block(x, c.batch, c.in, q, r/q, r%q), c.batch); err != nil {
					return err
				}
				if _, err := ls[r].Backward(ctx, block(dy, c.batch, c.out, q, r/q, r%q)); err != nil {
					return err
				}
				mu.Lock()
				defer mu.Unlock()
				return ls[r].CopyGradsTo(dw, db)
			}); err != nil {
				t.Fatal(err)
			}
			maxIn, maxOut := 0, 0
			for i := range q {
				lo, hi := tensorpar.Span(c.in, q, i)
				maxIn = max(maxIn, hi-lo)
				lo, hi = tensorpar.Span(c.out, q, i)
				maxOut = max(maxOut, hi-lo)
			}
			err := each(q*q, func(ctx context.Context, r int) error {
				rows[r].Reset()
				cols[r].Reset()
				gw, gb, err := ls[r].GatherParams(ctx, false)
				if err != nil {
					return err
				}
				if !slicesBitEqual(gw, w) || !slicesBitEqual(gb, b) {
					t.Errorf("rank %d: gathered parameters differ from the whole layer's", r)
				}
				olo, ohi := tensorpar.Span(c.out, q, r%q)
				wantCol := tensorpar.Counts{AllGatherOps: 1, AllGatherValues: int64((ohi - olo) * maxIn)}
				wantRow := tensorpar.Counts{AllGatherOps: 1, AllGatherValues: int64(maxOut * (c.in + 1))}
				if got := cols[r].Counts(); got != wantCol {
					t.Errorf("rank %d column group: counts %+v, want %+v", r, got, wantCol)
				}
				if got := rows[r].Counts(); got != wantRow {
					t.Errorf("rank %d row group: counts %+v, want %+v", r, got, wantRow)
				}
				gw, gb, err = ls[r].GatherParams(ctx, true)
				if err != nil {
					return err
				}
				if !slicesBitEqual(gw, dw) || !slicesBitEqual(gb, db) {
					t.Errorf("rank %d: gathered gradients differ from the blocks'", r)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
