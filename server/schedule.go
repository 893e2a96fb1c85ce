package server

import (
	"fmt"
	"slices"
	"sort"

	"github.com/gradsync/gradsync/coordinator"
	"github.com/gradsync/gradsync/internal/runlog"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/paramserver"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// scheduleLocked starts every queued job the FIFO gang scheduler places.
func (s *Server) scheduleLocked() {
	if s.closed {
		return
	}
	// One job at a time (FIFO as before): an entrypoint job may only be
	// placed on workers that run commands (--allow-entrypoints).
	for len(s.queue) > 0 {
		e := s.jobs[s.queue[0]]
		idle := s.idleLocked()
		if jobspec.IsEntrypoint(e.job.Spec) {
			idle = slices.DeleteFunc(idle, func(id string) bool { return !s.workers[id].info.GetResources().GetAllowsEntrypoints() })
		}
		placed := coordinator.Schedule([]coordinator.Pending{{Job: e.job.Id, Workers: int(e.job.Spec.GetWorkers())}}, idle)
		if len(placed) == 0 {
			break
		}
		s.queue = s.queue[1:]
		s.startJobLocked(e, placed[0].Workers)
	}
	// Idle workers nobody queued for: elastic jobs running below their
	// size grow onto them (from their latest checkpoint).
	if len(s.queue) == 0 {
		for _, e := range s.jobs {
			if e.job.State == pb.JobState_JOB_STATE_RUNNING && !e.recovery.Rejoining() && !e.recovery.Pinning() && !slices.Contains(e.ranksDone, true) &&
				len(e.job.WorkerIds) < int(e.job.Spec.GetWorkers()) && coordinator.Elastic(e.job.Spec) {
				s.recoverLocked(e, nil, "", "")
			}
		}
	}
}

// idleLocked lists the idle workers in the order they are picked: by
// connection time, then id.
func (s *Server) idleLocked() []string {
	var idle []*workerEntry
	for _, w := range s.workers {
		if w.info.State == pb.WorkerState_WORKER_STATE_IDLE {
			idle = append(idle, w)
		}
	}
	sort.Slice(idle, func(a, b int) bool {
		if !idle[a].connected.Equal(idle[b].connected) {
			return idle[a].connected.Before(idle[b].connected)
		}
		return idle[a].info.Id < idle[b].info.Id
	})
	ids := make([]string, len(idle))
	for i, w := range idle {
		ids[i] = w.info.Id
	}
	return ids
}

// startJobLocked builds the job's initial parameters and parameter server,
// opens its run directory, and sends every worker its assignment.
func (s *Server) startJobLocked(e *jobEntry, workerIDs []string) {
	j := e.job
	run, err := runlog.Create(j.RunDir, j.Spec)
	if err != nil {
		s.setStateLocked(e, pb.JobState_JOB_STATE_FAILED, fmt.Sprintf("creating run directory: %v", err))
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
		peers[r] = s.workers[id].info.Address
	}
	for r, id := range workerIDs {
		w := s.workers[id]
		w.info.State = pb.WorkerState_WORKER_STATE_BUSY
		w.info.JobId = j.Id
		w.send(&pb.ConnectResponse{Msg: &pb.ConnectResponse_Assignment{Assignment: &pb.Assignment{
			JobId: j.Id, Generation: j.Generation, Rank: int32(r), WorldSize: int32(world),
			Spec: spec, Peers: peers, PsAddresses: psAddrs, NumParams: int64(net.NumParams()),
			CheckpointDir: ckptDir, ResumeFrom: j.ResumeFrom, TrainedSteps: e.recovery.Trained(),
		}}})
	}
}
