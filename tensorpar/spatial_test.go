package tensorpar_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/internal/kernels"
	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/models/modeltest"
	"github.com/gradsync/gradsync/tensorpar"
)

func halos(f int) []*tensorpar.CountingHalo {
	hs := tensorpar.NewMemHalo(f, 3)
	cs := make([]*tensorpar.CountingHalo, f)
	for i, h := range hs {
		cs[i] = &tensorpar.CountingHalo{Halo: h}
	}
	return cs
}

// stripRows copies the rows [lo, hi) of every sample and channel of a
// (batch·C, H, W) tensor: (batch·C, hi−lo, W).
func stripRows(x []float32, planes, h, w, lo, hi int) []float32 {
	out := make([]float32, 0, planes*(hi-lo)*w)
	for p := range planes {
		out = append(out, x[(p*h+lo)*w:(p*h+hi)*w]...)
	}
	return out
}

// readRows enumerates, window by window, the input rows inside the image
// that the output rows [oLo, oHi) of a k-row window with stride s and
// padding p read, and returns their span: every row from the first to
// the last. (With stride > k the span holds rows between windows that no
// window reads; the layer exchanges the span, a contiguous block.)
func readRows(k, s, p, h, oLo, oHi int) [2]int {
	lo, hi := h, 0
	for o := oLo; o < oHi; o++ {
		for i := range k {
			if r := o*s - p + i; r >= 0 && r < h {
				lo, hi = min(lo, r), max(hi, r+1)
			}
		}
	}
	return [2]int{lo, hi}
}

// haloCount is the number of rows of strip [a, b) in the span rows.
func haloCount(rows [2]int, a, b int) int {
	return max(0, min(rows[1], b)-max(rows[0], a))
}

type convCase struct {
	c, h, w, k, stride, pad, out, batch, f int
	bias                                   bool
	in, outS                               tensorpar.Strips // nil: even
}

func (c convCase) geom() kernels.ConvGeom {
	return kernels.ConvGeom{C: c.c, H: c.h, W: c.w, KH: c.k, KW: c.k, StrideH: c.stride, StrideW: c.stride, PadH: c.pad, PadW: c.pad}
}

