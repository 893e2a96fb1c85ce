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
	// numParams is the model's size; ps, sums and fed are set for the
	// modes that have them.
	numParams int
	ps        *paramserver.Group
	sums      *paramserver.Sums
	fed       *fedJob
	// failure is why the job cannot start (its run directory is made).
	failure string
	// started is when the job was placed.
	started time.Time
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
	addrs := len(spec.GetParameterServer().GetAddresses()) > 0 // `gradsync aggregator` processes host the shards
	if spec.Mode == "ps" && jobspec.IsEntrypoint(spec) && !addrs {
		// The script keeps its parameters: the shards only sum its
		// calls, and learn its size from the layout it registers.
		p.sums = paramserver.NewSums(paramserver.Env{Now: s.cfg.Now, Log: s.log, Metrics: s.cfg.Metrics}, j.Id, 1, world,
			int(spec.GetParameterServer().GetShards()), time.Duration(spec.GetStepTimeoutSeconds()*float64(time.Second)))
	} else if spec.Mode == "ps" && !jobspec.IsEntrypoint(spec) && !addrs {
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
		// An entrypoint job's clients are scripts: the model is theirs
		// (their joins give its layout and initial parameters).
		if jobspec.IsEntrypoint(spec) {
			net = nil
		}
		if err := s.newFedDriver(fj, j, workerIDs, net, ckptDir, started); err != nil {
			p.failure = fmt.Sprintf("starting the federated rounds: %v", err)
			return p
		}
		p.fed = fj
	}
	return p
}

// jobPreparedLocked hands the core a placed job once prepareJob made
// what it needs: it runs it (SetState, StartGeneration, the Assigns) or,
// when it ended meanwhile, drops what was made (DropPrepared).
func (s *Server) jobPreparedLocked(e *jobEntry, workerIDs []string, started time.Time, p prepared) {
	p.started = started
	in := coordinator.Prepared{At: s.cfg.Now(), Job: e.job.Id, Failure: p.failure}
	if p.runErr != nil {
		in.RunDirErr = p.runErr.Error()
	}
	e.prep = &p
	defer func() { e.prep = nil }()
	s.mustStepLocked(in)
}

// dropPreparedLocked carries out the core's DropPrepared: the job was
// cancelled while it was being prepared (its workers were freed then),
// or the server is stopping (it stays PENDING in the store).
func (s *Server) dropPreparedLocked(e *jobEntry, ended bool) {
	p, j := e.prep, e.job
	if p == nil {
		return
	}
	if p.ps != nil {
		p.ps.Abort(errors.New("the job ended before it started"))
	}
	if p.sums != nil {
		p.sums.Abort(errors.New("the job ended before it started"))
	}
	if p.fed != nil {
		p.fed.abort(errors.New("the job ended before it started"))
	}
	if p.run != nil && ended {
		run, sum := p.run, runlog.SummaryOf(proto.Clone(j).(*pb.Job))
		s.mu.later(func() {
			s.mu.offLock("writing a run summary")
			if err := run.Finish(sum); err != nil {
				s.log.Error("writing summary failed", "job", j.Id, "err", err)
			}
		})
	}
}

// jobCheckpointDir is where a job's checkpoints go, or "" when it writes
// none.
func jobCheckpointDir(j *pb.Job) string {
	if jobspec.CheckpointsOn(j.Spec) || scriptCheckpoints(j.Spec) {
		return checkpointDir(j.RunDir)
	}
	return ""
}

// scriptCheckpoints reports whether a job's script saves its state into
// the job's checkpoint folder (gradsync.torch.save_checkpoint; the
// worker names the folder in GRADSYNC_CHECKPOINT_DIR): an entrypoint job
// in mode ring or ps. A fedavg job's scripts are clients: the rounds'
// state is the coordinator's.
func scriptCheckpoints(s *pb.JobSpec) bool {
	return jobspec.IsEntrypoint(s) && s.GetMode() != "fedavg"
}

// startGenerationLocked carries out the core's StartGeneration: the
// job's record of its ranks starts again; at the first generation the
// parameter server or round driver prepared for it takes over.
func (s *Server) startGenerationLocked(e *jobEntry, a coordinator.StartGeneration) {
	j := e.job
	if p := e.prep; p != nil && a.Generation == 1 {
		e.numParams, e.ps, e.sums = p.numParams, p.ps, p.sums
		if p.fed != nil {
			e.fed = s.runFedJob(p.fed)
		}
	}
	j.Generation = a.Generation
	j.WorkerIds = a.Workers
	j.ResumeFrom = a.ResumeFrom
	world := len(a.Workers)
	e.rankIPS = make([]float64, world)
	j.Ranks = make([]*pb.Progress, world)
	for r := range j.Ranks {
		j.Ranks[r] = &pb.Progress{}
	}
}

// assignLocked carries out the core's Assign: the worker's assignment of
// its rank (the job's parameter server or round driver, if it has one,
// is made at its start).
func (s *Server) assignLocked(e *jobEntry, a coordinator.Assign) {
	j := e.job
	spec := j.Spec
	var psAddrs []string
	if spec.Mode == "ps" && len(spec.GetParameterServer().GetAddresses()) > 0 {
		// The shards are `gradsync aggregator` processes, which learn
		// the job from the workers' joins.
		psAddrs = spec.GetParameterServer().GetAddresses()
	}
	s.sendLocked(a.Worker, &pb.ConnectResponse{Msg: &pb.ConnectResponse_Assignment{Assignment: &pb.Assignment{
		JobId: j.Id, Generation: a.Generation, Rank: int32(a.Rank), WorldSize: int32(len(a.Peers)),
		Spec: spec, Peers: a.Peers, PsAddresses: psAddrs, NumParams: int64(e.numParams),
		CheckpointDir: jobCheckpointDir(j), ResumeFrom: a.ResumeFrom, TrainedSteps: a.Trained,
	}}})
}
