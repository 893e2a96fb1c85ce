package optim

import (
	"errors"
	"fmt"
	"math"
)

// Adam is torch.optim.Adam (amsgrad off), and with Decoupled set
// torch.optim.AdamW, on a flat parameter buffer:
//
//	AdamW only:  p = p·(1 − LR·WeightDecay)
//	Adam only:   g = grad + WeightDecay·p
//	m = β1·m + (1−β1)·g
//	v = β2·v + (1−β2)·g²
//	p = p − (LR/(1−β1ᵗ)) · m / (√v/√(1−β2ᵗ) + Eps)
//
// with t the 1-based step count. Use NewAdam or NewAdamW for PyTorch's
// defaults. The moment buffers are created on the first Step and belong
// to the optimiser. An Adam is not safe for concurrent use.
type Adam struct {
	LR, Beta1, Beta2, Eps, WeightDecay float32
	// Decoupled selects AdamW's weight decay (applied to the parameters,
	// not added to the gradient).
	Decoupled bool
	// ClipNorm, if > 0, first scales grads in place so that their global
	// L2 norm is at most ClipNorm (ClipGradNorm).
	ClipNorm float32

	m, v []float32 // first and second moments; nil before the first step
	t    int       // steps taken
}

// NewAdam returns torch.optim.Adam's defaults with learning rate lr:
// betas (0.9, 0.999), eps 1e-8, no weight decay.
func NewAdam(lr float32) *Adam {
	return &Adam{LR: lr, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8}
}

// NewAdamW returns torch.optim.AdamW's defaults with learning rate lr:
// betas (0.9, 0.999), eps 1e-8, weight decay 0.01 (decoupled).
func NewAdamW(lr float32) *Adam {
	return &Adam{LR: lr, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, WeightDecay: 0.01, Decoupled: true}
}

// Validate reports settings torch.optim.Adam rejects.
func (o *Adam) Validate() error {
	var errs []error
	if o.LR < 0 {
		errs = append(errs, fmt.Errorf("optim: Adam learning rate %v < 0", o.LR))
	}
	if o.Eps < 0 {
		errs = append(errs, fmt.Errorf("optim: Adam epsilon %v < 0", o.Eps))
	}
	if !(o.Beta1 >= 0 && o.Beta1 < 1) || !(o.Beta2 >= 0 && o.Beta2 < 1) {
		errs = append(errs, fmt.Errorf("optim: Adam betas (%v, %v) outside [0, 1)", o.Beta1, o.Beta2))
	}
	if o.WeightDecay < 0 {
		errs = append(errs, fmt.Errorf("optim: Adam weight decay %v < 0", o.WeightDecay))
	}
	return errors.Join(errs...)
}

// SetLR changes the learning rate for the following steps (schedules).
func (o *Adam) SetLR(lr float32) { o.LR = lr }

// State returns the moment buffers and the number of steps taken; m and v
// are nil before the first step. They are owned by the optimiser: copy
// them to checkpoint them.
func (o *Adam) State() (m, v []float32, steps int) { return o.m, o.v, o.t }

// SetState replaces the moments with copies of m and v (same length) and
// the step count with steps, as saved from State; nil moments forget the
// state, so the next Step is a first step.
func (o *Adam) SetState(m, v []float32, steps int) {
	if m == nil || v == nil {
		o.m, o.v, o.t = nil, nil, 0
		return
	}
	if len(m) != len(v) || steps < 0 {
		panic(fmt.Sprintf("optim: Adam.SetState: len(m)=%d, len(v)=%d, steps=%d", len(m), len(v), steps))
	}
	o.m = append(o.m[:0], m...)
	o.v = append(o.v[:0], v...)
	o.t = steps
}

// Step updates params in place from grads (same length); grads is only
// read, unless ClipNorm scales it first. Explicit float32 conversions
// round each operation as PyTorch's separate tensor operations do.
func (o *Adam) Step(params, grads []float32) {
	if len(params) != len(grads) {
		panic(fmt.Sprintf("optim: Adam.Step: len(params)=%d != len(grads)=%d", len(params), len(grads)))
	}
	if o.ClipNorm > 0 {
		ClipGradNorm(grads, o.ClipNorm)
	}
	if o.m == nil {
		o.m = make([]float32, len(params))
		o.v = make([]float32, len(params))
	} else if len(o.m) != len(params) {
		panic(fmt.Sprintf("optim: Adam.Step: len(params)=%d but the moments have %d", len(params), len(o.m)))
	}
	o.t++
	b1, b2 := o.Beta1, o.Beta2
	// PyTorch computes these scalars in double precision.
	bc1 := 1 - math.Pow(float64(b1), float64(o.t))
	bc2 := 1 - math.Pow(float64(b2), float64(o.t))
	stepSize := float32(float64(o.LR) / bc1)
	bc2Sqrt := float32(math.Sqrt(bc2))
	decay := float32(1 - float64(o.LR)*float64(o.WeightDecay))
	m, v := o.m[:len(params)], o.v[:len(params)]
	for i, g := range grads {
		p := params[i]
		if o.WeightDecay != 0 {
			if o.Decoupled {
				p *= decay
			} else {
				g += float32(o.WeightDecay * p)
			}
		}
		mi := float32(m[i]*b1) + float32((1-b1)*g)
		vi := float32(v[i]*b2) + float32(float32((1-b2)*g)*g)
		m[i], v[i] = mi, vi
		denom := float32(float32(math.Sqrt(float64(vi)))/bc2Sqrt) + o.Eps
		params[i] = p - float32(stepSize*float32(mi/denom))
	}
}

// ClipGradNorm scales grads in place so that their global L2 norm is at
// most maxNorm, as torch.nn.utils.clip_grad_norm_ (norm type 2): with
// total = ‖grads‖₂, every gradient is multiplied by maxNorm/(total+1e-6)
// when that is below 1. It returns total, the norm before clipping
// (accumulated in float64), which may be NaN or Inf; then the gradients
// are left unchanged.
func ClipGradNorm(grads []float32, maxNorm float32) (total float32) {
	if maxNorm <= 0 {
		panic(fmt.Sprintf("optim: ClipGradNorm: max norm %v must be positive", maxNorm))
	}
	var ss float64
	for _, g := range grads {
		ss += float64(g) * float64(g)
	}
	total = float32(math.Sqrt(ss))
	coef := float32(float64(maxNorm) / (float64(total) + 1e-6))
	if coef < 1 && !math.IsNaN(float64(total)) && !math.IsInf(float64(total), 0) {
		for i := range grads {
			grads[i] *= coef
		}
	}
	return total
}
