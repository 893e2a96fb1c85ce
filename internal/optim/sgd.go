// Package optim holds the optimisers that update a network's flat
// parameter buffer from its flat gradient buffer.
//
// Optimisers follow PyTorch's update rules exactly (same formulas, same
// order of operations, same state), so a run can be compared with, or
// resumed from, a PyTorch one. Shape bugs panic with an "optim: " prefix.
package optim

import (
	"errors"
	"fmt"
)

// SGD is stochastic gradient descent with optional momentum, weight decay
// and Nesterov momentum, matching torch.optim.SGD with dampening 0:
//
//	g = grad + WeightDecay·p
//	buf = g on the first step, else Momentum·buf + g      (when Momentum ≠ 0)
//	g = g + Momentum·buf if Nesterov, else buf            (when Momentum ≠ 0)
//	p = p − LR·g
//
// The zero value with LR set is plain SGD. The momentum buffer is created
// on the first Step and belongs to the optimiser. An SGD is not safe for
// concurrent use.
type SGD struct {
	LR, Momentum, WeightDecay float32
	Nesterov                  bool
	// ClipNorm, if > 0, first scales grads in place so that their global
	// L2 norm is at most ClipNorm (ClipGradNorm, as
	// torch.nn.utils.clip_grad_norm_ before optimizer.step()).
	ClipNorm float32

	buf []float32 // momentum buffer, same length as params; nil before the first step or without momentum
}

// Validate reports settings torch.optim.SGD rejects.
func (o *SGD) Validate() error {
	var errs []error
	if o.LR < 0 {
		errs = append(errs, fmt.Errorf("optim: SGD learning rate %v < 0", o.LR))
	}
	if o.Momentum < 0 {
		errs = append(errs, fmt.Errorf("optim: SGD momentum %v < 0", o.Momentum))
	}
	if o.WeightDecay < 0 {
		errs = append(errs, fmt.Errorf("optim: SGD weight decay %v < 0", o.WeightDecay))
	}
	if o.Nesterov && o.Momentum <= 0 {
		errs = append(errs, errors.New("optim: SGD Nesterov momentum requires a momentum > 0"))
	}
	return errors.Join(errs...)
}

// SetLR changes the learning rate for the following steps (schedules).
func (o *SGD) SetLR(lr float32) { o.LR = lr }

// State returns the momentum buffer (same layout as the parameters), or
// nil before the first step or when Momentum is 0. It is owned by the
// optimiser: copy it to checkpoint it.
func (o *SGD) State() []float32 { return o.buf }

// SetState replaces the momentum buffer with a copy of buf (a checkpoint's
// State), or forgets it when buf is nil, so that the next Step starts
// momentum afresh from the gradient as on a first step.
func (o *SGD) SetState(buf []float32) {
	if buf == nil {
		o.buf = nil
		return
	}
	o.buf = append(o.buf[:0], buf...)
}

// Step updates params in place from grads (same length); grads is only
// read. Explicit float32 conversions round every product as PyTorch's
// separate tensor operations do, so Go's compiler cannot fuse them.
func (o *SGD) Step(params, grads []float32) {
	if len(params) != len(grads) {
		panic(fmt.Sprintf("optim: SGD.Step: len(params)=%d != len(grads)=%d", len(params), len(grads)))
	}
	if o.ClipNorm > 0 {
		ClipGradNorm(grads, o.ClipNorm)
	}
	lr, mom, wd := o.LR, o.Momentum, o.WeightDecay
	if mom == 0 {
		for i, g := range grads {
			if wd != 0 {
				g += float32(wd * params[i])
			}
			params[i] -= float32(lr * g)
		}
		return
	}
	first := o.buf == nil
	if first {
		o.buf = make([]float32, len(params))
	} else if len(o.buf) != len(params) {
		panic(fmt.Sprintf("optim: SGD.Step: len(params)=%d but the momentum buffer has %d", len(params), len(o.buf)))
	}
	buf := o.buf[:len(params)]
	if !first && wd == 0 && !o.Nesterov {
		momentumStep(params, grads, buf, lr, mom)
		return
	}
	for i, g := range grads {
		if wd != 0 {
			g += float32(wd * params[i])
		}
		b := g
		if !first {
			b = float32(mom*buf[i]) + g
		}
		buf[i] = b
		if o.Nesterov {
			g += float32(mom * b)
		} else {
			g = b
		}
		params[i] -= float32(lr * g)
	}
}

// momentumStep is Step's common case (momentum after the first step, no
// weight decay, no Nesterov) without per-element branches:
// buf = mom·buf + g; p = p − lr·buf.
func momentumStep(params, grads, buf []float32, lr, mom float32) {
	grads, buf = grads[:len(params)], buf[:len(params)]
	for i, g := range grads {
		b := float32(mom*buf[i]) + g
		buf[i] = b
		params[i] -= float32(lr * b)
	}
}
