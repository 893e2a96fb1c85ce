package server

import (
	"fmt"

	"github.com/gradsync/gradsync/coordinator"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// The server feeds coordinator.Core — the worker registry, the queue of
// pending jobs, liveness, the gang scheduler and the job table (each
// job's lifecycle, generation, members, finished and failed ranks, the
// tasks an ended job waits for, the straggler rule) — under its lock,
// and carries out the typed actions it returns: on its record of each
// job for clients (state, events, per-rank progress), on the handles it
// holds (parameter-server groups, round drivers, run logs), and as
// effects queued for after the lock (sends, store writes, closing a
// stream). Elastic recovery and growth are decided in the core too; the
// shell pins checkpoints for them and announces them (recovery.go).

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
	if s.applying {
		return nil
	}
	s.applying = true
	defer func() { s.applying = false }()
	for len(s.actions) > 0 {
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
	case coordinator.PinCheckpoint:
		s.pinCheckpointLocked(s.jobs[a.Job], a)
	case coordinator.Recovering:
		s.recoveringLocked(s.jobs[a.Job], a)
	case coordinator.GenerationStarted:
		s.generationStartedLocked(s.jobs[a.Job], a)
	case coordinator.Recovered:
		s.recoveredLocked(s.jobs[a.Job], a)
	case coordinator.RingCut:
		s.ringCutLocked(s.jobs[a.Job], a)
	case coordinator.Straggler:
		s.stragglerLocked(s.jobs[a.Job], a)
	case coordinator.TasksStopped:
		s.jobs[a.Job].tasksStoppedLocked()
	default:
		panic(fmt.Sprintf("server: unknown action %T", a))
	}
}
