package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/coordinator"
	"github.com/gradsync/gradsync/internal/runlog"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/paramserver"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// maxEvents bounds the events kept per job for watchers that join late.
const maxEvents = 4096

// jobEntry is the server's record of one job. All fields are guarded by
// Server.mu.
type jobEntry struct {
	job *pb.Job
	// version counts the job's store writes (persistLocked).
	version uint64
	// events[i] is event number base+i; notify is closed (and replaced)
	// whenever an event is appended.
	events []*pb.WatchJobResponse
	base   int
	notify chan struct{}
	// announced: the final state's event is in events (watches end).
	announced bool
	// While RUNNING:
	ps       *paramserver.Group
	sums     *paramserver.Sums // an entrypoint job in mode ps: its script's summation shards
	fed      *fedJob           // fedavg with real clients: the round driver (federation.go)
	run      *runlog.Writer
	rankIPS  []float64
	lastEval *pb.TaskEval
	started  time.Time
	// stopped is made when a running job ends and closed when the core
	// says every task of it has stopped (TasksStopped; see awaitStopped).
	// A ring job's rank 0 writes the checkpoint a resume starts from as
	// its task stops.
	stopped chan struct{}
	// prep is what prepareJob made, while the core's answer to Prepared
	// is carried out; numParams is its model's size.
	prep      *prepared
	numParams int
}

func newJobEntry(j *pb.Job) *jobEntry {
	return &jobEntry{job: j, notify: make(chan struct{})}
}

func (e *jobEntry) final() bool { return coordinator.Final(e.job.State) }

// tasksStoppedLocked carries out the core's TasksStopped: a cancel
// waiting for the job's tasks returns.
func (e *jobEntry) tasksStoppedLocked() {
	if e.stopped == nil {
		return
	}
	select {
	case <-e.stopped:
	default:
		close(e.stopped)
	}
}

// abort stops the job's parameter server (if any) so every stream waiting on
// it returns.
func (e *jobEntry) abort(err error) {
	if e.ps != nil {
		e.ps.Abort(err)
	}
	if e.sums != nil {
		e.sums.Abort(err)
	}
	if e.fed != nil {
		e.fed.abort(err)
	}
}

// checkpointStoppedLocked writes the checkpoint of a ps job or a fedavg
// job with real clients that stops early (after abort): the parameter
// server's state after its last step, or the global model and server
// optimiser after the last closed round, so a resume loses nothing (ring
// jobs' rank 0 and the fedavg simulation do this themselves). The
// outcome is logged and announced as a job event: a failed write is not
// silent, but does not change how the job ended.
func (s *Server) checkpointStoppedLocked(e *jobEntry) {
	var save func(time.Time) (string, error)
	switch {
	case e.ps != nil:
		save = e.ps.SaveStopped
	case e.fed != nil:
		save = e.fed.d.SaveStopped
	default:
		return
	}
	// The shards and the round driver have their own locks: write off the
	// server's, then say how it went.
	now := s.cfg.Now()
	s.mu.later(func() {
		s.mu.offLock("a checkpoint save")
		path, err := save(now)
		s.mu.within(func() { s.stopCheckpointedLocked(e, path, err) })
	})
}

// stopCheckpointedLocked logs and announces how the checkpoint at stop went.
func (s *Server) stopCheckpointedLocked(e *jobEntry, path string, err error) {
	switch {
	case err != nil:
		s.log.Warn("checkpoint at stop failed", "job", e.job.Id, "err", err)
		s.emitLocked(e, pb.EventKind_EVENT_KIND_LOG, fmt.Sprintf("writing a checkpoint as the job stopped failed: %v", err), nil)
	case path != "":
		s.log.Info("checkpoint written as the job stopped", "job", e.job.Id, "path", path)
		s.emitLocked(e, pb.EventKind_EVENT_KIND_LOG, "checkpoint written as the job stopped: "+path, nil)
	}
}

func tsNow(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }

// sortJobs orders jobs newest first (ties by id, for a stable listing).
func sortJobs(js []*pb.Job) {
	sort.Slice(js, func(a, b int) bool {
		ta, tb := js[a].GetCreatedAt().AsTime(), js[b].GetCreatedAt().AsTime()
		if !ta.Equal(tb) {
			return ta.After(tb)
		}
		return js[a].Id > js[b].Id
	})
}

func newJobID(now time.Time) string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return "job-" + now.UTC().Format("20060102-150405") + "-" + hex.EncodeToString(b[:])
}

