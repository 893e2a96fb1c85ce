package server

import (
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/federation"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// A fedavg job with real clients runs its rounds in a federation.Driver
// (see that package); fedJob is the server's handle on it and the
// driver's federation.Coordinator: the job's entry as the driver may see
// it. The driver calls it off its own lock, from its Run goroutine, so
// its methods take Server.mu; the server calls the driver (abort,
// workerLostLocked) under Server.mu, which the driver allows, and writes
// its checkpoint at stop off that lock (checkpointStoppedLocked).
type fedJob struct {
	s *Server
	e *jobEntry
	d *federation.Driver
}

// newFedDriver builds fj's round driver for job's first generation on
// workerIDs from net's initial parameters, or, when the job resumes,
// from its checkpoint's (net is loaded with them); never under the lock
// (it reads the checkpoint). ckptDir "" means no checkpoints. Until
// runFedJob makes fj the job's driver, what the driver asks of it is
// moot (activeLocked).
func (s *Server) newFedDriver(fj *fedJob, j *pb.Job, workerIDs []string, net *models.Network, ckptDir string, started time.Time) error {
	d, err := federation.New(federation.Config{JobID: j.Id, Generation: 1, Spec: j.Spec, WorkerIDs: workerIDs,
		Net: net, ResumeFrom: j.ResumeFrom, CheckpointDir: ckptDir, Started: started, Now: s.cfg.Now, Logger: s.log}, fj)
	fj.d = d
	return err
}

// runFedJob makes fj the job's round driver and starts it (a goroutine
// owned by the Server: it ends when the job is aborted, and Serve waits
// for it).
func (s *Server) runFedJob(fj *fedJob) *fedJob {
	s.streams.Add(1)
	go func() { // owned by the Server: ends when the job is aborted
		defer s.streams.Done()
		fj.d.Run()
	}()
	return fj
}

// abort stops the driver: its clock returns and every client's stream
// ends. Safe to call more than once, with or without Server.mu.
func (fj *fedJob) abort(err error) { fj.d.Abort(err) }

// workerLostLocked: a lost worker's client misses the rounds it is
// sampled for; the job fails only when every client is lost.
func (fj *fedJob) workerLostLocked(id, reason string) { fj.d.WorkerLost(id, reason) }

// activeLocked reports whether the job still runs this driver: what the
// driver asks after the job ended, or once the server is stopping (which
// keeps the job RUNNING in the store for the next start), is moot.
func (fj *fedJob) activeLocked() bool {
	return fj.e.fed == fj && !fj.e.final() && !fj.s.closed
}

// Emit announces a job event for the driver.
func (fj *fedJob) Emit(ev federation.Event) {
	fj.s.mu.Lock()
	defer fj.s.mu.Unlock()
	if !fj.activeLocked() {
		return
	}
	switch {
	case ev.Eval != nil:
		fj.s.recordEvalLocked(fj.e, ev.Eval, fj.s.cfg.Now())
	case ev.Progress != nil:
		fj.e.job.Progress = ev.Progress
		fj.s.emitLocked(fj.e, ev.Kind, ev.Message, nil)
	default:
		fj.s.emitLocked(fj.e, ev.Kind, ev.Message, nil)
	}
}

// Log appends the driver's record to the job's run log.
func (fj *fedJob) Log(rec map[string]any) {
	fj.s.mu.Lock()
	defer fj.s.mu.Unlock()
	if fj.activeLocked() {
		fj.s.runLogLocked(fj.e, rec)
	}
}

// End ends the job as the driver says.
func (fj *fedJob) End(state pb.JobState, msg string, result *pb.JobResult) {
	fj.s.mu.Lock()
	defer fj.s.mu.Unlock()
	if !fj.activeLocked() {
		return
	}
	fj.s.endJobLocked(fj.e, state, msg, result)
}

// Participate serves one real federated client's stream (see
// federation.proto) through its job's driver.
func (s *Server) Participate(stream pb.Federation_ParticipateServer) error {
	return federation.Serve(stream, s.fedDriver)
}

// fedDriver returns the driver of a running fedavg job with real clients.
func (s *Server) fedDriver(jobID string) (*federation.Driver, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.jobs[jobID]
	switch {
	case e == nil:
		return nil, status.Errorf(codes.NotFound, "job %q not found", jobID)
	case e.job.State != pb.JobState_JOB_STATE_RUNNING || e.fed == nil:
		return nil, status.Errorf(codes.FailedPrecondition, "job %s is not a running fedavg job with real clients", jobID)
	}
	return e.fed.d, nil
}
