package coordinator

import (
	"fmt"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Final reports whether a job in state s has ended for good.
func Final(s pb.JobState) bool {
	return s == pb.JobState_JOB_STATE_SUCCEEDED || s == pb.JobState_JOB_STATE_FAILED || s == pb.JobState_JOB_STATE_CANCELLED
}

// Transition checks one step of the job lifecycle: PENDING → RUNNING →
// SUCCEEDED | FAILED | CANCELLED, where a pending job may also fail (its
// run directory cannot be made) or be cancelled, and nothing leaves a
// final state. A refused step is a bug in the caller, not bad input.
func Transition(from, to pb.JobState) error {
	ok := false
	switch from {
	case pb.JobState_JOB_STATE_PENDING:
		ok = to == pb.JobState_JOB_STATE_RUNNING || to == pb.JobState_JOB_STATE_FAILED || to == pb.JobState_JOB_STATE_CANCELLED
	case pb.JobState_JOB_STATE_RUNNING:
		ok = Final(to)
	}
	if !ok {
		return fmt.Errorf("coordinator: no job goes from %v to %v", from, to)
	}
	return nil
}

// Elastic reports whether a job recovers from lost workers: a ring job
// with min_workers < workers. Its ranks keep in-memory snapshots, so it
// needs no checkpoints (they are a fallback when no survivor holds a
// snapshot).
func Elastic(spec *pb.JobSpec) bool {
	return spec.GetMode() == "ring" && spec.GetMinWorkers() < spec.GetWorkers()
}