// emitLocked appends an event to a job and wakes its watchers.
func (s *Server) emitLocked(e *jobEntry, kind pb.EventKind, msg string, fill func(*pb.WatchJobResponse)) {
	ev := &pb.WatchJobResponse{Kind: kind, Time: tsNow(s.cfg.Now()), Job: proto.Clone(e.job).(*pb.Job), Message: msg}
	if fill != nil {
		fill(ev)
	}
	e.events = append(e.events, ev)
	if kind == pb.EventKind_EVENT_KIND_STATE && e.final() {
		e.announced = true
	}
	if len(e.events) > maxEvents {
		drop := len(e.events) - maxEvents
		e.events = append(e.events[:0:0], e.events[drop:]...)
		e.base += drop
	}
	close(e.notify)
	e.notify = make(chan struct{})
}

// persistLocked queues a write of the job's current state to the store.
func (s *Server) persistLocked(e *jobEntry) {
	e.version++
	j, v := proto.Clone(e.job).(*pb.Job), e.version
	s.mu.later(func() {
		if err := s.putJob(j, v); err != nil {
			s.log.Error("job store write failed", "job", j.Id, "err", err)
		}
	})
}

// putJob writes a job to the store; never under the lock.
func (s *Server) putJob(j *pb.Job, version uint64) error {
	s.mu.offLock("a job store write")
	return s.store.putJob(j, version)
}

// runLogLocked queues a record for the job's metrics.jsonl (nothing once
// the run is finished). Records queued by one goroutine keep their order.
func (s *Server) runLogLocked(e *jobEntry, rec map[string]any) {
	if e.run == nil {
		return
	}
	run := e.run
	s.mu.later(func() {
		s.mu.offLock("a run-log append")
		_ = run.Log(rec)
	})
}

// setStateLocked moves a job to a new state, stores it, and announces it.
// The store write runs as the lock is released, before the call that
// caused it returns: a client's answer is durable. A final state is
// announced (the event that ends every watch) only after its store
// write and the run's summary.json: what watchers see at the end is on
// disk.
func (s *Server) setStateLocked(e *jobEntry, st pb.JobState, msg string) {
	s.changeStateLocked(e, st, msg)
	if coordinator.Final(st) {
		s.announceLocked(e, msg)
	} else {
		s.emitLocked(e, pb.EventKind_EVENT_KIND_STATE, msg, nil)
	}
}

// announceLocked queues the event of a job's final state, behind the
// disk work queued before it.
func (s *Server) announceLocked(e *jobEntry, msg string) {
	s.mu.later(func() {
		s.mu.within(func() { s.emitLocked(e, pb.EventKind_EVENT_KIND_STATE, msg, nil) })
	})
}

// changeStateLocked is setStateLocked without the announcement.
func (s *Server) changeStateLocked(e *jobEntry, st pb.JobState, msg string) {
	j := e.job
	if err := coordinator.Transition(j.State, st); err != nil {
		s.log.Error("job lifecycle broken (a bug)", "job", j.Id, "err", err)
	}
	j.State = st
	j.Message = msg
	now := s.cfg.Now()
	switch st {
	case pb.JobState_JOB_STATE_RUNNING:
		j.StartedAt = tsNow(now)
	case pb.JobState_JOB_STATE_SUCCEEDED, pb.JobState_JOB_STATE_FAILED, pb.JobState_JOB_STATE_CANCELLED:
		j.FinishedAt = tsNow(now)
		if j.Result == nil {
			j.Result = &pb.JobResult{}
		}
		if j.StartedAt != nil {
			j.Result.WallSeconds = now.Sub(j.StartedAt.AsTime()).Seconds()
		}
	}
	s.persistLocked(e)
	s.runLogLocked(e, map[string]any{"kind": "state", "time": now.UTC().Format(time.RFC3339Nano), "state": runlog.StateName(st), "message": msg})
	if e.run != nil && coordinator.Final(st) {
		run, sum, dir := e.run, runlog.SummaryOf(proto.Clone(j).(*pb.Job)), j.RunDir
		e.run = nil
		s.mu.later(func() {
			s.mu.offLock("writing a run summary")
			if err := run.Finish(sum); err != nil {
				s.log.Error("writing summary failed", "job", j.Id, "err", err)
			}
			s.mu.within(func() { s.replotLocked(dir) })
		})
	}
	s.countJobsLocked()
	if coordinator.Final(st) {
		s.cfg.Metrics.ForgetJob(j.Id)
	}
	if st == pb.JobState_JOB_STATE_FAILED {
		s.log.Warn("job state", "job", j.Id, "state", runlog.StateName(st), "message", msg)
	} else {
		s.log.Info("job state", "job", j.Id, "state", runlog.StateName(st), "message", msg)
	}
}

