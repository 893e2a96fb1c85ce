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
	"time"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/models/modeltest"
	"github.com/gradsync/gradsync/tensorpar"
)

// refMLP is the unsharded block from models' layers: fc1, GELU, fc2.
type refMLP struct {
	fc1, fc2 *models.Linear
	act      models.GELU
}

func newRefMLP(w tensorpar.MLPWeights, in, hidden, out int) *refMLP {
	r := &refMLP{fc1: models.NewLinear(in, hidden), fc2: models.NewLinear(hidden, out)}
	r.fc1.W, r.fc1.B = w.W1, w.B1
	r.fc2.W, r.fc2.B = w.W2, w.B2
	r.fc1.DW, r.fc1.DB = make([]float32, len(w.W1)), make([]float32, len(w.B1))
	r.fc2.DW, r.fc2.DB = make([]float32, len(w.W2)), make([]float32, len(w.B2))
	return r
}

func (r *refMLP) forward(x []float32, batch int) []float32 {
	return r.fc2.Forward(r.act.Forward(r.fc1.Forward(x, batch, true), batch, true), batch, true)
}

func (r *refMLP) backward(dy []float32) []float32 {
	return r.fc1.Backward(r.act.Backward(r.fc2.Backward(dy)))
}

func (r *refMLP) grads() tensorpar.MLPWeights {
	return tensorpar.MLPWeights{W1: r.fc1.DW, B1: r.fc1.DB, W2: r.fc2.DW, B2: r.fc2.DB}
}

func zeroWeights(in, hidden, out int) tensorpar.MLPWeights {
	return tensorpar.MLPWeights{W1: make([]float32, hidden*in), B1: make([]float32, hidden),
		W2: make([]float32, out*hidden), B2: make([]float32, out)}
}

// randWeights draws a block's weights with PyTorch-like scales (1/√fan-in),
// so that activations stay O(1) at every size.
func randWeights(rng *rand.Rand, in, hidden, out int) tensorpar.MLPWeights {
	return tensorpar.MLPWeights{
		W1: randn(rng, hidden*in, 1/math.Sqrt(float64(in))), B1: randn(rng, hidden, 0.5),
		W2: randn(rng, out*hidden, 1/math.Sqrt(float64(hidden))), B2: randn(rng, out, 0.5),
	}
}

