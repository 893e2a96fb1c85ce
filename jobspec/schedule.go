package jobspec

import (
	"github.com/gradsync/gradsync/internal/optim"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Schedule is the learning-rate schedule of a normalized spec over a job of
// total optimiser steps.
func Schedule(spec *pb.JobSpec, total int64) optim.Schedule {
	base := spec.GetOptimizer().GetLr()
	sch := spec.GetLrSchedule()
	total = max(total, 1)
	switch sch.GetName() {
	case "cosine":
		return optim.Cosine{Base: base, Steps: int(total)}
	case "step":
		return optim.StepDecay{Base: base, Gamma: sch.GetGamma(), Every: int(sch.GetStepSize())}
	case "warmup-linear":
		return optim.WarmupLinear{Base: base, Warmup: int(sch.GetWarmupSteps()), Steps: int(total)}
	}
	return optim.Constant(base)
}

// LearningRate is the learning rate of a normalized spec at optimiser step
// (0-based) of total. It is a pure function, so every process that applies
// or reports it agrees.
func LearningRate(spec *pb.JobSpec, step, total int64) float64 {
	return Schedule(spec, total).LR(int(step))
}

// Stepper is an optimiser over flat buffers whose learning rate the
// schedule sets before each step.
type Stepper interface {
	Step(params, grads []float32)
	SetLR(lr float32)
}

// NewOptimizer builds the optimiser a normalized spec names, with torch's
// semantics.
func NewOptimizer(spec *pb.JobSpec) Stepper {
	o := spec.GetOptimizer()
	switch o.GetName() {
	case "adam", "adamw":
		a := optim.NewAdam(float32(o.GetLr()))
		if o.GetName() == "adamw" {
			a = optim.NewAdamW(float32(o.GetLr()))
		}
		if o.Beta1 != 0 {
			a.Beta1 = float32(o.Beta1)
		}
		if o.Beta2 != 0 {
			a.Beta2 = float32(o.Beta2)
		}
		if o.Eps != 0 {
			a.Eps = float32(o.Eps)
		}
		if o.WeightDecay != 0 {
			a.WeightDecay = float32(o.WeightDecay)
		}
		a.ClipNorm = float32(spec.GetGradClipNorm())
		return a
	}
	return &optim.SGD{LR: float32(o.GetLr()), Momentum: float32(o.GetMomentum()), WeightDecay: float32(o.GetWeightDecay()), Nesterov: o.GetNesterov(),
		ClipNorm: float32(spec.GetGradClipNorm())}
}

// StepBatch is how many examples one worker trains on per optimiser step:
// batch_size examples in each of grad_accum_steps micro-batches.
func StepBatch(spec *pb.JobSpec) int {
	return int(spec.GetBatchSize()) * int(max(spec.GetGradAccumSteps(), 1))
}