// endJobLocked asks the core to end a running or pending job (it
// answers with EndJob, the cancellation of its tasks, and frees its
// workers).
func (s *Server) endJobLocked(e *jobEntry, st pb.JobState, msg string, res *pb.JobResult) {
	s.mustStepLocked(coordinator.End{At: s.cfg.Now(), Job: e.job.Id, State: st, Message: msg, Result: res})
}

// jobEndedLocked carries out the core's EndJob: the state, the abort of
// the job's parameter server or round driver, its checkpoint at stop,
// and the announcement.
func (s *Server) jobEndedLocked(e *jobEntry, a coordinator.EndJob) {
	if a.Result != nil {
		e.job.Result = a.Result
	}
	s.changeStateLocked(e, a.State, a.Message)
	e.abort(errors.New(a.Message))
	if a.State != pb.JobState_JOB_STATE_SUCCEEDED {
		s.checkpointStoppedLocked(e)
	}
	s.announceLocked(e, a.Message) // after the checkpoint at stop, too
	if a.Running {
		e.stopped = make(chan struct{}) // closed at TasksStopped
	}
}

// SubmitJob validates the spec, stores the job as PENDING and schedules.
func (s *Server) SubmitJob(ctx context.Context, req *pb.SubmitJobRequest) (*pb.SubmitJobResponse, error) {
	in, resumeFrom, err := s.resumeSpec(ctx, req)
	if err != nil {
		return nil, err
	}
	spec, err := jobspec.Normalize(in, models.Names())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "invalid job spec: %v", err)
	}
	now := s.cfg.Now()
	j := &pb.Job{Id: newJobID(now), Spec: spec, State: pb.JobState_JOB_STATE_PENDING, CreatedAt: tsNow(now), ResumeFrom: resumeFrom}
	j.RunDir = s.runDir(j.Id)
	var needs []coordinator.Need // off the lock: it runs a small step of the model
	if s.cfg.PlaceByMemory || s.memoryOffered.Load() {
		needs = memoryNeeds(spec)
	}
	// Stored before anyone can see it, so off the lock.
	if err := s.putJob(j, 0); err != nil {
		return nil, status.Errorf(codes.Internal, "storing job: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, status.Error(codes.Unavailable, "server is shutting down")
	}
	e := newJobEntry(j)
	s.jobs[j.Id] = e
	s.emitLocked(e, pb.EventKind_EVENT_KIND_STATE, "submitted", nil)
	s.log.Info("job submitted", "job", j.Id, "model", spec.Model, "dataset", spec.Dataset.Name, "mode", spec.Mode, "workers", spec.GetWorkers())
	s.mustStepLocked(submitInput(j, now, needs))
	return &pb.SubmitJobResponse{Job: proto.Clone(e.job).(*pb.Job)}, nil
}

// submitInput is what the core needs to know of a submitted (or
// requeued) job; needs is what its ranks need of their workers' memory
// (nil: nothing stated).
func submitInput(j *pb.Job, now time.Time, needs []coordinator.Need) coordinator.Submit {
	spec := j.Spec
	return coordinator.Submit{At: now, Job: j.Id, Workers: int(spec.GetWorkers()), MinWorkers: int(spec.GetMinWorkers()), Mode: spec.GetMode(), Stages: jobspec.PipelineStages(spec),
		LabelShards: jobspec.LabelShards(spec), Tensor: jobspec.TensorRanks(spec),
		RealClients: jobspec.RealClients(spec), StepTimeoutSeconds: spec.GetStepTimeoutSeconds(), ResumeFrom: j.ResumeFrom,
		Entrypoint: jobspec.IsEntrypoint(spec), Memory: needs}
}

// memoryNeeds is what each rank of spec's job needs of its worker's
// memory (jobspec.MemoryNeeds); nil, which places anywhere, when it
// cannot be told (an entrypoint's own model, a model that does not build:
// preparing the job reports that).
func memoryNeeds(spec *pb.JobSpec) []coordinator.Need {
	if jobspec.IsEntrypoint(spec) || spec.GetMode() == "fedavg" {
		return nil
	}
	needs, err := jobspec.MemoryNeeds(spec)
	if err != nil {
		return nil
	}
	out := make([]coordinator.Need, len(needs))
	for i, n := range needs {
		out[i] = coordinator.Need{Bytes: n.Bytes, What: n.What}
	}
	return out
}

