package compress_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// fromSpec builds the reducer a job's CompressionSpec asks for, through
// jobspec's mapping as the worker does (compress itself takes a Scheme).
func fromSpec(spec *pb.CompressionSpec, ring aggregator.Ring, opts aggregator.Options, segs []models.Segment, bucketCapBytes int, seed int64) (compress.Reducer, error) {
	sc, err := jobspec.CompressionScheme(spec, seed)
	if err != nil {
		return nil, err
	}
	return compress.New(sc, ring, opts, segs, bucketCapBytes)
}

// schemeOf maps a CompressionSpec the test knows to be valid.
func schemeOf(t testing.TB, spec *pb.CompressionSpec, seed int64) compress.Scheme {
	t.Helper()
	sc, err := jobspec.CompressionScheme(spec, seed)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// layout builds tiling segments from named shapes.
func layout(shapes ...any) []models.Segment {
	var segs []models.Segment
	off := 0
	for i := 0; i < len(shapes); i += 2 {
		name, shape := shapes[i].(string), shapes[i+1].([]int)
		n := 1
		for _, d := range shape {
			n *= d
		}
		segs = append(segs, models.Segment{Name: name, Shape: shape, Offset: off, Len: n})
		off += n
	}
	return segs
}

func total(segs []models.Segment) int {
	if len(segs) == 0 {
		return 0
	}
	s := segs[len(segs)-1]
	return s.Offset + s.Len
}

// testSegs mixes what PowerSGD compresses (a conv weight, a linear weight)
// with what it does not (biases, a small matrix).
var testSegs = layout(
	"conv.weight", []int{12, 3, 3, 3}, // 12×27
	"conv.bias", []int{12},
	"fc.weight", []int{20, 30},
	"fc.bias", []int{20},
	"small.weight", []int{4, 4}, // (4+4)·2·2 = 32 ≥ 16: not compressed
)

// factory builds rank's reducer over ring.
type factory func(ring aggregator.Ring) (compress.Reducer, error)

// world is n ranks over an in-memory ring, each with its reducer.
type world struct {
	n    int
	reds []compress.Reducer
}

func newWorld(t testing.TB, n int, mk factory) *world {
	t.Helper()
	rings := aggregator.NewMemRing(n, 4)
	w := &world{n: n, reds: make([]compress.Reducer, n)}
	for r, ring := range rings {
		red, err := mk(ring)
		if err != nil {
			t.Fatal(err)
		}
		w.reds[r] = red
	}
	return w
}

// step reduces grads[r] on every rank r concurrently.
func (w *world) step(t testing.TB, grads [][]float32, step int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make([]error, w.n)
	var wg sync.WaitGroup
	for r := range w.n {
		wg.Go(func() { errs[r] = w.reds[r].Reduce(ctx, grads[r], step) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("step %d: rank %d: %v", step, r, err)
		}
	}
}

func randVec(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

func randGrads(rng *rand.Rand, n, l int) [][]float32 {
	g := make([][]float32, n)
	for r := range g {
		g[r] = randVec(rng, l)
	}
	return g
}

func clone2(x [][]float32) [][]float32 {
	out := make([][]float32, len(x))
	for i, v := range x {
		out[i] = append([]float32(nil), v...)
	}
	return out
}

// lowRank fills the segment's matrix view in g with U·Vᵀ of rank r.
func lowRank(rng *rand.Rand, g []float32, s models.Segment, r int) {
	rows := s.Shape[0]
	cols := s.Len / rows
	u, v := randVec(rng, rows*r), randVec(rng, cols*r)
	for i := range rows {
		for j := range cols {
			var x float64
			for k := range r {
				x += float64(u[i*r+k]) * float64(v[j*r+k])
			}
			g[s.Offset+i*cols+j] = float32(x)
		}
	}
}

func maxAbs(x []float32) float64 {
	m := 0.0
	for _, v := range x {
		m = max(m, math.Abs(float64(v)))
	}
	return m
}

// near fails unless got and want agree to tol·max|want| element-wise.
func near(t testing.TB, what string, got, want []float32, tol float64) {
	t.Helper()
	bound := tol * max(maxAbs(want), 1e-30)
	for i := range want {
		if d := math.Abs(float64(got[i]) - float64(want[i])); !(d <= bound) {
			t.Fatalf("%s[%d] = %v, want %v (|diff| %g > %g)", what, i, got[i], want[i], d, bound)
		}
	}
}

func bitIdentical(t testing.TB, grads [][]float32) {
	t.Helper()
	for r := 1; r < len(grads); r++ {
		for i := range grads[0] {
			if math.Float32bits(grads[r][i]) != math.Float32bits(grads[0][i]) {
				t.Fatalf("element %d: rank %d has %v, rank 0 has %v: not bit-identical", i, r, grads[r][i], grads[0][i])
			}
		}
	}
}

// kinds are the reducers under test, each compressing from step 0.
func kinds(segs []models.Segment) map[string]factory {
	return map[string]factory{
		"plain": func(r aggregator.Ring) (compress.Reducer, error) {
			return compress.NewPlain(r, aggregator.Options{MaxFrameElems: 64}, segs, 256), nil
		},
		"powersgd": func(r aggregator.Ring) (compress.Reducer, error) {
			return compress.NewPowerSGD(r, aggregator.Options{}, segs, 0, compress.PowerSGDConfig{Seed: 7})
		},
		"powersgd-cold": func(r aggregator.Ring) (compress.Reducer, error) {
			return compress.NewPowerSGD(r, aggregator.Options{}, segs, 0, compress.PowerSGDConfig{Rank: 1, NoWarmStart: true, NoErrorFeedback: true, Seed: 7})
		},
		"topk": func(r aggregator.Ring) (compress.Reducer, error) {
			return compress.NewTopK(r, aggregator.Options{MaxFrameElems: 16}, segs, 0, compress.TopKConfig{Ratio: 0.05})
		},
		"int8": func(r aggregator.Ring) (compress.Reducer, error) {
			return compress.NewInt8(r, aggregator.Options{}, segs, 0, compress.Int8Config{ChunkSize: 64, Seed: 3})
		},
		"fp16": func(r aggregator.Ring) (compress.Reducer, error) {
			return compress.NewCast(r, aggregator.Options{}, segs, 0, compress.FP16, compress.CastConfig{})
		},
		"bf16": func(r aggregator.Ring) (compress.Reducer, error) {
			return compress.NewCast(r, aggregator.Options{}, segs, 0, compress.BF16, compress.CastConfig{})
		},
	}
}

func name(kind string, n int) string { return fmt.Sprintf("%s/n=%d", kind, n) }
