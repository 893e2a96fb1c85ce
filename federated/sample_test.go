package federated

import (
	"slices"
	"testing"
)

func TestNumSampled(t *testing.T) {
	for _, c := range []struct {
		k    int
		c    float64
		want int
	}{{100, 0.1, 10}, {100, 0, 1}, {10, 0.01, 1}, {10, 1, 10}, {7, 0.5, 4}, {3, 0.5, 2}} {
		if got, err := NumSampled(c.k, c.c); err != nil || got != c.want {
			t.Errorf("NumSampled(%d, %v) = %d, %v; want %d", c.k, c.c, got, err, c.want)
		}
	}
	for _, c := range []struct {
		k int
		c float64
	}{{0, 0.5}, {10, -0.1}, {10, 1.5}} {
		if _, err := NumSampled(c.k, c.c); err == nil {
			t.Errorf("NumSampled(%d, %v) accepted", c.k, c.c)
		}
	}
}

func TestSampleClientsDeterministic(t *testing.T) {
	a, _ := SampleClients(100, 0.1, 42, 3)
	b, _ := SampleClients(100, 0.1, 42, 3)
	if !slices.Equal(a, b) {
		t.Fatalf("same (seed, round): %v and %v", a, b)
	}
	if len(a) != 10 || !slices.IsSorted(a) || len(slices.Compact(slices.Clone(a))) != 10 || a[0] < 0 || a[9] >= 100 {
		t.Fatalf("sample %v: want 10 distinct sorted IDs in [0, 100)", a)
	}
	c, _ := SampleClients(100, 0.1, 42, 4)
	d, _ := SampleClients(100, 0.1, 43, 3)
	if slices.Equal(a, c) || slices.Equal(a, d) {
		t.Fatalf("round or seed did not change the sample: %v %v %v", a, c, d)
	}
	if all, _ := SampleClients(5, 1, 1, 1); !slices.Equal(all, []int{0, 1, 2, 3, 4}) {
		t.Fatalf("C = 1: %v, want everyone", all)
	}
}

// Over many rounds every client is picked about R·m/K times, and every
// pair together about as often as independence predicts (chi-square with
// a fixed seed, so the test is deterministic).
func TestSampleClientsUniform(t *testing.T) {
	const k, rounds = 20, 20000
	const frac = 0.25 // m = 5
	counts := make([]int, k)
	pairs := make([]int, k*k)
	for r := range rounds {
		s, err := SampleClients(k, frac, 9, r+1)
		if err != nil {
			t.Fatal(err)
		}
		for i, a := range s {
			counts[a]++
			for _, b := range s[i+1:] {
				pairs[a*k+b]++
			}
		}
	}
	exp := float64(rounds) * 5 / k
	var chi float64
	for _, c := range counts {
		chi += (float64(c) - exp) * (float64(c) - exp) / exp
	}
	// 19 degrees of freedom: P(χ² > 43.8) = 0.001.
	if chi > 43.8 {
		t.Fatalf("client counts χ² = %.1f over 19 dof: %v", chi, counts)
	}
	expPair := float64(rounds) * (5 * 4) / (k * (k - 1))
	chi = 0
	for a := range k {
		for b := a + 1; b < k; b++ {
			d := float64(pairs[a*k+b]) - expPair
			chi += d * d / expPair
		}
	}
	// 190 pairs; the counts are not independent, so only a loose bound
	// (mean ≈ 190, sd ≈ 20).
	if chi > 300 {
		t.Fatalf("pair counts χ² = %.1f over 190 pairs", chi)
	}
}