func (s *Server) jobLocked(id string) (*jobEntry, error) {
	e := s.jobs[id]
	if e == nil {
		return nil, status.Errorf(codes.NotFound, "job %q not found", id)
	}
	return e, nil
}

// GetJob returns one job.
func (s *Server) GetJob(ctx context.Context, req *pb.GetJobRequest) (*pb.GetJobResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.jobLocked(req.JobId)
	if err != nil {
		return nil, err
	}
	return &pb.GetJobResponse{Job: proto.Clone(e.job).(*pb.Job)}, nil
}

// ListJobs returns jobs newest first.
func (s *Server) ListJobs(ctx context.Context, req *pb.ListJobsRequest) (*pb.ListJobsResponse, error) {
	limit := int(req.PageSize)
	if limit == 0 {
		limit = 100
	}
	s.mu.Lock()
	var out []*pb.Job
	for _, e := range s.jobs {
		if req.State == pb.JobState_JOB_STATE_UNSPECIFIED || e.job.State == req.State {
			out = append(out, proto.Clone(e.job).(*pb.Job))
		}
	}
	s.mu.Unlock()
	sortJobs(out)
	if len(out) > limit {
		out = out[:limit]
	}
	return &pb.ListJobsResponse{Jobs: out}, nil
}

// CancelJob cancels a pending or running job.
func (s *Server) CancelJob(ctx context.Context, req *pb.CancelJobRequest) (*pb.CancelJobResponse, error) {
	s.mu.Lock()
	e, err := s.jobLocked(req.JobId)
	if err == nil {
		err = s.stepLocked(coordinator.Cancel{At: s.cfg.Now(), Job: req.JobId, Reason: req.Reason})
		var ended *coordinator.EndedError
		switch {
		case errors.As(err, &ended):
			err = status.Errorf(codes.FailedPrecondition, "job %s already ended (%s)", req.JobId, runlog.StateName(ended.State))
		case err != nil:
			err = status.Errorf(codes.Internal, "cancelling job %s: %v", req.JobId, err)
		}
	}
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	job, stopped := proto.Clone(e.job).(*pb.Job), e.stopped
	s.mu.Unlock()
	// CancelJob returns once the job has stopped: every task of it has
	// said so (a ring job's rank 0 writes its checkpoint at cancellation
	// before it does; a ps job's is written above), so `cancel` then
	// `submit --resume` back to back resumes from where it stopped, and
	// the workers are free when the call returns. Waiting here rather
	// than in the resume keeps the answer truthful for every client (a
	// script that cancels and then reads the run directory) and costs a
	// cancel no more than one step. The wait is bounded (StopTimeout,
	// the call's deadline): a worker that never says so — lost, or too
	// old to — does not hold the call.
	if !s.awaitStopped(ctx, stopped) {
		s.log.Warn("cancelled job's tasks did not all report stopping in time", "job", job.Id, "timeout", s.cfg.StopTimeout)
	}
	return &pb.CancelJobResponse{Job: job}, nil
}

