package main

import pb "github.com/gradsync/gradsync/proto/gradsync/v1"

// applyTensorFlags sets the spec's model-parallel strategies of package
// tensorpar from the flags that were given (ch: whether a flag was), over
// the job file's: --label-shards, --tensor-parallel.
func applyTensorFlags(spec *pb.JobSpec, f *specFlags, ch func(string) bool) {
	if !ch("label-shards") && !ch("tensor-parallel") {
		return
	}
	if spec.Parallelism == nil {
		spec.Parallelism = &pb.ParallelismSpec{}
	}
	if ch("label-shards") {
		spec.Parallelism.LabelShards = f.labelShards
	}
	if ch("tensor-parallel") {
		spec.Parallelism.Tensor = f.tensor
	}
}