func newSpatialConvs(t testing.TB, hs []*tensorpar.CountingHalo, c convCase, w, b []float32) []*tensorpar.SpatialConv {
	t.Helper()
	ls := make([]*tensorpar.SpatialConv, c.f)
	err := each(c.f, func(ctx context.Context, r int) error {
		l, err := tensorpar.NewSpatialConv(ctx, hs[r], c.geom(), c.out, c.bias, c.in, c.outS)
		if err != nil {
			return err
		}
		ls[r] = l
		return l.SetParams(w, b)
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		h.Reset()
	}
	return ls
}

// TestSpatialConvMatchesUnsharded checks the strip-sharded convolution
// against models.Conv2D over the whole image for k = 1, 3, 5, stride 1
// and 2, padding 0, 1, 2 and F = 1..4 strips of odd heights (uneven
// strips): every rank's output rows within 1e-5 and input-gradient rows
// within 1e-4 of the whole layer's (relative to the largest entry), the
// weight and bias gradients summed over the ranks within 1e-4; and the
// rows exchanged, counted exactly: each rank sends each neighbour the
// rows of its strip that the neighbour's windows read, from the first to
// the last (enumerated here window by window), forward, and their
// gradients back — for stride 1
// and "same" padding, (k−1)/2 rows per interior side per image per
// channel.
func TestSpatialConvMatchesUnsharded(t *testing.T) {
	var cases []convCase
	for _, k := range []int{1, 3, 5} {
		for _, stride := range []int{1, 2} {
			for _, pad := range []int{0, 1, 2} {
				for f := 1; f <= 4; f++ {
					cases = append(cases, convCase{c: 3, h: 17, w: 7, k: k, stride: stride, pad: pad, out: 2, batch: 2, f: f, bias: pad != 1})
				}
			}
		}
	}
	// more channels (models' Winograd path for 3×3 stride 1) and a taller odd image.
	cases = append(cases, convCase{c: 5, h: 23, w: 9, k: 3, stride: 1, pad: 1, out: 6, batch: 3, f: 3, bias: true},
		convCase{c: 4, h: 31, w: 6, k: 5, stride: 2, pad: 2, out: 3, batch: 1, f: 4, bias: true},
		// strips given, uneven and misaligned: rank 1 reads nothing of its
		// neighbours', and sends rank 0 four rows.
		convCase{c: 3, h: 17, w: 7, k: 3, stride: 1, pad: 1, out: 2, batch: 2, f: 3, bias: true,
			in: tensorpar.Strips{0, 3, 12, 17}, outS: tensorpar.Strips{0, 6, 10, 17}})
	for ci, c := range cases {
		name := fmt.Sprintf("c%d_h%d_w%d_k%d_s%d_p%d_F%d", c.c, c.h, c.w, c.k, c.stride, c.pad, c.f)
		if c.in != nil {
			name += fmt.Sprintf("_in%v_out%v", []int(c.in), []int(c.outS))
		}
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(ci), 99))
			g := c.geom()
			oh, ow := g.OutH(), g.OutW()
			w := randn(rng, c.out*c.c*c.k*c.k, 0.3)
			var b []float32
			if c.bias {
				b = randn(rng, c.out, 0.3)
			}
			x := randn(rng, c.batch*c.c*c.h*c.w, 1)
			dy := randn(rng, c.batch*c.out*oh*ow, 1)
			ref := models.NewConv2D(g, c.out, c.bias)
			ref.W, ref.DW = w, make([]float32, len(w))
			if c.bias {
				ref.B, ref.DB = b, make([]float32, len(b))
			}
			wantY := append([]float32(nil), ref.Forward(x, c.batch, true)...)
			wantDx := ref.Backward(dy)

			hs := halos(c.f)
			ls := newSpatialConvs(t, hs, c, w, b)
			ys, dxs := make([][]float32, c.f), make([][]float32, c.f)
			err := each(c.f, func(ctx context.Context, r int) error {
				l := ls[r]
				y, err := l.Forward(ctx, stripRows(x, c.batch*c.c, c.h, c.w, l.Lo, l.Hi), c.batch)
				if err != nil {
					return err
				}
				ys[r] = append([]float32(nil), y...)
				dx, err := l.Backward(ctx, stripRows(dy, c.batch*c.out, oh, ow, l.OLo, l.OHi))
				dxs[r] = dx
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			cmp := newComparer(t, false)
			dw, db := make([]float32, len(w)), make([]float32, len(b))
			var rowsSent []int
			for r, l := range ls {
				if r > 0 && (l.Lo != ls[r-1].Hi || l.OLo != ls[r-1].OHi) {
					t.Fatalf("rank %d's strips do not follow rank %d's", r, r-1)
				}
				cmp.check(fmt.Sprintf("rank %d y", r), ys[r], stripRows(wantY, c.batch*c.out, oh, ow, l.OLo, l.OHi), 1e-5)
				cmp.check(fmt.Sprintf("rank %d dx", r), dxs[r], stripRows(wantDx, c.batch*c.c, c.h, c.w, l.Lo, l.Hi), 1e-4)
				for i, v := range l.DW {
					dw[i] += v
				}
				for i, v := range l.DB {
					db[i] += v
				}
				// the rows exchanged, against the windows' enumeration.
				plane := int64(c.batch * c.c * c.w)
				var toA, toB, fromA, fromB int64
				if r > 0 {
					toA = plane * int64(haloCount(readRows(c.k, c.stride, c.pad, c.h, ls[r-1].OLo, ls[r-1].OHi), l.Lo, l.Hi))
					fromA = plane * int64(haloCount(readRows(c.k, c.stride, c.pad, c.h, l.OLo, l.OHi), ls[r-1].Lo, ls[r-1].Hi))
				}
				if r < c.f-1 {
					toB = plane * int64(haloCount(readRows(c.k, c.stride, c.pad, c.h, ls[r+1].OLo, ls[r+1].OHi), l.Lo, l.Hi))
					fromB = plane * int64(haloCount(readRows(c.k, c.stride, c.pad, c.h, l.OLo, l.OHi), ls[r+1].Lo, ls[r+1].Hi))
					rowsSent = append(rowsSent, int(toB/plane))
				}
				// forward sends to, backward sends from (the gradients).
				want := tensorpar.HaloCounts{Exchanges: 2, SentAbove: toA + fromA, SentBelow: toB + fromB, RecvAbove: fromA + toA, RecvBelow: fromB + toB}
				if got := hs[r].Counts(); got != want {
					t.Errorf("rank %d: halo counts %+v, want %+v", r, got, want)
				}
				if c.stride == 1 && c.pad == (c.k-1)/2 && c.in == nil {
					if r < c.f-1 && toB != plane*int64((c.k-1)/2) || r > 0 && toA != plane*int64((c.k-1)/2) {
						t.Errorf("rank %d sends %d, %d values, want (k−1)/2 = %d rows × %d each side", r, toA, toB, (c.k-1)/2, plane)
					}
				}
			}
			cmp.check("dW summed", dw, ref.DW, 1e-4)
			cmp.check("dB summed", db, ref.DB, 1e-4)
			t.Logf("rows sent down per interior boundary per image per channel %v; %v", rowsSent, cmp)
		})
	}
}

