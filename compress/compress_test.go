package compress_test

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/models"
)

// TestBitIdentical: whatever the scheme, after every step all ranks hold
// the same bits.
func TestBitIdentical(t *testing.T) {
	l := total(testSegs)
	for kind, mk := range kinds(testSegs) {
		for n := 1; n <= 4; n++ {
			t.Run(name(kind, n), func(t *testing.T) {
				w := newWorld(t, n, mk)
				rng := rand.New(rand.NewPCG(uint64(n), 1))
				for step := range int64(3) {
					g := randGrads(rng, n, l)
					w.step(t, g, step)
					bitIdentical(t, g)
					for i, v := range g[0] {
						if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
							t.Fatalf("step %d: element %d is %v", step, i, v)
						}
					}
				}
			})
		}
	}
}

// TestPlainIsTodaysRing: Plain is the bucketed all-reduce followed by a
// multiplication by 1/n, bit for bit.
func TestPlainIsTodaysRing(t *testing.T) {
	l := total(testSegs)
	for n := 1; n <= 4; n++ {
		t.Run(name("plain", n), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(9, uint64(n)))
			g := randGrads(rng, n, l)
			want := clone2(g)
			w := newWorld(t, n, kinds(testSegs)["plain"])
			w.step(t, g, 5)
			// The reference: what worker.ringSync did, bucket by bucket.
			ref := newWorld(t, n, func(r aggregator.Ring) (compress.Reducer, error) {
				return refRing{r}, nil
			})
			ref.step(t, want, 5)
			for r := range n {
				for i := range want[r] {
					if math.Float32bits(g[r][i]) != math.Float32bits(want[r][i]) {
						t.Fatalf("rank %d element %d: %v, want %v", r, i, g[r][i], want[r][i])
					}
				}
			}
			st := w.reds[0].Stats()
			if st.RawBytes != int64(4*l) || st.SentBytes != st.RawBytes || st.Steps != 1 {
				t.Errorf("stats %+v: want raw = sent = %d, 1 step", st, 4*l)
			}
		})
	}
}

// refRing is the reduction worker.ringSync performed before compression:
// its bucketize (repeated here with a 256-byte cap), one AllReduce per
// bucket, then ×1/n.
type refRing struct{ r aggregator.Ring }

func (f refRing) Reduce(ctx context.Context, g []float32, step int64) error {
	spans := [][2]int{}
	// Same rule as the worker: walk segments backwards, start a new bucket
	// when the current one would exceed the cap.
	lo, hi := -1, -1
	for i := len(testSegs) - 1; i >= 0; i-- {
		s := testSegs[i]
		if lo >= 0 && 4*(hi-s.Offset) > 256 {
			spans = append(spans, [2]int{lo, hi})
			lo = -1
		}
		if lo < 0 {
			lo, hi = s.Offset, s.Offset+s.Len
			continue
		}
		lo = s.Offset
	}
	spans = append(spans, [2]int{lo, hi})
	for k, sp := range spans {
		if err := aggregator.AllReduce(ctx, f.r, g[sp[0]:sp[1]], step<<20|int64(k), aggregator.Options{MaxFrameElems: 64}); err != nil {
			return err
		}
	}
	inv := 1 / float32(f.r.Size())
	for i := range g {
		g[i] *= inv
	}
	return nil
}

func (refRing) Stats() compress.Stats { return compress.Stats{} }

func powerSGD(cfg compress.PowerSGDConfig, segs []models.Segment) factory {
	return func(r aggregator.Ring) (compress.Reducer, error) {
		return compress.NewPowerSGD(r, aggregator.Options{}, segs, 0, cfg)
	}
}

