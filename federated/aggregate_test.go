package federated

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// randomUpdates returns k updates of p values each with example counts in
// [1, 50] and 10-class label histograms consistent with them.
func randomUpdates(r *rand.Rand, k, p int) []Update {
	us := make([]Update, k)
	for i := range us {
		d := make([]float32, p)
		for j := range d {
			d[j] = float32(r.NormFloat64())
		}
		n := 1 + r.IntN(50)
		h := make([]int, 10)
		for range n {
			h[r.IntN(10)]++
		}
		us[i] = Update{Client: 3 * i, Delta: d, NumExamples: n, LabelHist: h}
	}
	return us
}

func mustStrategy(t *testing.T, cfg StrategyConfig) *Strategy {
	t.Helper()
	s, err := NewStrategy(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var allStrategies = []string{"fedavg", "fedprox", "fedavgm", "fedadam", "fedyogi", "median", "trimmed-mean"}

func TestEqualWeightsGiveTheMean(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, w := range []Weighting{WeightExamples, WeightUniform, WeightLabelBalanced} {
		us := randomUpdates(r, 7, 33)
		for i := range us {
			us[i].NumExamples = 10
			us[i].LabelHist = []int{4, 6} // identical mixes: label-balanced is equal too
		}
		global := make([]float32, 33)
		st, err := mustStrategy(t, StrategyConfig{Weighting: w}).Aggregate(global, us)
		if err != nil {
			t.Fatal(err)
		}
		for j := range global {
			var s float64
			for _, u := range us {
				s += float64(u.Delta[j])
			}
			if want := float32(s / 7); math.Abs(float64(global[j]-want)) > 1e-6 {
				t.Fatalf("%v: global[%d] = %v, want the mean %v", w, j, global[j], want)
			}
		}
		for _, x := range st.Weights {
			if math.Abs(x-1.0/7) > 1e-12 {
				t.Fatalf("%v: weights %v, want all 1/7", w, st.Weights)
			}
		}
	}
}

func TestAggregateOrderFree(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, name := range allStrategies {
		for _, w := range []Weighting{WeightExamples, WeightUniform, WeightLabelBalanced} {
			us := randomUpdates(r, 9, 101)
			init := make([]float32, 101)
			for j := range init {
				init[j] = float32(r.NormFloat64())
			}
			var ref []float32
			for trial := range 5 {
				s := mustStrategy(t, StrategyConfig{Name: name, Weighting: w})
				g := slices.Clone(init)
				for range 3 { // several rounds: optimiser state must agree too
					if _, err := s.Aggregate(g, us); err != nil {
						t.Fatal(err)
					}
				}
				if trial == 0 {
					ref = g
				} else if !bitsEqual(g, ref) {
					t.Fatalf("%s/%v: shuffled clients gave different bits", name, w)
				}
				r.Shuffle(len(us), func(i, j int) { us[i], us[j] = us[j], us[i] })
			}
		}
	}
}

func bitsEqual(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

func TestOneClientIsIdentity(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, name := range []string{"fedavg", "median", "trimmed-mean"} {
		for _, w := range []Weighting{WeightExamples, WeightUniform, WeightLabelBalanced} {
			us := randomUpdates(r, 1, 50)
			g := make([]float32, 50)
			for j := range g {
				g[j] = float32(j) / 8 // exact, so g + Δ is one rounding
			}
			want := make([]float32, 50)
			for j := range want {
				want[j] = g[j] + us[0].Delta[j]
			}
			if _, err := mustStrategy(t, StrategyConfig{Name: name, Weighting: w}).Aggregate(g, us); err != nil {
				t.Fatal(err)
			}
			if !bitsEqual(g, want) {
				t.Fatalf("%s/%v: one client: got %v, want global + its delta %v", name, w, g[:4], want[:4])
			}
		}
	}
}

func TestAggregateErrors(t *testing.T) {
	s := mustStrategy(t, StrategyConfig{})
	g := []float32{1, 2}
	if _, err := s.Aggregate(g, nil); !errors.Is(err, ErrNoUpdates) {
		t.Errorf("no updates: %v, want ErrNoUpdates", err)
	}
	zero := []Update{{Client: 0, Delta: []float32{1, 1}}, {Client: 1, Delta: []float32{2, 2}}}
	for _, w := range []Weighting{WeightExamples, WeightUniform} {
		if _, err := mustStrategy(t, StrategyConfig{Weighting: w}).Aggregate(g, zero); !errors.Is(err, ErrNoExamples) {
			t.Errorf("%v: 0 examples: %v, want ErrNoExamples", w, err)
		}
	}
	var inv *InvalidUpdateError
	for name, us := range map[string][]Update{
		"short delta":   {{Client: 0, Delta: []float32{1}, NumExamples: 1}},
		"NaN":           {{Client: 0, Delta: []float32{1, float32(math.NaN())}, NumExamples: 1}},
		"negative n":    {{Client: 0, Delta: []float32{1, 1}, NumExamples: -1}},
		"bad histogram": {{Client: 0, Delta: []float32{1, 1}, NumExamples: 3, LabelHist: []int{1, 1}}},
		// Multi-label: a class has at most one positive per example.
		"multi-label count above n": {{Client: 0, Delta: []float32{1, 1}, NumExamples: 2, LabelHist: []int{3, 0}, MultiLabel: true}},
		"duplicate":                 {{Client: 4, Delta: []float32{1, 1}, NumExamples: 1}, {Client: 4, Delta: []float32{1, 1}, NumExamples: 1}},
	} {
		if _, err := s.Aggregate(g, us); !errors.As(err, &inv) {
			t.Errorf("%s: %v, want *InvalidUpdateError", name, err)
		}
	}
	// A multi-label histogram counts an example once per label: its sum
	// may exceed the examples.
	ml := []Update{{Client: 0, Delta: []float32{1, 1}, NumExamples: 2, LabelHist: []int{2, 1}, MultiLabel: true}}
	if _, err := s.Aggregate(slices.Clone(g), ml); err != nil {
		t.Errorf("a multi-label histogram summing to 3 over 2 examples: %v", err)
	}
	lb := mustStrategy(t, StrategyConfig{Weighting: WeightLabelBalanced})
	if _, err := lb.Aggregate(g, []Update{{Client: 0, Delta: []float32{1, 1}, NumExamples: 1}}); !errors.As(err, &inv) {
		t.Errorf("label-balanced without a histogram: %v, want *InvalidUpdateError", err)
	}
	if g[0] != 1 || g[1] != 2 {
		t.Errorf("failed aggregations changed global to %v", g)
	}
	if _, err := NewStrategy(StrategyConfig{Name: "fedsgd"}); err == nil {
		t.Error("unknown strategy accepted")
	}
}

func TestRobustRulesIgnoreOneOutlier(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	us := randomUpdates(r, 9, 20)
	for i := range us {
		for j := range us[i].Delta {
			us[i].Delta[j] = 1 + 0.01*us[i].Delta[j]
		}
	}
	for j := range us[4].Delta {
		us[4].Delta[j] = 1e30
	}
	for _, name := range []string{"median", "trimmed-mean"} {
		g := make([]float32, 20)
		if _, err := mustStrategy(t, StrategyConfig{Name: name, TrimFraction: 0.2}).Aggregate(g, us); err != nil {
			t.Fatal(err)
		}
		for j, v := range g {
			if math.Abs(float64(v)-1) > 0.05 {
				t.Fatalf("%s: coordinate %d = %v with one outlier at 1e30, want ≈ 1", name, j, v)
			}
		}
	}
	g := make([]float32, 20)
	if _, err := mustStrategy(t, StrategyConfig{}).Aggregate(g, us); err != nil {
		t.Fatal(err)
	}
	if g[0] < 1e20 {
		t.Fatalf("the mean resisted the outlier (%v): the test data is not adversarial", g[0])
	}
}

func TestMedianAndTrimmedMeanValues(t *testing.T) {
	mk := func(vals ...float32) []Update {
		us := make([]Update, len(vals))
		for i, v := range vals {
			us[i] = Update{Client: i, Delta: []float32{v}, NumExamples: 1}
		}
		return us
	}
	for _, c := range []struct {
		name string
		cfg  StrategyConfig
		vals []float32
		want float32
	}{
		{"median odd", StrategyConfig{Name: "median"}, []float32{5, -1, 3}, 3},
		{"median even", StrategyConfig{Name: "median"}, []float32{4, 1, 2, 10}, 3},
		{"trim 0.25 of 4", StrategyConfig{Name: "trimmed-mean", TrimFraction: 0.25}, []float32{4, 1, 2, 10}, 3},
		{"trim 0.2 of 4 drops none", StrategyConfig{Name: "trimmed-mean", TrimFraction: 0.2}, []float32{4, 1, 2, 10}, 4.25},
	} {
		g := []float32{0}
		if _, err := mustStrategy(t, c.cfg).Aggregate(g, mk(c.vals...)); err != nil {
			t.Fatal(err)
		}
		if g[0] != c.want {
			t.Errorf("%s: %v, want %v", c.name, g[0], c.want)
		}
	}
}

func TestLabelBalancedWeights(t *testing.T) {
	// Client 0 holds 90 of class 0; clients 1 and 2 hold 5 of class 1 and
	// 5 of class 2. Each class gets total weight 1: weights 1, 1, 1.
	us := []Update{
		{Client: 0, Delta: []float32{1}, NumExamples: 90, LabelHist: []int{90, 0, 0}},
		{Client: 1, Delta: []float32{2}, NumExamples: 5, LabelHist: []int{0, 5, 0}},
		{Client: 2, Delta: []float32{3}, NumExamples: 5, LabelHist: []int{0, 0, 5}},
	}
	g := []float32{0}
	st, err := mustStrategy(t, StrategyConfig{Weighting: WeightLabelBalanced}).Aggregate(g, us)
	if err != nil {
		t.Fatal(err)
	}
	if g[0] != 2 || !slices.Equal(st.Weights, []float64{1.0 / 3, 1.0 / 3, 1.0 / 3}) {
		t.Fatalf("global %v weights %v, want 2 and equal thirds", g[0], st.Weights)
	}
	// Proportional (IID-like) histograms: same as example weighting.
	us = []Update{
		{Client: 0, Delta: []float32{1}, NumExamples: 30, LabelHist: []int{10, 20}},
		{Client: 1, Delta: []float32{4}, NumExamples: 60, LabelHist: []int{20, 40}},
	}
	a, b := []float32{0}, []float32{0}
	if _, err := mustStrategy(t, StrategyConfig{Weighting: WeightLabelBalanced}).Aggregate(a, us); err != nil {
		t.Fatal(err)
	}
	if _, err := mustStrategy(t, StrategyConfig{}).Aggregate(b, us); err != nil {
		t.Fatal(err)
	}
	if math.Abs(float64(a[0]-3)) > 1e-6 || b[0] != 3 {
		t.Fatalf("proportional histograms: label-balanced %v, by examples %v, want 3", a[0], b[0])
	}
}

// The adaptive steps, worked by hand for global [1, 2] and Δ = [0.5, −1]
// with η = 0.1, β1 = 0.9, β2 = 0.99, τ = 1e-3 (v starts at τ² = 1e-6):
//
//	m = 0.1·Δ = [0.05, −0.1]
//	Adam: v = 0.99e-6 + 0.01·Δ² = [0.00250099, 0.01000099]
//	Yogi: v = 1e-6 + 0.01·Δ² (Δ² > v) = [0.002501, 0.010001]
//	x = x + 0.1·m/(√v + 1e-3)
func TestAdaptiveHandComputed(t *testing.T) {
	for _, c := range []struct {
		name string
		want [2]float64
	}{
		// 1 + 0.005/(0.0500099 + 0.001), 2 − 0.01/(0.1000049 + 0.001)
		{"fedadam", [2]float64{1 + 0.005/(math.Sqrt(0.00250099)+0.001), 2 - 0.01/(math.Sqrt(0.01000099)+0.001)}},
		{"fedyogi", [2]float64{1 + 0.005/(math.Sqrt(0.002501)+0.001), 2 - 0.01/(math.Sqrt(0.010001)+0.001)}},
	} {
		g := []float32{1, 2}
		s := mustStrategy(t, StrategyConfig{Name: c.name, ServerLR: 0.1})
		if _, err := s.Aggregate(g, []Update{{Client: 0, Delta: []float32{0.5, -1}, NumExamples: 1}}); err != nil {
			t.Fatal(err)
		}
		// Hand values: 1.0980, 1.9010.
		for j, w := range c.want {
			if math.Abs(float64(g[j])-w) > 1e-6 {
				t.Errorf("%s: x[%d] = %.7f, want %.7f", c.name, j, g[j], w)
			}
		}
		if math.Abs(float64(g[0])-1.0980) > 1e-4 || math.Abs(float64(g[1])-1.9010) > 1e-4 {
			t.Errorf("%s: x = %v, want ≈ [1.0980 1.9010]", c.name, g)
		}
	}
	// A second Yogi step with a small Δ: Δ² < v, so v shrinks additively
	// (Adam's would shrink multiplicatively): v = 0.002501 − 0.01·0.0001.
	y := &Adaptive{Yogi: true, LR: 0.1}
	g := []float32{0}
	y.Step(g, []float32{0.5})
	y.Step(g, []float32{0.01})
	if want := 0.002501 - 0.01*0.0001; math.Abs(float64(y.v[0])-want) > 1e-9 {
		t.Errorf("yogi v after a small Δ = %v, want %v", y.v[0], want)
	}
}

func TestServerMomentum(t *testing.T) {
	o := &ServerMomentum{LR: 0.5, Momentum: 0.9}
	g := []float32{0}
	o.Step(g, []float32{1}) // v = 1, x = 0.5
	o.Step(g, []float32{1}) // v = 1.9, x = 0.5 + 0.95
	if math.Abs(float64(g[0])-1.45) > 1e-6 {
		t.Fatalf("x = %v, want 1.45", g[0])
	}
}
