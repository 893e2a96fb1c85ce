package jobspec

import (
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// StepBatch is how many examples one worker trains on per optimiser step:
// batch_size examples in each of grad_accum_steps micro-batches.
func StepBatch(spec *pb.JobSpec) int {
	return int(spec.GetBatchSize()) * int(max(spec.GetGradAccumSteps(), 1))
}
