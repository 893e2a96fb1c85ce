package optim

import (
	"math"
	"slices"
	"strings"
	"testing"
)

func TestSGDHandComputed(t *testing.T) {
	// p=1, g=0.5, lr=0.1, momentum=0.9, wd=0.1:
	// step 1: g'=0.5+0.1·1=0.6, buf=0.6, p=1−0.06=0.94
	// step 2: g'=0.5+0.094=0.594, buf=0.54+0.594=1.134, p=0.94−0.1134=0.8266
	o := &SGD{LR: 0.1, Momentum: 0.9, WeightDecay: 0.1}
	p, g := []float32{1}, []float32{0.5}
	o.Step(p, g)
	if !near(p[0], 0.94) || !near(o.State()[0], 0.6) {
		t.Fatalf("step 1: p=%v buf=%v, want 0.94, 0.6", p, o.State())
	}
	o.Step(p, g)
	if !near(p[0], 0.8266) || !near(o.State()[0], 1.134) {
		t.Fatalf("step 2: p=%v buf=%v, want 0.8266, 1.134", p, o.State())
	}
	// Nesterov, p=1, g=1, lr=0.5, momentum=0.5: buf=1, g'=1+0.5=1.5, p=0.25;
	// then buf=0.5+1=1.5, g'=1+0.75=1.75, p=0.25−0.875=−0.625.
	n := &SGD{LR: 0.5, Momentum: 0.5, Nesterov: true}
	p = []float32{1}
	n.Step(p, []float32{1})
	if p[0] != 0.25 {
		t.Fatalf("nesterov step 1: p=%v, want 0.25", p)
	}
	n.Step(p, []float32{1})
	if p[0] != -0.625 {
		t.Fatalf("nesterov step 2: p=%v, want -0.625", p)
	}
}

func near(a, b float32) bool { return math.Abs(float64(a-b)) <= 1e-6*(1+math.Abs(float64(b))) }

// Fixtures from torch 1.13 (torch.optim.SGD, float32), printed with %.9g
// by a script that set p.grad to each row of sgdGrads in turn.
var (
	sgdP0    = []float32{0.5, -1.25, 2.0, 0.0, 3.5}
	sgdGrads = [][]float32{{0.1, -0.2, 0.3, 0.0, 1.5}, {-0.4, 0.25, 0.0, 1.0, -2.0}, {0.05, 0.5, -0.75, 0.125, 0.0}, {1.0, -1.0, 0.5, -0.5, 0.25}}
)

func TestSGDMatchesPyTorch(t *testing.T) {
	cases := []struct {
		name  string
		opt   SGD
		newLR float32 // if non-zero, SetLR(newLR) before the third step
		want  [][]float32
		buf   []float32
	}{
		{"plain", SGD{LR: 0.1}, 0, [][]float32{{0.49000001, -1.23000002, 1.97000003, 0.0, 3.3499999}, {0.530000031, -1.255, 1.97000003, -0.100000001, 3.54999995}, {0.525000036, -1.30499995, 2.04500008, -0.112500004, 3.54999995}, {0.425000042, -1.20499992, 1.99500012, -0.0625, 3.52499986}}, nil},
		{"momentum", SGD{LR: 0.05, Momentum: 0.9}, 0, [][]float32{{0.495000005, -1.24000001, 1.98500001, 0.0, 3.42499995}, {0.510500014, -1.24349999, 1.97150004, -0.0500000007, 3.45749998}, {0.521950006, -1.27164996, 1.99685001, -0.10125, 3.48674989}, {0.482255012, -1.24698496, 1.99466503, -0.122374997, 3.50057483}}, []float32{0.793900013, -0.493300021, 0.0437000394, 0.422499955, -0.276500046}},
		{"momentum_wd", SGD{LR: 0.05, Momentum: 0.9, WeightDecay: 0.01}, 0, [][]float32{{0.494749993, -1.239375, 1.98399997, 0.0, 3.42324996}, {0.509777606, -1.24169278, 1.96860802, -0.0500000007, 3.45246339}, {0.520547569, -1.26815796, 1.9912709, -0.101225004, 3.47702909}, {0.47998026, -1.24134254, 1.98567188, -0.122276887, 3.48489976}}, []float32{0.811345994, -0.536308289, 0.111980617, 0.421037734, -0.157414287}},
		{"nesterov_wd", SGD{LR: 0.1, Momentum: 0.8, WeightDecay: 0.1, Nesterov: true}, 0, [][]float32{{0.47299999, -1.19149995, 1.90999997, 0.0, 3.16700006}, {0.526885986, -1.19425297, 1.84361994, -0.179999992, 3.35159397}, {0.523294866, -1.25449085, 1.90761077, -0.263260007, 3.30427647}, {0.339217722, -1.06965435, 1.78921545, -0.226569325, 3.18875813}}, []float32{0.98555243, -0.903645277, 0.616490722, 0.199274004, 0.718443155}},
		{"wd_only", SGD{LR: 0.2, WeightDecay: 0.5}, 0, [][]float32{{0.430000007, -1.08500004, 1.74000001, 0.0, 2.8499999}, {0.467000008, -1.02649999, 1.56599998, -0.200000003, 2.96499991}, {0.410300016, -1.02384996, 1.55939996, -0.204999998, 2.66849995}, {0.169270009, -0.721464992, 1.30346, -0.0844999924, 2.35165}}, nil},
		{"set_lr", SGD{LR: 0.1, Momentum: 0.5}, 0.01, [][]float32{{0.49000001, -1.23000002, 1.97000003, 0.0, 3.3499999}, {0.525000036, -1.245, 1.95500004, -0.100000001, 3.4749999}, {0.526250064, -1.25074995, 1.96175003, -0.106250003, 3.48124981}, {0.516875088, -1.24362493, 1.96012509, -0.104375005, 3.4818747}}, []float32{0.9375, -0.712499976, 0.162499994, -0.1875, -0.0625}},
	}
	for _, c := range cases {
		o := c.opt
		if err := o.Validate(); err != nil {
			t.Fatal(err)
		}
		p := slices.Clone(sgdP0)
		for s, g := range sgdGrads {
			if s == 2 && c.newLR != 0 {
				o.SetLR(c.newLR)
			}
			o.Step(p, g)
			for i := range p {
				// PyTorch's kernels may fuse multiply-adds; allow a few ulps.
				if math.Abs(float64(p[i]-c.want[s][i])) > 4e-7*(1+math.Abs(float64(c.want[s][i]))) {
					t.Fatalf("%s step %d: p=%v, want %v", c.name, s+1, p, c.want[s])
				}
			}
		}
		if (o.State() == nil) != (c.buf == nil) {
			t.Fatalf("%s: State()=%v, want %v", c.name, o.State(), c.buf)
		}
		for i := range c.buf {
			if math.Abs(float64(o.State()[i]-c.buf[i])) > 4e-7*(1+math.Abs(float64(c.buf[i]))) {
				t.Fatalf("%s: buf=%v, want %v", c.name, o.State(), c.buf)
			}
		}
	}
}

