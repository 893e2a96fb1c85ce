package server

import (
	"errors"
	"fmt"
	"time"

	"github.com/gradsync/gradsync/coordinator"
	"github.com/gradsync/gradsync/internal/runlog"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/paramserver"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
	"google.golang.org/protobuf/proto"
)

// startJobLocked carries out the core's Place of a pending job on
// workerIDs. What starting it involves outside memory — its run
// directory, its model's initial parameters, and for ps mode the
// parameter server (for a resume, loaded from the checkpoint) or for real
// federated clients the round driver — is made off the lock, as an
// effect; jobPreparedLocked then runs the job and sends the assignments.
func (s *Server) startJobLocked(e *jobEntry, workerIDs []string) {
	e.placed = workerIDs
	job := proto.Clone(e.job).(*pb.Job)
	started := s.cfg.Now()
	var fj *fedJob
	if jobspec.RealClients(job.Spec) {
		fj = &fedJob{s: s, e: e}
	}
	s.mu.later(func() {
		s.mu.offLock("preparing a job")
		p := s.prepareJob(job, workerIDs, started, fj)
		s.mu.within(func() { s.jobPreparedLocked(e, workerIDs, started, p) })
	})
}

// prepared is what a job needs to start, made off the lock.
type prepared struct {
	run    *runlog.Writer
	runErr error
	// numParams is the model's size; ps and fed are set for the modes
	// that have them.
	numParams int
	ps        *paramserver.Group
	fed       *fedJob
	// failure is why the job cannot start (its run directory is made).
	failure string
}

// prepareJob makes what job (generation 1 on world workers) needs to
// start; never under the lock.
func (s *Server) prepareJob(j *pb.Job, workerIDs []string, started time.Time, fj *fedJob) prepared {
	var p prepared
	world := len(workerIDs)
	spec := j.Spec
	if p.run, p.runErr = runlog.Create(j.RunDir, spec); p.runErr != nil {
		return p
	}
	// Workers check that they build the same number of parameters, so a
	// folder of images of another size fails with a clear error.
	c, h, w, classes := jobspec.InputShape(spec)
	net, err := models.New(spec.Model, models.Options{Channels: c, Height: h, Width: w, Classes: classes, Seed: spec.GetSeed()})
	if err != nil {
		p.failure = fmt.Sprintf("building model: %v", err)
		return p
	}
	p.numParams = net.NumParams()
	ckptDir := jobCheckpointDir(j)
	if spec.Mode == "ps" && len(spec.GetParameterServer().GetAddresses()) == 0 {
		// The server holds a ps job's state: it writes the checkpoints
		// and, for a resume, loads one.
		p.ps, err = paramserver.NewGroup(paramserver.Env{Now: s.cfg.Now, Log: s.log, Metrics: s.cfg.Metrics}, j.Id, 1, world, net, spec, ckptDir, j.ResumeFrom)
		if err != nil {
			what := "starting the parameter server"
			if j.ResumeFrom != "" {
				what = "resuming from checkpoint"
			}
			p.failure = fmt.Sprintf("%s: %v", what, err)
			return p
		}
	}
	if fj != nil {
		// The coordinator drives the rounds; each worker is one client.
		if err := s.newFedDriver(fj, j, workerIDs, net, ckptDir, started); err != nil {
			p.failure = fmt.Sprintf("starting the federated rounds: %v", err)
			return p
		}
		p.fed = fj
	}
	return p
}

// jobPreparedLocked runs a job placed on workerIDs once prepareJob made
// what it needs, unless it ended (was cancelled) meanwhile.
func (s *Server) jobPreparedLocked(e *jobEntry, workerIDs []string, started time.Time, p prepared) {
	j := e.job
	e.placed = nil
	if e.final() || s.closed {
		// Cancelled while it was being prepared (its workers were freed
		// then), or the server is stopping (it stays PENDING in the
		// store): drop what was made.
		if p.ps != nil {
			p.ps.Abort(errors.New("the job ended before it started"))
		}
		if p.fed != nil {
			p.fed.abort(errors.New("the job ended before it started"))
		}
		if p.run != nil && e.final() {
			run, sum := p.run, runlog.SummaryOf(proto.Clone(j).(*pb.Job))
			s.mu.later(func() {
				s.mu.offLock("writing a run summary")
				if err := run.Finish(sum); err != nil {
					s.log.Error("writing summary failed", "job", j.Id, "err", err)
				}
			})
		}
		return
	}
	if p.runErr != nil {
		s.setStateLocked(e, pb.JobState_JOB_STATE_FAILED, fmt.Sprintf("creating run directory: %v", p.runErr))
		s.mustStepLocked(coordinator.Released{At: s.cfg.Now(), Job: j.Id, Workers: workerIDs})
		return
	}
	e.run = p.run
	e.started = started
	j.Generation = 1
	j.WorkerIds = workerIDs
	s.setStateLocked(e, pb.JobState_JOB_STATE_RUNNING, fmt.Sprintf("running on %d worker(s)", len(workerIDs)))
	if p.failure != "" {
		s.endJobLocked(e, pb.JobState_JOB_STATE_FAILED, p.failure)
		return
	}
	e.numParams, e.ps = p.numParams, p.ps
	if p.fed != nil {
		e.fed = s.runFedJob(p.fed)
	}
	s.assignLocked(e, workerIDs)
}

// jobCheckpointDir is where a job's checkpoints go, or "" when it writes
// none.
func jobCheckpointDir(j *pb.Job) string {
	if jobspec.CheckpointsOn(j.Spec) {
		return checkpointDir(j.RunDir)
	}
	return ""
}

// assignLocked gives a running job's current generation to workerIDs, by
// rank: every worker its assignment (the job's parameter server or round
// driver, if it has one, is made at its start).
func (s *Server) assignLocked(e *jobEntry, workerIDs []string) {
	j := e.job
	spec := j.Spec
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
	var psAddrs []string
	if spec.Mode == "ps" && len(spec.GetParameterServer().GetAddresses()) > 0 {
		// The shards are `gradsync aggregator` processes, which learn
		// the job from the workers' joins.
		psAddrs = spec.GetParameterServer().GetAddresses()
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
			Spec: spec, Peers: peers, PsAddresses: psAddrs, NumParams: int64(e.numParams),
			CheckpointDir: jobCheckpointDir(j), ResumeFrom: j.ResumeFrom, TrainedSteps: e.recovery.Trained(),
		}}})
	}
}
