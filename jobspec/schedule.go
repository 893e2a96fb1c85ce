package jobspec

import (
	"math"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// LearningRate is the learning rate of a normalized spec at optimiser step
// (0-based) of total. It is a pure function, so every process that applies
// or reports it agrees.
func LearningRate(spec *pb.JobSpec, step, total int64) float64 {
	base := spec.GetOptimizer().GetLr()
	sch := spec.GetLrSchedule()
	if total < 1 {
		total = 1
	}
	step = min(max(step, 0), total)
	switch sch.GetName() {
	case "cosine":
		return base * 0.5 * (1 + math.Cos(math.Pi*float64(step)/float64(total)))
	case "step":
		return base * math.Pow(sch.GetGamma(), float64(step/sch.GetStepSize()))
	case "warmup-linear":
		w := sch.GetWarmupSteps()
		if step < w {
			return base * float64(step+1) / float64(w)
		}
		return base * float64(total-step) / float64(max(total-w, 1))
	}
	return base
}