// TestSGDStateRoundTrip checks that restoring a saved momentum buffer into
// a fresh optimiser continues the exact same trajectory.
func TestSGDStateRoundTrip(t *testing.T) {
	a := &SGD{LR: 0.05, Momentum: 0.9, WeightDecay: 0.01, Nesterov: true}
	p := slices.Clone(sgdP0)
	a.Step(p, sgdGrads[0])
	a.Step(p, sgdGrads[1])
	saved := slices.Clone(a.State())
	q := slices.Clone(p)
	b := &SGD{LR: 0.05, Momentum: 0.9, WeightDecay: 0.01, Nesterov: true}
	b.SetState(saved)
	for _, g := range sgdGrads[2:] {
		a.Step(p, g)
		b.Step(q, g)
	}
	if !slices.Equal(p, q) || !slices.Equal(a.State(), b.State()) {
		t.Fatalf("resumed trajectory differs: %v vs %v", p, q)
	}
	b.SetState(nil)
	if b.State() != nil {
		t.Fatal("SetState(nil) kept the buffer")
	}
}

func TestSGDValidate(t *testing.T) {
	err := (&SGD{LR: -1, Nesterov: true}).Validate()
	if err == nil || !strings.Contains(err.Error(), "learning rate") || !strings.Contains(err.Error(), "Nesterov") {
		t.Fatalf("Validate() = %v", err)
	}
	if err := (&SGD{LR: 0.1, Momentum: 0.9, Nesterov: true}).Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestSGDPanicsOnShape(t *testing.T) {
	for name, f := range map[string]func(){
		"lengths": func() { (&SGD{LR: 1}).Step(make([]float32, 2), make([]float32, 3)) },
		"buffer": func() {
			o := &SGD{LR: 1, Momentum: 0.5}
			o.Step(make([]float32, 2), make([]float32, 2))
			o.Step(make([]float32, 3), make([]float32, 3))
		},
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if s, _ := recover().(string); !strings.HasPrefix(s, "optim: ") {
					t.Fatalf("recovered %q, want an \"optim: \" panic", s)
				}
			}()
			f()
		})
	}
}

func BenchmarkSGDStep(b *testing.B) {
	o := &SGD{LR: 0.01, Momentum: 0.9, WeightDecay: 5e-4}
	p, g := make([]float32, 235146), make([]float32, 235146)
	b.ReportAllocs()
	b.SetBytes(int64(len(p) * 4))
	for b.Loop() {
		o.Step(p, g)
	}
}
