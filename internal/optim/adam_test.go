package optim

import (
	"math"
	"testing"
)

// torchGrad is the gradient fed at step s to the reference runs below
// (scripts in the test comments): sin(1.3·s + i)·(i+1), with entry 3
// zeroed at step 2.
func torchGrad(s int) []float32 {
	g := make([]float32, 5)
	for i := range g {
		g[i] = float32(math.Sin(1.3*float64(s)+float64(i)) * float64(i+1))
	}
	if s == 2 {
		g[3] = 0
	}
	return g
}

// TestAdamMatchesTorch replays four steps of torch.optim.Adam/AdamW 1.13
// from p = [0.5, −1.25, 2, 0, −0.003] and compares every parameter.
func TestAdamMatchesTorch(t *testing.T) {
	cases := []struct {
		name string
		opt  *Adam
		want [4][5]float64
	}{
		{"adam", &Adam{LR: 0.1, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8}, [4][5]float64{
			{0.5, -1.350000023841858, 1.899999976158142, -0.10000000149011612, 0.09699999541044235},
			{0.4255863130092621, -1.4495044946670532, 1.846706748008728, -0.036648668348789215, 0.19713471829891205},
			{0.3447258472442627, -1.4976587295532227, 1.8655164241790771, 0.012322090566158295, 0.2546657919883728},
			{0.3196561336517334, -1.4915618896484375, 1.8958277702331543, 0.015556968748569489, 0.2526414096355438}}},
		{"adam weight decay", &Adam{LR: 0.05, Beta1: 0.8, Beta2: 0.99, Eps: 1e-6, WeightDecay: 0.1}, [4][5]float64{
			{0.4500010013580322, -1.2999999523162842, 1.9500000476837158, -0.0499999113380909, 0.04699999466538429},
			{0.4093110263347626, -1.349530577659607, 1.9223620891571045, -0.016032185405492783, 0.09719351679086685},
			{0.3664078116416931, -1.3659576177597046, 1.9323261976242065, 0.00859704241156578, 0.12266010046005249},
			{0.3545183539390564, -1.3524218797683716, 1.9473376274108887, 0.006632659584283829, 0.1153387725353241}}},
		{"adamw", NewAdamW(0.1), [4][5]float64{
			{0.49950000643730164, -1.3487499952316284, 1.8980000019073486, -0.10000000149011612, 0.09700299054384232},
			{0.42458683252334595, -1.4469057321548462, 1.8428088426589966, -0.0365486666560173, 0.19704070687294006},
			{0.34330177307128906, -1.4936131238937378, 1.8597757816314697, 0.012458641082048416, 0.25437474250793457},
			{0.3178887665271759, -1.486022710800171, 1.8882273435592651, 0.015681060031056404, 0.2520959973335266}}},
		{"adamw strong decay", &Adam{LR: 0.05, Beta1: 0.8, Beta2: 0.99, Eps: 1e-6, WeightDecay: 0.5, Decoupled: true}, [4][5]float64{
			{0.48750001192092896, -1.2687499523162842, 1.9000000953674316, -0.0499999113380909, 0.04707498475909233},
			{0.4361272156238556, -1.286620855331421, 1.8281927108764648, -0.014789760112762451, 0.09609340131282806},
			{0.38349077105522156, -1.2748355865478516, 1.796560525894165, 0.01018840167671442, 0.1192362904548645},
			{0.36495912075042725, -1.2336503267288208, 1.7710399627685547, 0.007939154282212257, 0.10902762413024902}}},
	}
	for _, c := range cases {
		if err := c.opt.Validate(); err != nil {
			t.Fatal(err)
		}
		p := []float32{0.5, -1.25, 2, 0, -0.003}
		for s := range 4 {
			c.opt.Step(p, torchGrad(s))
			for i, w := range c.want[s] {
				if math.Abs(float64(p[i])-w) > 2e-6*(1+math.Abs(w)) {
					t.Fatalf("%s step %d: p = %v, want %v", c.name, s+1, p, c.want[s])
				}
			}
		}
	}
}