// TestPowerSGDLowRankExact: a matrix of rank ≤ r comes back after one step,
// on one rank and as the average of identical inputs on several, to float32
// accuracy: the products are float32 GEMMs (as in PyTorch) over up to a few
// hundred terms, so 2e-5 of the largest magnitude.
func TestPowerSGDLowRankExact(t *testing.T) {
	l := total(testSegs)
	for _, r := range []int{1, 2, 4} {
		for _, rk := range []int{1, r} { // rank-deficient and full rank r
			for n := 1; n <= 4; n++ {
				t.Run(name("r="+itoa(r)+"/matrank="+itoa(rk), n), func(t *testing.T) {
					w := newWorld(t, n, powerSGD(compress.PowerSGDConfig{Rank: r, Seed: int64(r)}, testSegs))
					if got := w.reds[0].(*compress.PowerSGD).Compressed(); !slices.Equal(got, []string{"conv.weight", "fc.weight"}) {
						t.Fatalf("compressed %v", got)
					}
					rng := rand.New(rand.NewPCG(uint64(r*10+rk), uint64(n)))
					in := randVec(rng, l)
					for _, s := range testSegs[:4:4] {
						if len(s.Shape) > 1 {
							lowRank(rng, in, s, rk)
						}
					}
					g := make([][]float32, n)
					for i := range g {
						g[i] = slices.Clone(in)
					}
					w.step(t, g, 0)
					bitIdentical(t, g)
					for _, s := range testSegs {
						got, want := g[0][s.Offset:s.Offset+s.Len], in[s.Offset:s.Offset+s.Len]
						near(t, s.Name, got, want, 2e-5)
					}
					// The residual is what was not applied: ~0 here.
					for name, tn := range w.reds[0].(compress.Stateful).State() {
						if v, _ := tn.Float32s(); name[:15] == "powersgd.error." && maxAbs(v) > 2e-5*maxAbs(in) {
							t.Errorf("%s: residual %g after an exact step", name, maxAbs(v))
						}
					}
				})
			}
		}
	}
}

func itoa(i int) string { return string(rune('0' + i)) }

// conservation checks error feedback's invariant over several steps:
// Σ_t applied_t + mean_r residual_r = mean_r Σ_t input_r,t.
func conservation(t *testing.T, mk factory, n int, residual func(compress.Reducer) []float32) {
	l := total(testSegs)
	w := newWorld(t, n, mk)
	rng := rand.New(rand.NewPCG(uint64(n), 77))
	applied := make([]float64, l)
	inputs := make([]float64, l)
	const steps = 6
	for step := range int64(steps) {
		g := randGrads(rng, n, l)
		for r := range n {
			for i, v := range g[r] {
				inputs[i] += float64(v) / float64(n)
			}
		}
		w.step(t, g, step)
		bitIdentical(t, g)
		for i, v := range g[0] {
			applied[i] += float64(v)
		}
	}
	for r := range n {
		for i, v := range residual(w.reds[r]) {
			applied[i] += float64(v) / float64(n)
		}
	}
	for i := range l {
		if d := math.Abs(applied[i] - inputs[i]); d > 1e-5*steps {
			t.Fatalf("element %d: applied + residual = %v, inputs sum to %v (|diff| %g)", i, applied[i], inputs[i], d)
		}
	}
}

func TestErrorFeedbackConserves(t *testing.T) {
	l := total(testSegs)
	for n := 1; n <= 4; n++ {
		t.Run(name("powersgd", n), func(t *testing.T) {
			conservation(t, powerSGD(compress.PowerSGDConfig{Rank: 1, Seed: 1}, testSegs), n, func(red compress.Reducer) []float32 {
				res := make([]float32, l)
				st := red.(compress.Stateful).State()
				for _, s := range testSegs {
					if tn, ok := st["powersgd.error."+s.Name]; ok {
						v, _ := tn.Float32s()
						copy(res[s.Offset:], v)
					}
				}
				return res
			})
		})
		t.Run(name("topk", n), func(t *testing.T) {
			conservation(t, kinds(testSegs)["topk"], n, func(red compress.Reducer) []float32 {
				v, _ := red.(compress.Stateful).State()["topk.residual"].Float32s()
				return v
			})
		})
	}
}

