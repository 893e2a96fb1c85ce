package server

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/paramserver"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// The coordinator hosts the parameter server of its ps jobs whose spec
// names no `gradsync aggregator` processes: package paramserver serves
// it; these handlers only find the job's group.

// Sync serves one worker's push/pull stream for one shard of a job whose
// shards the coordinator hosts (see ps.proto).
func (s *Server) Sync(stream pb.ParameterServer_SyncServer) error {
	join, err := paramserver.RecvJoin(stream)
	if err != nil {
		return err
	}
	g, err := s.psGroup(join.JobId)
	if err != nil {
		return err
	}
	return g.Serve(stream, join)
}

// Reduce serves one worker's stream for one summation shard of an
// entrypoint job in mode ps (see paramserver.Sums).
func (s *Server) Reduce(stream pb.ParameterServer_ReduceServer) error {
	join, err := paramserver.RecvReduceJoin(stream)
	if err != nil {
		return err
	}
	s.mu.Lock()
	e := s.jobs[join.JobId]
	var g *paramserver.Sums
	var state pb.JobState
	if e != nil {
		g, state = e.sums, e.job.State
	}
	s.mu.Unlock()
	switch {
	case e == nil:
		return status.Errorf(codes.NotFound, "job %q not found", join.JobId)
	case state != pb.JobState_JOB_STATE_RUNNING || g == nil:
		return status.Errorf(codes.FailedPrecondition, "job %s is not an entrypoint job running in mode ps on this coordinator", join.JobId)
	}
	return g.Serve(stream, join)
}

// Pull streams a snapshot of a running ps job's parameters, whose shards
// the coordinator hosts (see paramserver.Group.Pull).
func (s *Server) Pull(req *pb.PullRequest, stream pb.ParameterServer_PullServer) error {
	g, err := s.psGroup(req.JobId)
	if err != nil {
		return err
	}
	return g.Pull(stream)
}

// psGroup is the parameter server of a running job that the coordinator
// hosts.
func (s *Server) psGroup(jobID string) (*paramserver.Group, error) {
	s.mu.Lock()
	e := s.jobs[jobID]
	var g *paramserver.Group
	var state pb.JobState
	if e != nil {
		g, state = e.ps, e.job.State
	}
	s.mu.Unlock()
	switch {
	case e == nil:
		return nil, status.Errorf(codes.NotFound, "job %q not found", jobID)
	case state != pb.JobState_JOB_STATE_RUNNING || g == nil:
		return nil, status.Errorf(codes.FailedPrecondition, "job %s is not running on this parameter server", jobID)
	}
	return g, nil
}

// addPSStaleness adds a progress report's staleness figures to its
// metrics.jsonl record, for ps jobs with consistency async or bounded.
func addPSStaleness(rec map[string]any, spec *pb.JobSpec, p *pb.Progress) {
	if spec.GetMode() != "ps" || spec.GetParameterServer().GetConsistency() == jobspec.PSSync {
		return
	}
	rec["ps_stale_steps_mean"], rec["ps_stale_steps_max"] = p.PsStaleStepsMean, p.PsStaleStepsMax
	rec["ps_stale_updates_mean"], rec["ps_stale_updates_max"] = p.PsStaleUpdatesMean, p.PsStaleUpdatesMax
	rec["ps_wait_seconds"], rec["ps_refused"] = p.PsWaitSeconds, p.PsRefused
}