// shards builds every rank's shard with mk over gs, checks that the
// construction communicated one Max all-reduce of handshake values (the
// shape handshake), then zeroes the counts.
func shards[T any](t testing.TB, gs []*tensorpar.Counting, handshake int64, mk func(ctx context.Context, g tensorpar.Group) (T, error)) []T {
	t.Helper()
	out := make([]T, len(gs))
	err := each(len(gs), func(ctx context.Context, r int) error {
		var err error
		out[r], err = mk(ctx, gs[r])
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for r, g := range gs {
		if got, want := g.Counts(), (tensorpar.Counts{AllReduceOps: 1, AllReduceValues: handshake}); got != want {
			t.Errorf("rank %d: construction counts %+v, want %+v", r, got, want)
		}
		g.Reset()
	}
	return out
}

// newMLPs builds every rank's shard of w over gs.
func newMLPs(t testing.TB, gs []*tensorpar.Counting, w tensorpar.MLPWeights, in, hidden, out int) []*tensorpar.MLP {
	t.Helper()
	return shards(t, gs, 6, func(ctx context.Context, g tensorpar.Group) (*tensorpar.MLP, error) {
		m, err := tensorpar.NewMLP(ctx, g, in, hidden, out)
		if err != nil {
			return nil, err
		}
		return m, m.SetFromFull(w)
	})
}

// TestMLPMatchesUnsharded checks the output, the input gradient and every
// parameter gradient of the sharded block against models' unsharded
// Linear→GELU→Linear, for L = 1..4 and hidden sizes that L does not
// divide: bit for bit at L = 1, and otherwise within 1e-5 relative
// (output) and 1e-4 relative (gradients), or 1e-6 absolute, entry by
// entry; and the communication of a step against its formula.
func TestMLPMatchesUnsharded(t *testing.T) {
	type mlpCase struct{ in, hidden, out, batch int }
	// 600 hidden units: past OpenBLAS's 512-deep K blocks, where adding
	// fc2's bias before or after the GEMM would round differently.
	sizes := []mlpCase{{5, 7, 3, 4}, {6, 10, 6, 3}, {9, 13, 11, 2}, {16, 600, 8, 5}}
	for ci, c := range sizes {
		for _, l := range []int{1, 2, 3, 4} {
			name := fmt.Sprintf("in%d_hidden%d_out%d_b%d_L%d", c.in, c.hidden, c.out, c.batch, l)
			t.Run(name, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(ci), uint64(l)))
				w := randWeights(rng, c.in, c.hidden, c.out)
				x := randn(rng, c.batch*c.in, 1)
				dy := randn(rng, c.batch*c.out, 1)
				ref := newRefMLP(w, c.in, c.hidden, c.out)
				wantY := ref.forward(x, c.batch)
				wantDx := ref.backward(dy)
				want := ref.grads()

				gs := groups(t, l)
				ms := newMLPs(t, gs, w, c.in, c.hidden, c.out)
				ys, dxs := make([][]float32, l), make([][]float32, l)
				err := each(l, func(ctx context.Context, r int) error {
					m := ms[r]
					if k := m.Hi - m.Lo; math.Abs(float64(k)-float64(c.hidden)/float64(l)) >= 1 {
						t.Errorf("rank %d holds %d hidden units of %d/%d", r, k, c.hidden, l)
					}
					y, err := m.Forward(ctx, x, c.batch)
					if err != nil {
						return err
					}
					ys[r] = append([]float32(nil), y...)
					fwd := tensorpar.Counts{AllReduceOps: 1, AllReduceValues: int64(c.batch * c.out)}
					if got := gs[r].Counts(); got != fwd {
						t.Errorf("rank %d: Forward counts %+v, want %+v", r, got, fwd)
					}
					dx, err := m.Backward(ctx, dy)
					if err != nil {
						return err
					}
					dxs[r] = dx
					step := tensorpar.Counts{AllReduceOps: 2, AllReduceValues: int64(c.batch*c.out + c.batch*c.in)}
					if got := gs[r].Counts(); got != step {
						t.Errorf("rank %d: Forward+Backward counts %+v, want %+v", r, got, step)
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				got := zeroWeights(c.in, c.hidden, c.out)
				for r, m := range ms {
					if err := m.CopyGradsTo(got); err != nil {
						t.Fatal(err)
					}
					if !slicesBitEqual(m.DB2, ms[0].DB2) {
						t.Errorf("rank %d: fc2.bias gradient differs from rank 0's", r)
					}
					if !slicesBitEqual(ys[r], ys[0]) || !slicesBitEqual(dxs[r], dxs[0]) {
						t.Errorf("rank %d: output or input gradient differs from rank 0's", r)
					}
				}
				// the sharded parameters unshard to the whole block's.
				back := zeroWeights(c.in, c.hidden, c.out)
				for _, m := range ms {
					if err := m.CopyParamsTo(back); err != nil {
						t.Fatal(err)
					}
				}
				var worstAbs float64
				compare := func(name string, got, want []float32, tol float64) float64 {
					if l == 1 {
						if !slicesBitEqual(got, want) {
							t.Errorf("%s: not bit-identical to the unsharded block at L=1", name)
						}
						return 0
					}
					var worst float64
					for i := range want {
						a, b := float64(got[i]), float64(want[i])
						e := relErr(a, b)
						worstAbs = math.Max(worstAbs, math.Abs(a-b))
						if math.Abs(b) >= 1e-3 {
							worst = math.Max(worst, e)
						}
						if e > tol && math.Abs(a-b) > 1e-6 {
							t.Errorf("%s[%d] = %g, want %g", name, i, a, b)
							return worst
						}
					}
					return worst
				}
				for _, p := range []struct {
					name      string
					got, want []float32
				}{{"W1", back.W1, w.W1}, {"B1", back.B1, w.B1}, {"W2", back.W2, w.W2}, {"B2", back.B2, w.B2}} {
					if !slicesBitEqual(p.got, p.want) {
						t.Errorf("unsharded %s differs from the original", p.name)
					}
				}
				worstY := compare("y", ys[0], wantY, 1e-5)
				worstG := math.Max(compare("dx", dxs[0], wantDx, 1e-4),
					math.Max(math.Max(compare("dW1", got.W1, want.W1, 1e-4), compare("dB1", got.B1, want.B1, 1e-4)),
						math.Max(compare("dW2", got.W2, want.W2, 1e-4), compare("dB2", got.B2, want.B2, 1e-4))))
				t.Logf("comm per step %+v; largest difference %.3g absolute; relative (where |want| ≥ 1e-3) %.3g output, %.3g gradients",
					gs[0].Counts(), worstAbs, worstY, worstG)
			})
		}
	}
}

func slicesBitEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// mustErr fails t unless err says want.
func mustErr(t *testing.T, name string, err error, want string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: error %v, want one containing %q", name, err, want)
	}
}

// tpLayer is a tensor-parallel layer: MLP, Attention, Block.
type tpLayer interface {
	Forward(ctx context.Context, x []float32, batch int) ([]float32, error)
	Backward(ctx context.Context, dy []float32) ([]float32, error)
	Grads() []float32
}

// objective returns f(backward), one step of every rank of ls: Forward
// of x, the objective Σ y·proj of rank 0's y (proj fixed, so dy = proj)
// and, with backward, cleared gradients and Backward, rank 0's input
// gradient kept in *dx. Before each step, sync (if not nil) runs.
func objective[L tpLayer](t *testing.T, ls []L, x, proj []float32, batch int, dx *[]float32, sync func()) func(backward bool) float64 {
	return func(backward bool) float64 {
		if sync != nil {
			sync()
		}
		var obj float64
		err := each(len(ls), func(ctx context.Context, r int) error {
			y, err := ls[r].Forward(ctx, x, batch)
			if err != nil {
				return err
			}
			if r == 0 {
				for i, v := range y {
					obj += float64(v) * float64(proj[i])
				}
			}
			if !backward {
				return nil
			}
			clear(ls[r].Grads())
			d, err := ls[r].Backward(ctx, proj)
			if r == 0 {
				*dx = append((*dx)[:0], d...)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return obj
	}
}

// TestMLPGradFiniteDifference checks the sharded block's gradients with
// respect to the input and every rank's parameters by central differences
// of the objective Σ y·r (r fixed, so dy = r), with 7 hidden units over
// 3 ranks (shards of 2, 2 and 3).
func TestMLPGradFiniteDifference(t *testing.T) {
	const in, hidden, out, batch, l = 4, 7, 3, 2, 3
	rng := rand.New(rand.NewPCG(5, 6))
	w := randWeights(rng, in, hidden, out)
	x := randn(rng, batch*in, 1)
	proj := randn(rng, batch*out, 1)
	gs := groups(t, l)
	ms := newMLPs(t, gs, w, in, hidden, out)
	var dx []float32
	step := objective(t, ms, x, proj, batch, &dx, nil)
	step(true)
	f := func() float64 { return step(false) }
	cfg := modeltest.Config{MaxChecks: -1}
	modeltest.CheckGrad(t, "dx", f, x, dx, cfg)
	grads := make([][]float32, l)
	for r, m := range ms {
		grads[r] = append([]float32(nil), m.Grads()...)
	}
	for r, m := range ms {
		// Params and Grads share one layout, so the whole flat buffer is
		// checked at once — except fc2.bias on ranks other than 0: each
		// rank adds its own replica, and the objective reads rank 0's y.
		n := len(m.Params())
		if r != 0 {
			n -= out
		}
		modeltest.CheckGrad(t, fmt.Sprintf("rank %d params", r), f, m.Params()[:n], grads[r][:n], cfg)
		if !slicesBitEqual(grads[r][len(grads[r])-out:], grads[0][len(grads[0])-out:]) {
			t.Errorf("rank %d: fc2.bias gradient differs from rank 0's", r)
		}
	}
}

func TestSpan(t *testing.T) {
	for _, c := range []struct{ n, l int }{{7, 3}, {10, 4}, {4, 4}, {1, 1}, {600, 3}} {
		next := 0
		for r := range c.l {
			lo, hi := tensorpar.Span(c.n, c.l, r)
			if lo != next || hi-lo < c.n/c.l || hi-lo > (c.n+c.l-1)/c.l {
				t.Errorf("Span(%d, %d, %d) = [%d, %d)", c.n, c.l, r, lo, hi)
			}
			next = hi
		}
		if next != c.n {
			t.Errorf("Span(%d, %d, ·) covers [0, %d)", c.n, c.l, next)
		}
	}
}

// TestMLPRefused: sizes that cannot be split, ranks that disagree on the
// shapes, bad lengths and a Backward without Forward are errors on every
// rank they concern, never a panic or a hang.
func TestMLPRefused(t *testing.T) {
	ctx := context.Background()

	// more ranks than hidden units: refused before any communication.
	gs := groups(t, 3)
	for r := range 3 {
		_, err := tensorpar.NewMLP(ctx, gs[r], 4, 2, 3)
		mustErr(t, "L > Hidden", err, "cannot split 2 hidden units over 3")
		if c := gs[r].Counts(); c != (tensorpar.Counts{}) {
			t.Errorf("L > Hidden communicated: %+v", c)
		}
	}
	_, err := tensorpar.NewMLP(ctx, gs[0], 0, 2, 3)
	mustErr(t, "In 0", err, "want each in [1, 2²⁴]")

	// ranks that disagree on the hidden size: every rank refuses.
	gs = groups(t, 2)
	errs := make([]error, 2)
	if err := each(2, func(ctx context.Context, r int) error {
		_, errs[r] = tensorpar.NewMLP(ctx, gs[r], 4, 6+r, 3)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for r, err := range errs {
		mustErr(t, fmt.Sprintf("rank %d of mismatched Hidden", r), err, "ranks disagree")
		gs[r].Reset()
	}

	// a batch that differs between ranks: the all-reduce refuses it.
	rng := rand.New(rand.NewPCG(1, 1))
	const in, hidden, out = 3, 5, 2
	w := randWeights(rng, in, hidden, out)
	ms := newMLPs(t, gs, w, in, hidden, out)
	xs := [][]float32{randn(rng, 2*in, 1), randn(rng, 3*in, 1)}
	err = each(2, func(ctx context.Context, r int) error {
		_, err := ms[r].Forward(ctx, xs[r], 2+r)
		return err
	})
	if !errors.Is(err, aggregator.ErrUnexpectedFrame) {
		t.Errorf("mismatched batch: %v, want an ErrUnexpectedFrame", err)
	}

	m := ms[0]
	_, err = m.Backward(ctx, make([]float32, 2*out))
	mustErr(t, "Backward after a failed Forward", err, "without a successful Forward")
	_, err = m.Forward(ctx, make([]float32, 2*in+1), 2)
	mustErr(t, "bad len(x)", err, "want batch 2 × In 3")
	_, err = m.Forward(ctx, nil, 0)
	mustErr(t, "batch 0", err, "want batch 0 × In 3")
	bad := zeroWeights(in, hidden, out)
	bad.W2 = bad.W2[1:]
	mustErr(t, "SetFromFull", m.SetFromFull(bad), "want 15, 5, 10, 2")
	mustErr(t, "CopyGradsTo", m.CopyGradsTo(bad), "want 15, 5, 10, 2")
	mustErr(t, "CopyParamsTo", m.CopyParamsTo(tensorpar.MLPWeights{}), "want 15, 5, 10, 2")

	// a good Forward (on fresh groups: the refused frames above may still
	// be in the old ring), then a dy of the wrong length.
	ms = newMLPs(t, groups(t, 2), w, in, hidden, out)
	if err := each(2, func(ctx context.Context, r int) error {
		_, err := ms[r].Forward(ctx, xs[0], 2)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	_, err = ms[0].Backward(ctx, make([]float32, 2*out+1))
	mustErr(t, "bad len(dy)", err, "want batch 2 × Out 2")
}

// switching is a Group that uses first for its first call and then for
// the rest: a rank whose later collectives go to another group.
type switching struct {
	first, then tensorpar.Group
	mu          sync.Mutex
	calls       int // guarded by mu
}

func (s *switching) Rank() int { return s.first.Rank() }
func (s *switching) Size() int { return s.first.Size() }

func (s *switching) pick() tensorpar.Group {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.calls == 1 {
		return s.first
	}
	return s.then
}

func (s *switching) AllReduce(ctx context.Context, buf []float32, op tensorpar.ReduceOp) error {
	return s.pick().AllReduce(ctx, buf, op)
}

func (s *switching) AllGather(ctx context.Context, dst, src []float32) error {
	return s.pick().AllGather(ctx, dst, src)
}

func (s *switching) Broadcast(ctx context.Context, buf []float32, root int) error {
	return s.pick().Broadcast(ctx, buf, root)
}

// TestMLPWrongGroupRefused: ranks of different groups fail the shape
// handshake, and a rank whose Forward reaches another group's frames gets
// ErrUnexpectedFrame, returns no output, and nothing hangs.
func TestMLPWrongGroupRefused(t *testing.T) {
	memRings := func() []aggregator.Ring {
		rings := aggregator.NewMemRing(2, 4)
		t.Cleanup(func() {
			for _, r := range rings {
				r.(*aggregator.MemRing).Close()
			}
		})
		return rings
	}
	mk := func(r aggregator.Ring, id uint32) tensorpar.Group {
		g, err := tensorpar.NewRingGroup(r, id, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	rings := memRings()
	gs := []tensorpar.Group{mk(rings[0], 1), mk(rings[1], 2)}
	err := each(2, func(ctx context.Context, r int) error {
		_, err := tensorpar.NewMLP(ctx, gs[r], 3, 4, 2)
		return err
	})
	if !errors.Is(err, aggregator.ErrUnexpectedFrame) {
		t.Fatalf("NewMLP over two groups: %v, want an ErrUnexpectedFrame", err)
	}

	rings = memRings()
	gs = []tensorpar.Group{mk(rings[0], 7), &switching{first: mk(rings[1], 7), then: mk(rings[1], 8)}}
	ms := make([]*tensorpar.MLP, 2)
	if err := each(2, func(ctx context.Context, r int) error {
		var err error
		ms[r], err = tensorpar.NewMLP(ctx, gs[r], 3, 4, 2)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	x := []float32{1, 2, 3}
	ys := make([][]float32, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			ys[r], errs[r] = ms[r].Forward(ctx, x, 1)
			if errs[r] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	if !errors.Is(errs[0], aggregator.ErrUnexpectedFrame) && !errors.Is(errs[1], aggregator.ErrUnexpectedFrame) {
		t.Fatalf("errors %v, want an ErrUnexpectedFrame", errs)
	}
	for r := range 2 {
		if errs[r] != nil && ys[r] != nil {
			t.Errorf("rank %d returned an output with its error", r)
		}
	}
}

// BenchmarkMLP times one forward and backward step of a ViT-like MLP
// block (batch 64, 256 → 1024 → 256) on L in-process ranks.
func BenchmarkMLP(b *testing.B) {
	const in, hidden, out, batch = 256, 1024, 256, 64
	for _, l := range []int{1, 2} {
		b.Run(fmt.Sprintf("L=%d", l), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			w := randWeights(rng, in, hidden, out)
			x := randn(rng, batch*in, 1)
			dy := randn(rng, batch*out, 1)
			gs := groups(b, l)
			ms := newMLPs(b, gs, w, in, hidden, out)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				err := each(l, func(ctx context.Context, r int) error {
					if _, err := ms[r].Forward(ctx, x, batch); err != nil {
						return err
					}
					_, err := ms[r].Backward(ctx, dy)
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			c := gs[0].Counts()
			b.ReportMetric(float64(c.AllReduceValues)/float64(b.N), "values-reduced/op")
		})
	}
}
