package modeltest

import (
	"fmt"
	"testing"
)

// recorder is a testing.TB that records failures instead of failing.
type recorder struct {
	testing.TB
	errors []string
}

func (r *recorder) Helper()                         {}
func (r *recorder) Logf(format string, args ...any) {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func TestCheckGradCatchesWrongGradient(t *testing.T) {
	x := []float32{0.5, -1, 2, 3}
	f := func() float64 { // Σ x³
		var s float64
		for _, v := range x {
			s += float64(v) * float64(v) * float64(v)
		}
		return s
	}
	good := []float32{0.75, 3, 12, 27}
	if rec := (&recorder{TB: t}); !CheckGrad(rec, "good", f, x, good, Config{}) || len(rec.errors) != 0 {
		t.Fatalf("correct gradient rejected: %v", rec.errors)
	}
	bad := []float32{0.75, 3, 12.5, 27}
	rec := &recorder{TB: t}
	if CheckGrad(rec, "bad", f, x, bad, Config{}) || len(rec.errors) != 1 {
		t.Fatalf("wrong gradient at index 2 not reported exactly once: %v", rec.errors)
	}
	if x[2] != 2 {
		t.Fatalf("x not restored: %v", x)
	}
}

func TestCheckGradKink(t *testing.T) {
	x := []float32{0.004} // within h = 1e-2 of ReLU's kink
	f := func() float64 { return float64(max(x[0], 0)) }
	if rec := (&recorder{TB: t}); !CheckGrad(rec, "relu", f, x, []float32{1}, Config{}) {
		t.Fatalf("one-sided derivative at a kink rejected: %v", rec.errors)
	}
	if rec := (&recorder{TB: t}); CheckGrad(rec, "relu", f, x, []float32{0.5}, Config{}) {
		t.Fatal("the central difference (0.7) accepted at a kink; only one-sided values 0 or 1 should pass")
	}
}

// scale is a toy layer y = w ⊙ x with a per-feature weight w.
type scale struct {
	w, dw []float32
	x     []float32
	dx    []float32
	bug   bool // drop the weight gradient's x factor
}

func (l *scale) Forward(x []float32, batch int, train bool) []float32 {
	l.x = x
	y := make([]float32, len(x))
	for i := range x {
		y[i] = l.w[i%len(l.w)] * x[i]
	}
	return y
}

func (l *scale) Backward(dy []float32) []float32 {
	l.dx = make([]float32, len(dy))
	for i := range dy {
		j := i % len(l.w)
		l.dx[i] = dy[i] * l.w[j]
		if l.bug {
			l.dw[j] += dy[i]
		} else {
			l.dw[j] += dy[i] * l.x[i]
		}
	}
	return l.dx
}

func TestCheckLayer(t *testing.T) {
	for _, bug := range []bool{false, true} {
		l := &scale{w: []float32{0.5, -2, 3}, dw: make([]float32, 3), bug: bug}
		x := []float32{1, 2, 3, -4, 5, 6}
		rec := &recorder{TB: t}
		ok := CheckLayer(rec, "scale", l, x, 2, []Param{{Name: "w", Value: l.w, Grad: l.dw}}, Config{MaxChecks: -1})
		if ok == bug {
			t.Errorf("bug=%v: CheckLayer returned %v (errors %v)", bug, ok, rec.errors)
		}
	}
}

func TestSample(t *testing.T) {
	idx := sample(1000, Config{MaxChecks: 10}.withDefaults())
	if len(idx) != 10 || idx[0] != 0 || idx[9] != 999 {
		t.Fatalf("sample = %v, want 10 sorted indices including 0 and 999", idx)
	}
	if got := sample(5, Config{MaxChecks: 10}.withDefaults()); len(got) != 5 {
		t.Fatalf("sample of 5 = %v", got)
	}
}
