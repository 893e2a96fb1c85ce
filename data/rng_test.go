package data

import (
	"math"
	"testing"
)

func TestRNGMoments(t *testing.T) {
	const n = 200000
	for name, draw := range map[string]func(*rng) float64{
		"normal":       (*rng).normal,
		"approxNormal": (*rng).approxNormal,
		"uniform":      func(r *rng) float64 { return (r.float64() - 0.5) * math.Sqrt(12) },
	} {
		r := newRNG(1, 0)
		var sum, ss float64
		for range n {
			x := draw(&r)
			sum += x
			ss += x * x
		}
		m, v := sum/n, ss/n-(sum/n)*(sum/n)
		if math.Abs(m) > 0.01 || math.Abs(v-1) > 0.02 {
			t.Errorf("%s: mean %.4f, variance %.4f; want 0, 1", name, m, v)
		}
	}
}

func TestRNGDirichlet(t *testing.T) {
	r := newRNG(2, 0)
	p := make([]float64, 5)
	for _, alpha := range []float64{1e-3, 0.1, 1, 10, 1000} {
		mean := make([]float64, 5)
		for range 2000 {
			r.dirichlet(p, alpha)
			sum := 0.0
			for i, v := range p {
				if !(v >= 0) {
					t.Fatalf("α=%v: component %v", alpha, v)
				}
				sum += v
				mean[i] += v / 2000
			}
			if math.Abs(sum-1) > 1e-9 {
				t.Fatalf("α=%v: components sum to %v", alpha, sum)
			}
		}
		for i, m := range mean {
			if math.Abs(m-0.2) > 0.05 {
				t.Errorf("α=%v: E[p%d] = %.3f, want 0.2", alpha, i, m)
			}
		}
	}
}

func TestRNGIntn(t *testing.T) {
	r := newRNG(3, 0)
	var counts [7]int
	for range 70000 {
		counts[r.intn(7)]++
	}
	for k, c := range counts {
		if c < 9500 || c > 10500 {
			t.Errorf("intn(7) gave %d %d times in 70000, want about 10000", k, c)
		}
	}
}