// TestSpatialConvGradFiniteDifference checks the sharded convolution's
// input and parameter gradients by central differences of Σ y·r over all
// ranks' outputs (the parameters, replicated, perturbed on every rank;
// their gradient is the sum of the ranks' shares), stride 2 over 3
// uneven strips.
func TestSpatialConvGradFiniteDifference(t *testing.T) {
	c := convCase{c: 2, h: 11, w: 5, k: 3, stride: 2, pad: 1, out: 2, batch: 2, f: 3, bias: true}
	rng := rand.New(rand.NewPCG(3, 4))
	g := c.geom()
	w, b := randn(rng, c.out*c.c*c.k*c.k, 0.5), randn(rng, c.out, 0.5)
	x := randn(rng, c.batch*c.c*c.h*c.w, 1)
	proj := randn(rng, c.batch*c.out*g.OutH()*g.OutW(), 1)
	hs := halos(c.f)
	ls := newSpatialConvs(t, hs, c, w, b)
	params := append([]float32(nil), ls[0].Params()...) // the master copy every rank takes before Forward
	dx := make([]float32, len(x))
	dp := make([]float32, len(params))
	step := func(backward bool) float64 {
		objs := make([]float64, c.f)
		err := each(c.f, func(ctx context.Context, r int) error {
			l := ls[r]
			copy(l.Params(), params)
			y, err := l.Forward(ctx, stripRows(x, c.batch*c.c, c.h, c.w, l.Lo, l.Hi), c.batch)
			if err != nil {
				return err
			}
			pr := stripRows(proj, c.batch*c.out, g.OutH(), g.OutW(), l.OLo, l.OHi)
			for i, v := range y {
				objs[r] += float64(v) * float64(pr[i])
			}
			if !backward {
				return nil
			}
			clear(l.Grads())
			d, err := l.Backward(ctx, pr)
			if err != nil {
				return err
			}
			own := l.Hi - l.Lo
			for p := range c.batch * c.c {
				copy(dx[(p*c.h+l.Lo)*c.w:(p*c.h+l.Hi)*c.w], d[p*own*c.w:(p+1)*own*c.w])
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		var obj float64
		for _, o := range objs {
			obj += o
		}
		return obj
	}
	step(true)
	for _, l := range ls {
		for i, v := range l.Grads() {
			dp[i] += v
		}
	}
	f := func() float64 { return step(false) }
	cfg := modeltest.Config{MaxChecks: -1}
	modeltest.CheckGrad(t, "dx", f, x, dx, cfg)
	modeltest.CheckGrad(t, "params", f, params, dp, cfg)
}

func TestHaloRows(t *testing.T) {
	for _, c := range []struct{ k, s, p, d, lo, hi, wantLo, wantHi int }{
		{3, 1, 1, 1, 4, 8, 3, 9},   // same 3×3: one row each side
		{5, 1, 2, 1, 4, 8, 2, 10},  // same 5×5: two
		{3, 1, 0, 1, 4, 8, 4, 10},  // valid 3×3: two below
		{3, 2, 1, 1, 2, 5, 3, 10},  // stride 2
		{3, 1, 2, 2, 4, 8, 2, 10},  // dilation 2, "same" padding 2: two each side
		{1, 1, 0, 1, 0, 17, 0, 17}, // 1×1: none
	} {
		lo, hi := tensorpar.HaloRows(c.k, c.s, c.p, c.d, c.lo, c.hi)
		if lo != c.wantLo || hi != c.wantHi {
			t.Errorf("HaloRows(k %d, stride %d, pad %d, dilation %d, [%d, %d)) = [%d, %d), want [%d, %d)", c.k, c.s, c.p, c.d, c.lo, c.hi, lo, hi, c.wantLo, c.wantHi)
		}
		// against the windows, row by row
		min, max := 1<<30, -1<<30
		for o := c.lo; o < c.hi; o++ {
			for i := range c.k {
				r := o*c.s - c.p + i*c.d
				min, max = mini(min, r), maxi(max, r)
			}
		}
		if lo != min || hi != max+1 {
			t.Errorf("HaloRows(%+v) = [%d, %d), the windows read [%d, %d]", c, lo, hi, min, max)
		}
	}
}

func mini(a, b int) int { return min(a, b) }
func maxi(a, b int) int { return max(a, b) }

// TestSpatialConvRefused: strips too thin for the halo, neighbours that
// disagree, bad lengths and a Backward without Forward are errors, never
// a panic or a hang.
func TestSpatialConvRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // bounds a hang; the refusals come first
	defer cancel()
	g := kernels.ConvGeom{C: 1, H: 5, W: 4, KH: 5, KW: 5, StrideH: 1, StrideW: 1, PadH: 2, PadW: 2}
	hs := halos(4)
	_, err := tensorpar.NewSpatialConv(ctx, hs[1], g, 1, false, nil, nil)
	mustErr(t, "thin strips", err, "beyond its neighbours' strips")
	_, err = tensorpar.NewSpatialConv(ctx, hs[0], g, 1, false, tensorpar.Strips{0, 2, 2, 3, 5}, nil)
	mustErr(t, "empty strip", err, "is empty")
	g.H = 2
	_, err = tensorpar.NewSpatialConv(ctx, hs[0], g, 1, false, nil, nil)
	mustErr(t, "more ranks than rows", err, "is empty")

	// neighbours with different geometries: both refuse.
	hs = halos(2)
	errs := make([]error, 2)
	if err := each(2, func(ctx context.Context, r int) error {
		g := kernels.ConvGeom{C: 1, H: 9, W: 4, KH: 3, KW: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1 + r}
		_, errs[r] = tensorpar.NewSpatialConv(ctx, hs[r], g, 1, false, nil, nil)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for r, err := range errs {
		mustErr(t, fmt.Sprintf("rank %d of mismatched geometry", r), err, "differs from its neighbour")
	}

	c := convCase{c: 1, h: 9, w: 4, k: 3, stride: 1, pad: 1, out: 1, batch: 1, f: 2}
	ls := newSpatialConvs(t, halos(2), c, make([]float32, 9), nil)
	_, err = ls[0].Backward(ctx, make([]float32, 16))
	mustErr(t, "Backward first", err, "without a successful Forward")
	_, err = ls[0].Forward(ctx, make([]float32, 15), 1)
	mustErr(t, "bad len(x)", err, "want batch 1 × C 1 × 4 rows × W 4")
	mustErr(t, "SetParams", ls[0].SetParams(make([]float32, 8), nil), "want 9, 0")

	// ranks with different batches: each refuses the other's frame, and
	// returns no output.
	ls = newSpatialConvs(t, halos(2), c, make([]float32, 9), nil)
	ys := make([][]float32, 2)
	if err := each(2, func(ctx context.Context, r int) error {
		ys[r], errs[r] = ls[r].Forward(ctx, make([]float32, (1+r)*(ls[r].Hi-ls[r].Lo)*4), 1+r)
		return nil // no cancel: each rank must meet the other's frame
	}); err != nil {
		t.Fatal(err)
	}
	for r := range 2 {
		if !errors.Is(errs[r], aggregator.ErrUnexpectedFrame) || ys[r] != nil {
			t.Errorf("rank %d of mismatched batches: %v (output %v), want an ErrUnexpectedFrame and no output", r, errs[r], ys[r] != nil)
		}
	}
}

// TestSpatialPoolMatchesUnsharded checks strip-sharded max and average
// pools against models' MaxPool2D and AvgPool2D over the whole image,
// for 2×2 and 3×3 windows with stride 1 and 2, F = 1..4 strips of an odd
// height: outputs within 1e-5 and input gradients within 1e-4 (max pools
// route to the same maxima, so theirs are exact), and the rows exchanged
// counted as for the convolution.
func TestSpatialPoolMatchesUnsharded(t *testing.T) {
	for _, maxPool := range []bool{true, false} {
		for _, kc := range [][2]int{{2, 2}, {3, 2}, {3, 1}, {2, 1}} {
			for f := 1; f <= 4; f++ {
				g := models.PoolGeom{C: 3, H: 17, W: 7, K: kc[0], Stride: kc[1]}
				name := fmt.Sprintf("max%v_k%d_s%d_F%d", maxPool, g.K, g.Stride, f)
				t.Run(name, func(t *testing.T) {
					const batch = 2
					rng := rand.New(rand.NewPCG(uint64(f), uint64(g.K*10+g.Stride)))
					oh, ow := g.OutH(), g.OutW()
					x := randn(rng, batch*g.C*g.H*g.W, 1)
					dy := randn(rng, batch*g.C*oh*ow, 1)
					var ref models.Layer = models.NewAvgPool2D(g)
					if maxPool {
						ref = models.NewMaxPool2D(g)
					}
					wantY := append([]float32(nil), ref.Forward(x, batch, true)...)
					wantDx := ref.Backward(dy)
					hs := halos(f)
					ls := make([]*tensorpar.SpatialPool, f)
					ys, dxs := make([][]float32, f), make([][]float32, f)
					err := each(f, func(ctx context.Context, r int) error {
						l, err := tensorpar.NewSpatialPool(ctx, hs[r], g, maxPool, nil, nil)
						if err != nil {
							return err
						}
						ls[r] = l
						hs[r].Reset()
						y, err := l.Forward(ctx, stripRows(x, batch*g.C, g.H, g.W, l.Lo, l.Hi), batch)
						if err != nil {
							return err
						}
						ys[r] = append([]float32(nil), y...)
						dxs[r], err = l.Backward(ctx, stripRows(dy, batch*g.C, oh, ow, l.OLo, l.OHi))
						return err
					})
					if err != nil {
						t.Fatal(err)
					}
					cmp := newComparer(t, false)
					var rowsSent []int
					for r, l := range ls {
						cmp.check(fmt.Sprintf("rank %d y", r), ys[r], stripRows(wantY, batch*g.C, oh, ow, l.OLo, l.OHi), 1e-5)
						cmp.check(fmt.Sprintf("rank %d dx", r), dxs[r], stripRows(wantDx, batch*g.C, g.H, g.W, l.Lo, l.Hi), 1e-4)
						plane := int64(batch * g.C * g.W)
						var toA, toB, fromA, fromB int64
						if r > 0 {
							toA = plane * int64(haloCount(readRows(g.K, g.Stride, 0, g.H, ls[r-1].OLo, ls[r-1].OHi), l.Lo, l.Hi))
							fromA = plane * int64(haloCount(readRows(g.K, g.Stride, 0, g.H, l.OLo, l.OHi), ls[r-1].Lo, ls[r-1].Hi))
						}
						if r < f-1 {
							toB = plane * int64(haloCount(readRows(g.K, g.Stride, 0, g.H, ls[r+1].OLo, ls[r+1].OHi), l.Lo, l.Hi))
							fromB = plane * int64(haloCount(readRows(g.K, g.Stride, 0, g.H, l.OLo, l.OHi), ls[r+1].Lo, ls[r+1].Hi))
							rowsSent = append(rowsSent, int(toB/plane))
						}
						want := tensorpar.HaloCounts{Exchanges: 2, SentAbove: toA + fromA, SentBelow: toB + fromB, RecvAbove: fromA + toA, RecvBelow: fromB + toB}
						if got := hs[r].Counts(); got != want {
							t.Errorf("rank %d: halo counts %+v, want %+v", r, got, want)
						}
					}
					t.Logf("rows sent down per interior boundary per image per channel %v; %v", rowsSent, cmp)
				})
			}
		}
	}
}

// TestSpatialPoolGradFiniteDifference checks the sharded pools' input
// gradients by central differences, overlapping 3×3 windows of stride 2
// over 3 strips.
func TestSpatialPoolGradFiniteDifference(t *testing.T) {
	for _, maxPool := range []bool{true, false} {
		g := models.PoolGeom{C: 2, H: 11, W: 5, K: 3, Stride: 2}
		const batch, f = 2, 3
		rng := rand.New(rand.NewPCG(5, 6))
		x := randn(rng, batch*g.C*g.H*g.W, 1)
		proj := randn(rng, batch*g.C*g.OutH()*g.OutW(), 1)
		hs := halos(f)
		ls := make([]*tensorpar.SpatialPool, f)
		if err := each(f, func(ctx context.Context, r int) error {
			var err error
			ls[r], err = tensorpar.NewSpatialPool(ctx, hs[r], g, maxPool, nil, nil)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		dx := make([]float32, len(x))
		step := func(backward bool) float64 {
			objs := make([]float64, f)
			err := each(f, func(ctx context.Context, r int) error {
				l := ls[r]
				y, err := l.Forward(ctx, stripRows(x, batch*g.C, g.H, g.W, l.Lo, l.Hi), batch)
				if err != nil {
					return err
				}
				pr := stripRows(proj, batch*g.C, g.OutH(), g.OutW(), l.OLo, l.OHi)
				for i, v := range y {
					objs[r] += float64(v) * float64(pr[i])
				}
				if !backward {
					return nil
				}
				d, err := l.Backward(ctx, pr)
				if err != nil {
					return err
				}
				own := l.Hi - l.Lo
				for p := range batch * g.C {
					copy(dx[(p*g.H+l.Lo)*g.W:(p*g.H+l.Hi)*g.W], d[p*own*g.W:(p+1)*own*g.W])
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			return objs[0] + objs[1] + objs[2]
		}
		step(true)
		modeltest.CheckGrad(t, fmt.Sprintf("max %v dx", maxPool), func() float64 { return step(false) }, x, dx, modeltest.Config{MaxChecks: -1})
	}
}

// TestSpatialChainMatchesUnsharded runs a small strip-sharded CNN —
// conv 3×3 (stride 1, padding 1), max pool 2×2, conv 3×3 (stride 2,
// padding 1), each layer's input strips the previous layer's output
// strips — over an odd image height on F = 2..4 ranks, and compares it
// with the same layers of models over the whole image: where strides and
// pools misalign strips, the halos must still be right.
func TestSpatialChainMatchesUnsharded(t *testing.T) {
	const batch, c0, c1, c2, h, w = 2, 2, 3, 2, 23, 9
	g1 := kernels.ConvGeom{C: c0, H: h, W: w, KH: 3, KW: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1}
	gp := models.PoolGeom{C: c1, H: g1.OutH(), W: g1.OutW(), K: 2, Stride: 2}
	g2 := kernels.ConvGeom{C: c1, H: gp.OutH(), W: gp.OutW(), KH: 3, KW: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1}
	rng := rand.New(rand.NewPCG(21, 22))
	w1, b1 := randn(rng, c1*c0*9, 0.4), randn(rng, c1, 0.3)
	w2, b2 := randn(rng, c2*c1*9, 0.4), randn(rng, c2, 0.3)
	x := randn(rng, batch*c0*h*w, 1)
	dy := randn(rng, batch*c2*g2.OutH()*g2.OutW(), 1)

	conv := func(g kernels.ConvGeom, out int, wt, b []float32) *models.Conv2D {
		l := models.NewConv2D(g, out, true)
		l.W, l.B, l.DW, l.DB = wt, b, make([]float32, len(wt)), make([]float32, len(b))
		return l
	}
	r1, rp, r2 := conv(g1, c1, w1, b1), models.NewMaxPool2D(gp), conv(g2, c2, w2, b2)
	wantY := append([]float32(nil), r2.Forward(rp.Forward(r1.Forward(x, batch, true), batch, true), batch, true)...)
	wantDx := r1.Backward(rp.Backward(r2.Backward(dy)))

	for f := 2; f <= 4; f++ {
		t.Run(fmt.Sprintf("F%d", f), func(t *testing.T) {
			hs := halos(f)
			type ranks struct {
				c1, c2 *tensorpar.SpatialConv
				p      *tensorpar.SpatialPool
			}
			rs := make([]ranks, f)
			ys, dxs := make([][]float32, f), make([][]float32, f)
			err := each(f, func(ctx context.Context, r int) error {
				var err error
				s := &rs[r]
				if s.c1, err = tensorpar.NewSpatialConv(ctx, hs[r], g1, c1, true, nil, nil); err != nil {
					return err
				}
				if s.p, err = tensorpar.NewSpatialPool(ctx, hs[r], gp, true, s.c1.OutS, nil); err != nil {
					return err
				}
				if s.c2, err = tensorpar.NewSpatialConv(ctx, hs[r], g2, c2, true, s.p.OutS, nil); err != nil {
					return err
				}
				if err := s.c1.SetParams(w1, b1); err != nil {
					return err
				}
				if err := s.c2.SetParams(w2, b2); err != nil {
					return err
				}
				y, err := s.c1.Forward(ctx, stripRows(x, batch*c0, h, w, s.c1.Lo, s.c1.Hi), batch)
				if err == nil {
					y, err = s.p.Forward(ctx, y, batch)
				}
				if err == nil {
					y, err = s.c2.Forward(ctx, y, batch)
				}
				if err != nil {
					return err
				}
				ys[r] = append([]float32(nil), y...)
				d, err := s.c2.Backward(ctx, stripRows(dy, batch*c2, g2.OutH(), g2.OutW(), s.c2.OLo, s.c2.OHi))
				if err == nil {
					d, err = s.p.Backward(ctx, d)
				}
				if err == nil {
					d, err = s.c1.Backward(ctx, d)
				}
				dxs[r] = d
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			cmp := newComparer(t, false)
			dw1, dw2 := make([]float32, len(w1)), make([]float32, len(w2))
			for r, s := range rs {
				cmp.check(fmt.Sprintf("rank %d y", r), ys[r], stripRows(wantY, batch*c2, g2.OutH(), g2.OutW(), s.c2.OLo, s.c2.OHi), 1e-5)
				cmp.check(fmt.Sprintf("rank %d dx", r), dxs[r], stripRows(wantDx, batch*c0, h, w, s.c1.Lo, s.c1.Hi), 1e-4)
				for i, v := range s.c1.DW {
					dw1[i] += v
				}
				for i, v := range s.c2.DW {
					dw2[i] += v
				}
			}
			cmp.check("conv1 dW summed", dw1, r1.DW, 1e-4)
			cmp.check("conv2 dW summed", dw2, r2.DW, 1e-4)
			t.Logf("strips: conv1 %v → pool %v → conv2 %v; %v", rs[0].c1.In, rs[0].p.In, rs[0].c2.OutS, cmp)
		})
	}
}

// BenchmarkSpatialConv times one forward and backward step of a 3×3
// "same" convolution (batch 4, 16 → 16 channels, 128×128) on F
// in-process strips.
func BenchmarkSpatialConv(b *testing.B) {
	for _, f := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("F=%d", f), func(b *testing.B) {
			c := convCase{c: 16, h: 128, w: 128, k: 3, stride: 1, pad: 1, out: 16, batch: 4, f: f, bias: true}
			rng := rand.New(rand.NewPCG(1, 2))
			hs := halos(f)
			ls := newSpatialConvs(b, hs, c, randn(rng, c.out*c.c*9, 0.1), randn(rng, c.out, 0.1))
			x := randn(rng, c.batch*c.c*c.h*c.w, 1)
			g := c.geom()
			dy := randn(rng, c.batch*c.out*g.OutH()*g.OutW(), 1)
			xs, dys := make([][]float32, f), make([][]float32, f)
			for r, l := range ls {
				xs[r] = stripRows(x, c.batch*c.c, c.h, c.w, l.Lo, l.Hi)
				dys[r] = stripRows(dy, c.batch*c.out, g.OutH(), g.OutW(), l.OLo, l.OHi)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				err := each(f, func(ctx context.Context, r int) error {
					if _, err := ls[r].Forward(ctx, xs[r], c.batch); err != nil {
						return err
					}
					_, err := ls[r].Backward(ctx, dys[r])
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			h := hs[0].Counts()
			b.ReportMetric(float64(h.SentAbove+h.SentBelow)/float64(b.N), "values-sent-rank0/op")
		})
	}
}
