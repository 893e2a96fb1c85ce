package main

import pb "github.com/gradsync/gradsync/proto/gradsync/v1"

// applyPipelineFlags sets the spec's parallelism from the pipeline flags
// that were given (ch: whether a flag was), over the job file's.
func applyPipelineFlags(spec *pb.JobSpec, f *specFlags, ch func(string) bool) {
	if !ch("pipeline-stages") && !ch("micro-batches") && !ch("schedule") && !ch("pipeline-schedule") &&
		!ch("data-parallel") && !ch("pipeline-boundaries") && !ch("pipeline-balance") && !ch("debug-stage-cost") {
		return
	}
	if spec.Parallelism == nil {
		spec.Parallelism = &pb.ParallelismSpec{}
	}
	par := spec.Parallelism
	if par.Pipeline == nil {
		par.Pipeline = &pb.PipelineSpec{}
	}
	p := par.Pipeline
	if ch("pipeline-stages") {
		p.Stages = f.stages
	}
	if ch("micro-batches") {
		p.MicroBatches = f.microBatches
	}
	if ch("schedule") || ch("pipeline-schedule") {
		p.Schedule = f.schedule
	}
	if ch("data-parallel") {
		par.Data = f.dataPar
	}
	if ch("pipeline-boundaries") {
		p.Boundaries = f.boundaries
	}
	if ch("pipeline-balance") {
		p.Balance = f.balance
	}
	if ch("debug-stage-cost") {
		p.DebugStageCost = f.stageCost
	}
}

// defaultWorkers is how many workers `local` starts for a spec that does
// not say: one per stage (label shard, tensor rank) of every data replica (the
// spec's default too).
func defaultWorkers(spec *pb.JobSpec) int {
	p := spec.GetParallelism()
	return int(max(p.GetData(), 1) * max(p.GetPipeline().GetStages(), 1) * max(p.GetLabelShards(), 1) * max(p.GetTensor(), 1))
}