func TestAdamState(t *testing.T) {
	a, b := NewAdam(0.01), NewAdam(0.01)
	p, q := []float32{1, 2, 3, 4, 5}, []float32{1, 2, 3, 4, 5}
	a.Step(p, torchGrad(0))
	b.Step(q, torchGrad(0))
	m, v, steps := a.State()
	c := NewAdam(0.01)
	c.SetState(m, v, steps)
	r := append([]float32(nil), p...)
	a.Step(p, torchGrad(1))
	c.Step(r, torchGrad(1))
	for i := range p {
		if p[i] != r[i] {
			t.Fatalf("resumed step gave %v, want %v", r, p)
		}
	}
	c.SetState(nil, nil, 0)
	if m, _, s := c.State(); m != nil || s != 0 {
		t.Fatal("SetState(nil) kept the moments")
	}
	if err := (&Adam{LR: -1, Beta1: 1, Beta2: 0.5, Eps: -1}).Validate(); err == nil {
		t.Fatal("bad settings validated")
	}
}

func TestClipGradNorm(t *testing.T) {
	// torch.nn.utils.clip_grad_norm_ on [3, −4, 12] with max 6.5: total 13,
	// grads scaled by 6.5/(13+1e-6).
	g := []float32{3, -4, 12}
	if total := ClipGradNorm(g, 6.5); total != 13 {
		t.Fatalf("total = %v, want 13", total)
	}
	want := []float32{1.4999998807907104, -1.9999998807907104, 5.999999523162842}
	for i := range g {
		if math.Abs(float64(g[i]-want[i])) > 1e-6 {
			t.Fatalf("clipped = %v, want %v", g, want)
		}
	}
	g = []float32{0.3, 0.4}
	if total := ClipGradNorm(g, 1); math.Abs(float64(total)-0.5) > 1e-7 || g[0] != 0.3 || g[1] != 0.4 {
		t.Fatalf("below the limit: total %v, grads %v changed", total, g)
	}
	g = []float32{float32(math.Inf(1)), 1}
	if total := ClipGradNorm(g, 1); !math.IsInf(float64(total), 1) || g[1] != 1 {
		t.Fatalf("infinite norm: total %v, grads %v", total, g)
	}
}

// TestSchedules compares with torch.optim.lr_scheduler (base LR 0.1).
func TestSchedules(t *testing.T) {
	cases := []struct {
		name string
		s    Schedule
		want []float64
	}{
		{"constant", Constant(0.1), []float64{0.1, 0.1, 0.1}},
		{"step", StepDecay{Base: 0.1, Gamma: 0.5, Every: 3},
			[]float64{0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.0125, 0.0125, 0.0125}},
		{"cosine", Cosine{Base: 0.1, Min: 0.001, Steps: 10}, []float64{0.1, 0.09757729755661011, 0.0905463412215599,
			0.07959536998847742, 0.0657963412215599, 0.0505, 0.03520365877844011, 0.02140463001152259,
			0.010453658778440109, 0.0034227024433899004, 0.001, 0.001 /* torch rises again: 0.00342 */}},
		{"warmup", Warmup{Then: Constant(0.1), Start: 0.25, Steps: 4},
			[]float64{0.025, 0.04375, 0.0625, 0.08125, 0.1, 0.1, 0.1}},
		{"warmup then cosine", Warmup{Then: Cosine{Base: 1, Steps: 4}, Steps: 2},
			[]float64{0, 0.5 * (1 + math.Cos(math.Pi/4)) / 2, 0.5, (1 + math.Cos(3*math.Pi/4)) / 2, 0, 0}},
	}
	for _, c := range cases {
		for step, w := range c.want {
			if got := c.s.LR(step); math.Abs(got-w) > 1e-12 {
				t.Errorf("%s: LR(%d) = %v, want %v", c.name, step, got, w)
			}
		}
	}
}