// TestTopKSelect: exactly the k largest magnitudes are kept (lower index
// first among ties), on one rank without error feedback.
func TestTopKSelect(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for _, l := range []int{1, 2, 7, 100, 1000} {
		for _, ratio := range []float64{0.001, 0.01, 0.1, 0.5, 1} {
			for _, ties := range []bool{false, true} {
				segs := layout("x", []int{l})
				w := newWorld(t, 1, func(r aggregator.Ring) (compress.Reducer, error) {
					return compress.NewTopK(r, aggregator.Options{}, segs, 0, compress.TopKConfig{Ratio: ratio, NoErrorFeedback: true})
				})
				k := w.reds[0].(*compress.TopK).K()
				if want := max(1, int(ratio*float64(l))); k != want {
					t.Fatalf("l=%d ratio=%v: k = %d, want %d", l, ratio, k, want)
				}
				in := randVec(rng, l)
				if ties {
					for i := range in {
						in[i] = float32(rng.IntN(5) - 2) // many equal magnitudes, zeros
					}
				}
				g := [][]float32{slices.Clone(in)}
				w.step(t, g, 0)
				// Reference: sort indices by magnitude desc, index asc.
				idx := make([]int, l)
				for i := range idx {
					idx[i] = i
				}
				sort.SliceStable(idx, func(a, b int) bool { return abs(in[idx[a]]) > abs(in[idx[b]]) })
				keep := map[int]bool{}
				for _, i := range idx[:k] {
					keep[i] = true
				}
				for i, v := range g[0] {
					want := float32(0)
					if keep[i] {
						want = in[i]
					}
					if math.Float32bits(v) != math.Float32bits(want) {
						t.Fatalf("l=%d ratio=%v ties=%v: element %d = %v, want %v", l, ratio, ties, i, v, want)
					}
				}
				if st := w.reds[0].Stats(); st.SentBytes != int64(8*k) {
					t.Errorf("sent %d bytes, want 8k = %d", st.SentBytes, 8*k)
				}
			}
		}
	}
}

func abs(v float32) float32 { return float32(math.Abs(float64(v))) }

// TestInt8Unbiased: the mean over many seeds of the dequantised gradient
// approaches the input, within a few standard errors (each element's
// rounding has standard deviation ≤ scale/127/2).
func TestInt8Unbiased(t *testing.T) {
	segs := layout("x", []int{300})
	rng := rand.New(rand.NewPCG(1, 2))
	in := randVec(rng, 300)
	in[7] = 0
	const seeds = 1500
	sum := make([]float64, len(in))
	for seed := range seeds {
		w := newWorld(t, 1, func(r aggregator.Ring) (compress.Reducer, error) {
			return compress.NewInt8(r, aggregator.Options{}, segs, 0, compress.Int8Config{ChunkSize: 100, Seed: int64(seed)})
		})
		g := [][]float32{slices.Clone(in)}
		w.step(t, g, int64(seed%3))
		for i, v := range g[0] {
			sum[i] += float64(v)
			// One draw is within one quantisation step.
			sc := maxAbs(in[i/100*100 : i/100*100+100])
			if d := math.Abs(float64(v - in[i])); d > sc/127*(1+1e-6) {
				t.Fatalf("seed %d element %d: %v for %v, more than one step (%g) away", seed, i, v, in[i], sc/127)
			}
		}
	}
	for i, s := range sum {
		sc := maxAbs(in[i/100*100 : i/100*100+100])
		se := sc / 127 / 2 / math.Sqrt(seeds)
		if d := math.Abs(s/seeds - float64(in[i])); d > 5*se {
			t.Errorf("element %d: mean %v over %d seeds, input %v: |diff| %g > 5 standard errors (%g)", i, s/seeds, seeds, in[i], d, 5*se)
		}
	}
	if sum[7] != 0 {
		t.Errorf("zero input gave mean %v", sum[7]/seeds)
	}
}

// TestInt8Bytes: int8 sends one byte per element (rounded up to whole
// words) plus one float32 scale per chunk.
func TestInt8Bytes(t *testing.T) {
	segs := layout("x", []int{1001})
	w := newWorld(t, 1, func(r aggregator.Ring) (compress.Reducer, error) {
		return compress.NewInt8(r, aggregator.Options{}, segs, 0, compress.Int8Config{})
	})
	w.step(t, [][]float32{make([]float32, 1001)}, 0)
	if st := w.reds[0].Stats(); st.SentBytes != 4*(2+251) || st.RawBytes != 4004 {
		t.Errorf("stats %+v: want sent %d, raw 4004", st, 4*(2+251))
	}
}
