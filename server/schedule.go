package server

import (
	"fmt"

	"github.com/gradsync/gradsync/coordinator"
	"github.com/gradsync/gradsync/internal/runlog"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/paramserver"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// startJobLocked carries out the core's Place: it builds the job's
// initial parameters and parameter server, opens its run directory, and
// sends every worker its assignment.
func (s *Server) startJobLocked(e *jobEntry, workerIDs []string) {
	j := e.job
	run, err := runlog.Create(j.RunDir, j.Spec)
	if err != nil {
		s.setStateLocked(e, pb.JobState_JOB_STATE_FAILED, fmt.Sprintf("creating run directory: %v", err))
		s.mustStepLocked(coordinator.Released{At: s.cfg.Now(), Job: j.Id, Workers: workerIDs})
		return
	}
	e.run = run
	e.started = s.cfg.Now()
	j.Generation = 1
	j.WorkerIds = workerIDs
	s.setStateLocked(e, pb.JobState_JOB_STATE_RUNNING, fmt.Sprintf("running on %d worker(s)", len(workerIDs)))
	s.assignLocked(e, workerIDs)
}

// assignLocked gives a running job's current generation to workerIDs, by
// rank: the parameter server for ps mode, and every worker its assignment.
func (s *Server) assignLocked(e *jobEntry, workerIDs []string) {
	j := e.job
	spec := j.Spec
	// Workers check that they build the same number of parameters, so a
	// folder of images of another size fails with a clear error.
	c, h, w, classes := jobspec.InputShape(spec)
	net, err := models.New(spec.Model, models.Options{Channels: c, Height: h, Width: w, Classes: classes, Seed: spec.GetSeed()})
	if err != nil {
		s.endJobLocked(e, pb.JobState_JOB_STATE_FAILED, fmt.Sprintf("building model: %v", err))
		return
	}
	j.WorkerIds = workerIDs
	e.failed = nil
	world := len(workerIDs)
	e.ranksDone = make([]bool, world)
	e.rankIPS = make([]float64, world)
	j.Ranks = make([]*pb.Progress, world)
	for r := range j.Ranks {
		j.Ranks[r] = &pb.Progress{}
	}
	e.results = make([]*pb.JobResult, world)
	ckptDir := ""
	if jobspec.CheckpointsOn(spec) {
		ckptDir = checkpointDir(j.RunDir)
	}
	var psAddrs []string
	if spec.Mode == "ps" && len(spec.GetParameterServer().GetAddresses()) > 0 {
		// The shards are `gradsync aggregator` processes, which learn
		// the job from the workers' joins.
		psAddrs = spec.GetParameterServer().GetAddresses()
	} else if spec.Mode == "ps" {
		// The server holds a ps job's state: it writes the checkpoints
		// and, for a resume, loads one.
		e.ps, err = paramserver.NewGroup(paramserver.Env{Now: s.cfg.Now, Log: s.log, Metrics: s.cfg.Metrics}, j.Id, j.Generation, world, net, spec, ckptDir, j.ResumeFrom)
		if err != nil {
			what := "starting the parameter server"
			if j.ResumeFrom != "" {
				what = "resuming from checkpoint"
			}
			s.endJobLocked(e, pb.JobState_JOB_STATE_FAILED, fmt.Sprintf("%s: %v", what, err))
			return
		}
	}
	if jobspec.RealClients(spec) {
		// The coordinator drives the rounds; each worker is one client.
		if e.fed, err = s.newFedJob(e, net, ckptDir); err != nil {
			s.endJobLocked(e, pb.JobState_JOB_STATE_FAILED, fmt.Sprintf("starting the federated rounds: %v", err))
			return
		}
	}
	peers := make([]string, world)
	for r, id := range workerIDs {
		w, _ := s.workerLocked(id)
		peers[r] = w.Address
	}
	s.mustStepLocked(coordinator.Assigned{At: s.cfg.Now(), Job: j.Id, Workers: workerIDs})
	e.tasked = true
	for r, id := range workerIDs {
		s.sendLocked(id, &pb.ConnectResponse{Msg: &pb.ConnectResponse_Assignment{Assignment: &pb.Assignment{
			JobId: j.Id, Generation: j.Generation, Rank: int32(r), WorldSize: int32(world),
			Spec: spec, Peers: peers, PsAddresses: psAddrs, NumParams: int64(net.NumParams()),
			CheckpointDir: ckptDir, ResumeFrom: j.ResumeFrom, TrainedSteps: e.recovery.Trained(),
		}}})
	}
}
