package optim

import (
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// This file maps a normalized job spec (jobspec.Normalize) to the
// optimiser and learning-rate schedule it names, so that every place that
// steps or reports a learning rate (ring ranks, parameter-server shards,
// progress reports) asks one package.

// ScheduleOf is the learning-rate schedule of a normalized spec over a job of
// total optimiser steps.
func ScheduleOf(spec *pb.JobSpec, total int64) Schedule {
	base := spec.GetOptimizer().GetLr()
	sch := spec.GetLrSchedule()
	total = max(total, 1)
	switch sch.GetName() {
	case "cosine":
		return Cosine{Base: base, Steps: int(total)}
	case "step":
		return StepDecay{Base: base, Gamma: sch.GetGamma(), Every: int(sch.GetStepSize())}
	case "warmup-linear":
		return WarmupLinear{Base: base, Warmup: int(sch.GetWarmupSteps()), Steps: int(total)}
	}
	return Constant(base)
}

// LearningRate is the learning rate of a normalized spec at optimiser step
// (0-based) of total. It is a pure function, so every process that applies
// or reports it agrees.
func LearningRate(spec *pb.JobSpec, step, total int64) float64 {
	return ScheduleOf(spec, total).LR(int(step))
}

// Stepper is an optimiser over flat buffers whose learning rate the
// schedule sets before each step.
type Stepper interface {
	Step(params, grads []float32)
	SetLR(lr float32)
}

// FromSpec builds the optimiser a normalized spec names, with torch's
// semantics.
func FromSpec(spec *pb.JobSpec) Stepper {
	o := spec.GetOptimizer()
	switch o.GetName() {
	case "adam", "adamw":
		a := NewAdam(float32(o.GetLr()))
		if o.GetName() == "adamw" {
			a = NewAdamW(float32(o.GetLr()))
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
	return &SGD{LR: float32(o.GetLr()), Momentum: float32(o.GetMomentum()), WeightDecay: float32(o.GetWeightDecay()), Nesterov: o.GetNesterov(),
		ClipNorm: float32(spec.GetGradClipNorm())}
}
