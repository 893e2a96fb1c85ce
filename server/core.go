package server

import (
	"fmt"
	"time"

	"github.com/gradsync/gradsync/coordinator"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// The server feeds coordinator.Core — the worker registry, the queue of
// pending jobs, liveness and the gang scheduler — under its lock, and
// carries out the actions it returns: on its job table (place a job,
// fail or recover the job of a lost worker) and as effects queued for
// after the lock (sends, closing a stream).

// stepLocked feeds one input to the core and carries out its actions in
// order. Actions that feed the core again (a job that cannot start
// releases its workers) append theirs behind: one Step's actions are all
// carried out before the next Step's.
func (s *Server) stepLocked(in coordinator.Input) error {
	acts, err := s.core.Step(in)
	if err != nil {
		return err
	}
	s.actions = append(s.actions, acts...)
	switch in.(type) {
	case coordinator.Heard, coordinator.Tick, coordinator.Progress:
		// Only a worker's last-seen time changed, unless one was lost.
		s.registryChanged = s.registryChanged || len(acts) > 0
	default:
		s.registryChanged = true
	}
	switch in.(type) {
	case coordinator.Hello, coordinator.Submit, coordinator.Withdraw, coordinator.Released:
		// Idle workers may have appeared: elastic jobs below their size
		// grow onto what the queue leaves (after the placements).
		s.growPending = true
	}
	if s.applying {
		return nil
	}
	s.applying = true
	defer func() { s.applying = false }()
	for len(s.actions) > 0 || s.growPending {
		if len(s.actions) == 0 {
			s.growPending = false
			s.growLocked()
			continue
		}
		a := s.actions[0]
		s.actions[0] = nil
		s.actions = s.actions[1:]
		s.applyLocked(a)
	}
	if s.registryChanged {
		s.registryChanged = false
		close(s.workersChanged)
		s.workersChanged = make(chan struct{})
	}
	return nil
}

// mustStepLocked is stepLocked for inputs the core never refuses.
func (s *Server) mustStepLocked(in coordinator.Input) {
	if err := s.stepLocked(in); err != nil {
		panic(fmt.Sprintf("server: the core refused %T: %v", in, err))
	}
}

// applyLocked carries out one action of the core.
func (s *Server) applyLocked(a coordinator.Action) {
	switch a := a.(type) {
	case coordinator.Welcome:
		s.sendLocked(a.Worker, &pb.ConnectResponse{Msg: &pb.ConnectResponse_Welcome{Welcome: &pb.Welcome{
			WorkerId: a.Worker, HeartbeatIntervalSeconds: s.cfg.HeartbeatInterval.Seconds()}}})
	case coordinator.Disconnect:
		if c := s.conns[a.Worker]; c != nil {
			s.mu.later(c.close)
		}
	case coordinator.WorkerLost:
		s.workerLostLocked(a)
	case coordinator.Place:
		s.startJobLocked(s.jobs[a.Job], a.Workers)
	case coordinator.SetState:
		e := s.jobs[a.Job]
		if a.State == pb.JobState_JOB_STATE_RUNNING {
			e.job.Generation, e.job.WorkerIds = 1, a.Workers
			if e.prep != nil {
				e.run, e.started = e.prep.run, e.prep.started
			}
		}
		s.setStateLocked(e, a.State, a.Message)
	case coordinator.EndJob:
		s.jobEndedLocked(s.jobs[a.Job], a)
	case coordinator.DropPrepared:
		s.dropPreparedLocked(s.jobs[a.Job], a.Ended)
	case coordinator.StartGeneration:
		s.startGenerationLocked(s.jobs[a.Job], a)
	case coordinator.Assign:
		s.assignLocked(s.jobs[a.Job], a)
	case coordinator.CancelTask:
		s.sendLocked(a.Worker, &pb.ConnectResponse{Msg: &pb.ConnectResponse_Cancel{Cancel: &pb.CancelTask{JobId: a.Job, Reason: a.Reason, KeepState: a.KeepState}}})
	case coordinator.RankFailed:
		s.rankFailedLocked(s.jobs[a.Job], a)
	case coordinator.Straggler:
		s.stragglerLocked(s.jobs[a.Job], a)
	case coordinator.TasksStopped:
		s.jobs[a.Job].tasksStoppedLocked()
	default:
		panic(fmt.Sprintf("server: unknown action %T", a))
	}
}

// growLocked grows elastic jobs running below their size onto idle
// workers nobody queued for (from their latest checkpoint).
func (s *Server) growLocked() {
	if s.closed || len(s.core.Queued()) > 0 {
		return
	}
	for _, e := range s.jobs {
		if e.job.State == pb.JobState_JOB_STATE_RUNNING && !e.recovery.Rejoining() && !e.recovery.Pinning() && !s.anyRankDoneLocked(e) &&
			len(e.job.WorkerIds) < int(e.job.Spec.GetWorkers()) && coordinator.Elastic(e.job.Spec) {
			s.recoverLocked(e, nil, "", "")
		}
	}
}

// anyRankDoneLocked reports whether a rank of the job's current
// generation finished its task.
func (s *Server) anyRankDoneLocked(e *jobEntry) bool {
	j, _ := s.core.Job(e.job.Id)
	return j.AnyRankDone()
}

// workerLocked is the core's record of worker id (ok false: never seen).
func (s *Server) workerLocked(id string) (coordinator.Worker, bool) { return s.core.Worker(id) }

// lostWorker is what a recovery needs of the worker it recovers from.
type lostWorker struct {
	id, address string
	silent      time.Duration
}
