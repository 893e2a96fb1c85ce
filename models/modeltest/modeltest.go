// Package modeltest is the finite-difference gradient-check suite that
// every layer, loss and architecture in models is tested with.
//
// The analytic gradient of a scalar objective is compared, entry by entry,
// with the central difference (f(x+h) − f(x−h)) / ((x+h) − (x−h)), where
// the objective is accumulated in float64 and the denominator is the step
// actually taken after rounding x±h to float32. Large buffers are checked
// on a seeded random sample of entries (always including the first and
// last).
//
// Layers under test compute in float32, so the default tolerances are
// those of float32 arithmetic: |num − ana| ≤ ATol + RTol·max(|num|, |ana|).
// Where the central difference straddles a kink (a ReLU input within h of
// 0), an entry passes if the analytic value matches one of the one-sided
// differences instead; such entries are counted in the test log.
package modeltest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// Config tunes a check. The zero value uses the defaults noted per field.
type Config struct {
	Eps       float64 // step h, scaled by max(1, |x|); default 1e-2
	RTol      float64 // default 1e-2
	ATol      float64 // default 1e-3
	MaxChecks int     // entries checked per buffer; default 64; negative checks all
	Seed      uint64  // for the sampled entries and CheckLayer's projection
}

func (c Config) withDefaults() Config {
	if c.Eps == 0 {
		c.Eps = 1e-2
	}
	if c.RTol == 0 {
		c.RTol = 1e-2
	}
	if c.ATol == 0 {
		c.ATol = 1e-3
	}
	if c.MaxChecks == 0 {
		c.MaxChecks = 64
	}
	return c
}

// CheckGrad checks grad, the analytic gradient of f with respect to x,
// against central differences, reporting mismatches with t.Errorf under
// name. f evaluates the objective at the current contents of x (and must
// not modify x); CheckGrad perturbs x in place and restores it exactly.
// It returns whether every checked entry matched.
func CheckGrad(t testing.TB, name string, f func() float64, x, grad []float32, cfg Config) bool {
	t.Helper()
	cfg = cfg.withDefaults()
	if len(x) != len(grad) {
		t.Errorf("%s: len(x)=%d but len(grad)=%d", name, len(x), len(grad))
		return false
	}
	ok := true
	bad, kinks := 0, 0
	for _, i := range sample(len(x), cfg) {
		orig := x[i]
		h := cfg.Eps * max(1, math.Abs(float64(orig)))
		xp, xm := float32(float64(orig)+h), float32(float64(orig)-h)
		x[i] = xp
		fp := f()
		x[i] = xm
		fm := f()
		x[i] = orig
		num := (fp - fm) / (float64(xp) - float64(xm))
		ana := float64(grad[i])
		if !close(num, ana, cfg) {
			// Near a kink (a ReLU input within h of 0) the central
			// difference straddles it, but one of the one-sided
			// differences stays on x's side and must still match.
			f0 := f()
			fwd := (fp - f0) / (float64(xp) - float64(orig))
			bwd := (f0 - fm) / (float64(orig) - float64(xm))
			if close(fwd, ana, cfg) || close(bwd, ana, cfg) {
				kinks++
				continue
			}
			diff := math.Abs(num - ana)
			ok = false
			if bad++; bad <= 5 {
				t.Errorf("%s[%d]: analytic %.6g, numeric %.6g (diff %.3g)", name, i, ana, num, diff)
			}
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d mismatches in all", name, bad)
	}
	if kinks > 0 {
		t.Logf("%s: %d entries matched only a one-sided difference (kink within h)", name, kinks)
	}
	return ok
}

// close reports whether a numeric and an analytic derivative agree.
func close(num, ana float64, cfg Config) bool {
	return math.Abs(num-ana) <= cfg.ATol+cfg.RTol*max(math.Abs(num), math.Abs(ana))
}

// sample picks the indices to check: all of them, or MaxChecks distinct
// ones including the first and last, sorted.
func sample(n int, cfg Config) []int {
	if cfg.MaxChecks < 0 || n <= cfg.MaxChecks {
		idx := make([]int, n)
		for i := range idx {
			idx[i] = i
		}
		return idx
	}
	r := rand.New(rand.NewPCG(cfg.Seed, 0x6d6f64656c74))
	seen := map[int]bool{0: true, n - 1: true}
	for len(seen) < cfg.MaxChecks {
		seen[r.IntN(n)] = true
	}
	idx := make([]int, 0, len(seen))
	for i := range seen {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	return idx
}

// Layer is what CheckLayer drives: models.Layer's contract. Forward
// returns y for a batch x; Backward takes dy shaped like y, adds parameter
// gradients into the layer's gradient buffers and returns dx shaped like
// x, or nil when the layer does not compute input gradients.
type Layer interface {
	Forward(x []float32, batch int, train bool) []float32
	Backward(dy []float32) []float32
}

// Param is one parameter buffer of a layer with its gradient buffer.
type Param struct {
	Name        string
	Value, Grad []float32
}

// CheckLayer checks a layer's input gradient and parameter gradients on
// the objective L(x, θ) = Σ r ⊙ Forward(x) for a fixed random r, so that
// Backward(r) must return ∂L/∂x and accumulate ∂L/∂θ. The parameter
// gradient buffers are cleared first. It returns whether all matched.
func CheckLayer(t testing.TB, name string, l Layer, x []float32, batch int, params []Param, cfg Config) bool {
	t.Helper()
	y := l.Forward(x, batch, true)
	r := rand.New(rand.NewPCG(cfg.Seed, 0x72))
	proj := make([]float32, len(y))
	for i := range proj {
		proj[i] = float32(r.NormFloat64())
	}
	for _, p := range params {
		clear(p.Grad)
	}
	dx := slices.Clone(l.Backward(slices.Clone(proj)))
	grads := make([][]float32, len(params))
	for i, p := range params {
		grads[i] = slices.Clone(p.Grad)
	}
	f := func() float64 {
		y := l.Forward(x, batch, true)
		if len(y) != len(proj) {
			panic(fmt.Sprintf("modeltest: %s: output length changed from %d to %d", name, len(proj), len(y)))
		}
		var s float64
		for i, v := range y {
			s += float64(proj[i]) * float64(v)
		}
		return s
	}
	ok := true
	if dx != nil {
		ok = CheckGrad(t, name+" dx", f, x, dx, cfg) && ok
	}
	for i, p := range params {
		ok = CheckGrad(t, name+" "+p.Name, f, p.Value, grads[i], cfg) && ok
	}
	return ok
}
