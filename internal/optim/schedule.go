package optim

import (
	"fmt"
	"math"
)

// Schedule gives the learning rate for a 0-based step. Schedules are pure
// functions of the step: resuming at step s needs no other state.
type Schedule interface {
	LR(step int) float64
}

// Constant is a fixed learning rate.
type Constant float64

// LR returns the rate itself.
func (c Constant) LR(int) float64 { return float64(c) }

// StepDecay multiplies Base by Gamma every Every steps, as
// torch.optim.lr_scheduler.StepLR: Base·Gamma^⌊step/Every⌋.
type StepDecay struct {
	Base, Gamma float64
	Every       int
}

// LR returns Base·Gamma^⌊step/Every⌋.
func (s StepDecay) LR(step int) float64 {
	if s.Every < 1 {
		panic(fmt.Sprintf("optim: StepDecay.Every = %d, want ≥ 1", s.Every))
	}
	return s.Base * math.Pow(s.Gamma, float64(max(step, 0)/s.Every))
}

// Cosine anneals from Base to Min over Steps steps, as
// torch.optim.lr_scheduler.CosineAnnealingLR's closed form:
// Min + (Base−Min)·(1+cos(π·step/Steps))/2. Unlike PyTorch's, which rises
// again after Steps, it stays at Min from then on.
type Cosine struct {
	Base, Min float64
	Steps     int
}

// LR returns the annealed rate.
func (c Cosine) LR(step int) float64 {
	if c.Steps < 1 {
		panic(fmt.Sprintf("optim: Cosine.Steps = %d, want ≥ 1", c.Steps))
	}
	t := min(max(step, 0), c.Steps)
	return c.Min + (c.Base-c.Min)*(1+math.Cos(math.Pi*float64(t)/float64(c.Steps)))/2
}

// Warmup scales another schedule by a factor rising linearly from Start
// at step 0 to 1 at step Steps, as torch.optim.lr_scheduler.LinearLR with
// start_factor Start and total_iters Steps (chained onto Then):
// factor = Start + (1−Start)·min(step, Steps)/Steps. A zero Start begins
// at a rate of 0.
type Warmup struct {
	Then  Schedule
	Start float64
	Steps int
}

// LR returns the warmed-up rate of Then.
func (w Warmup) LR(step int) float64 {
	if w.Steps < 1 {
		panic(fmt.Sprintf("optim: Warmup.Steps = %d, want ≥ 1", w.Steps))
	}
	f := w.Start + (1-w.Start)*float64(min(max(step, 0), w.Steps))/float64(w.Steps)
	return f * w.Then.LR(step)
}

// WarmupLinear rises linearly over Warmup steps to Base (step s < Warmup
// gets Base·(s+1)/Warmup), then decays linearly to 0 at step Steps, as
// transformers' get_linear_schedule_with_warmup.
type WarmupLinear struct {
	Base          float64
	Warmup, Steps int
}

// LR returns the rate at step.
func (w WarmupLinear) LR(step int) float64 {
	step = min(max(step, 0), w.Steps)
	if step < w.Warmup {
		return w.Base * float64(step+1) / float64(w.Warmup)
	}
	return w.Base * float64(w.Steps-step) / float64(max(w.Steps-w.Warmup, 1))
}