// awaitStopped waits until an ended job's tasks have stopped (stopped is
// closed; nil: nothing to wait for), at most StopTimeout and ctx's
// deadline; it reports whether they did.
func (s *Server) awaitStopped(ctx context.Context, stopped <-chan struct{}) bool {
	if stopped == nil {
		return true
	}
	t := time.NewTimer(s.cfg.StopTimeout)
	defer t.Stop()
	select {
	case <-stopped:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// WatchJob streams a job's events from its first kept one until the job
// ends. Nothing is dropped for a slow watcher: it reads the job's event log
// at its own pace.
func (s *Server) WatchJob(req *pb.WatchJobRequest, stream pb.JobService_WatchJobServer) error {
	ctx := stream.Context()
	s.mu.Lock()
	e, err := s.jobLocked(req.JobId)
	next := 0
	if err == nil {
		next = e.base
	}
	s.mu.Unlock()
	if err != nil {
		return err
	}
	for {
		s.mu.Lock()
		if next < e.base {
			next = e.base
		}
		batch := append([]*pb.WatchJobResponse(nil), e.events[next-e.base:]...)
		next += len(batch)
		final := e.announced
		notify := e.notify
		closed := s.closed
		s.mu.Unlock()
		for _, ev := range batch {
			if err := stream.Send(ev); err != nil {
				return err
			}
		}
		if final {
			return nil
		}
		if closed {
			return status.Error(codes.Unavailable, "server is shutting down")
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-notify:
		}
	}
}

// ListWorkers returns every worker the coordinator has seen since it started.
func (s *Server) ListWorkers(ctx context.Context, req *pb.ListWorkersRequest) (*pb.ListWorkersResponse, error) {
	s.mu.Lock()
	ws := s.core.Workers()
	s.mu.Unlock()
	out := make([]*pb.Worker, len(ws))
	for i, w := range ws {
		out[i] = &pb.Worker{Id: w.ID, Name: w.Name, Address: w.Address,
			State: w.State, JobId: w.Job, LastHeartbeat: tsNow(w.Seen), ConnectedAt: tsNow(w.Connected), MemoryBytes: w.Memory}
		if w.Resources != nil {
			out[i].Resources = proto.Clone(w.Resources).(*pb.Resources)
		}
	}
	return &pb.ListWorkersResponse{Workers: out}, nil
}

// checkpointDir is where a job's checkpoints go.
func checkpointDir(runDir string) string { return filepath.Join(runDir, "checkpoints") }

// resumeSpec returns the spec to submit and, for a resume, the checkpoint
// to start from: the old job's spec (its workers may be changed) and its
// latest checkpoint that verifies.
func (s *Server) resumeSpec(ctx context.Context, req *pb.SubmitJobRequest) (*pb.JobSpec, string, error) {
	if req.GetResumeJobId() == "" {
		return req.GetSpec(), "", nil
	}
	s.mu.Lock()
	e := s.jobs[req.ResumeJobId]
	var old *pb.Job
	var stopped chan struct{}
	if e != nil {
		old, stopped = proto.Clone(e.job).(*pb.Job), e.stopped
	}
	s.mu.Unlock()
	if old == nil {
		return nil, "", status.Errorf(codes.NotFound, "job %q not found", req.ResumeJobId)
	}
	// A job that just ended (cancelled by a call that gave up waiting,
	// or failed) may still be writing its last checkpoint: wait for its
	// tasks the same bounded way CancelJob does.
	if coordinator.Final(old.State) {
		s.awaitStopped(ctx, stopped)
	}
	if !coordinator.Final(old.State) {
		return nil, "", status.Errorf(codes.FailedPrecondition, "job %s is %s; only an ended job can be resumed", old.Id, runlog.StateName(old.State))
	}
	if scriptCheckpoints(old.Spec) {
		// The script's own state: the newest file it saved into the
		// job's folder. Its format is the script's (torch.save).
		path, err := checkpoint.LatestScript(checkpointDir(old.RunDir))
		if err != nil {
			return nil, "", status.Errorf(codes.FailedPrecondition, "job %s: its script saved no checkpoint into the job's folder (gradsync.torch.save_checkpoint(state, step=...)): %v", old.Id, err)
		}
		spec := proto.Clone(old.Spec).(*pb.JobSpec)
		if sp := req.GetSpec(); sp != nil && sp.Workers != nil {
			spec.Workers, spec.MinWorkers, spec.MaxWorkers = sp.Workers, 0, 0
		}
		return spec, path, nil
	}
	if !jobspec.CheckpointsOn(old.Spec) {
		return nil, "", status.Errorf(codes.FailedPrecondition, "job %s wrote no checkpoints (its spec has no checkpoint settings)", old.Id)
	}
	_, path, skipped, err := checkpoint.Latest(checkpointDir(old.RunDir))
	for _, sk := range skipped {
		s.log.Warn("checkpoint skipped", "job", old.Id, "reason", sk.String())
	}
	if err != nil {
		return nil, "", status.Errorf(codes.FailedPrecondition, "job %s has no usable checkpoint: %v", old.Id, err)
	}
	spec := proto.Clone(old.Spec).(*pb.JobSpec)
	if sp := req.GetSpec(); sp != nil && sp.Workers != nil { // a resume without a spec keeps the number of workers
		spec.Workers, spec.MinWorkers, spec.MaxWorkers = sp.Workers, 0, 0
	}
	if spec.GetMode() == "fedavg" {
		// Normalize fills these with defaults that fedavg does not use,
		// and refuses them when set: it fills them again the same way.
		spec.Epochs, spec.BatchSize = nil, nil
		// The checkpoint's global model is for its clients: one real
		// client per worker, or all of them simulated in one.
		if k := spec.GetFederated().GetClients(); spec.GetWorkers() > 1 && spec.GetWorkers() != k {
			return nil, "", status.Errorf(codes.InvalidArgument, "job %s has %d federated clients: resume it on %d workers (one real client each) or on 1 (simulated), not %d",
				old.Id, k, k, spec.GetWorkers())
		}
	}
	return spec, path, nil
}
