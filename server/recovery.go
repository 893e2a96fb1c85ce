package server

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/coordinator"
	"github.com/gradsync/gradsync/jobspec"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Elastic recovery is decided by the core (coordinator/elastic.go): an
// elastic ring job that loses a worker, or has one cut off from its
// ring, recovers onto the survivors and idle workers, and one below its
// size grows back. The shell pins the checkpoint a new generation falls
// back to and announces what happened.

// pinCheckpointLocked carries out the core's PinCheckpoint: the job's
// latest checkpoint, the fallback when no rank holds a snapshot, is
// pinned off the lock (the new generation's ranks load a pinned copy:
// the old generation's rank 0 may still be writing or replacing
// checkpoints), and the core is told (Pinned).
func (s *Server) pinCheckpointLocked(e *jobEntry, a coordinator.PinCheckpoint) {
	job := proto.Clone(e.job).(*pb.Job)
	tag := fmt.Sprintf("g%d", a.Generation)
	s.mu.later(func() {
		s.mu.offLock("a checkpoint pin")
		path, err := pinLatest(job, tag)
		s.mu.within(func() {
			if err != nil {
				s.log.Warn("pinning the checkpoint to resume from failed", "job", job.Id, "err", err)
			}
			s.mustStepLocked(coordinator.Pinned{At: s.cfg.Now(), Job: job.Id, Path: path, Err: err})
		})
	})
}

// recoveringLocked carries out the core's Recovering: the new
// generation is announced, logged and recorded in the run log.
func (s *Server) recoveringLocked(e *jobEntry, a coordinator.Recovering) {
	j := e.job
	from := "the ranks' in-memory snapshots (no checkpoint)"
	switch {
	case jobspec.IsEntrypoint(j.Spec):
		from = "the state its command saved (every rank's command restarts)"
	case a.Checkpoint != "":
		from = "the ranks' in-memory snapshots or " + a.Checkpoint
	}
	var msg string
	if a.Lost != "" {
		msg = fmt.Sprintf("worker %s (%s) lost: %s; recovering on %d worker(s) from %s (generation %d)",
			a.Lost, a.Address, a.Reason, a.Workers, from, a.Generation)
		s.log.Warn("job recovering", "job", j.Id, "lost", a.Lost, "workers", a.Workers, "from", from, "generation", a.Generation)
		s.cfg.Metrics.Recovered()
	} else {
		msg = fmt.Sprintf("growing from %d to %d worker(s) from %s (generation %d)", a.Before, a.Workers, from, a.Generation)
		s.log.Info("job growing", "job", j.Id, "workers", a.Workers, "from", from, "generation", a.Generation)
	}
	kind := "recovery"
	if a.Lost == "" {
		kind = "grow"
	}
	s.runLogLocked(e, map[string]any{"kind": kind, "time": s.cfg.Now().UTC().Format(time.RFC3339Nano), "lost_worker": a.Lost,
		"reason": a.Reason, "generation": a.Generation, "workers": a.Workers, "checkpoint": a.Checkpoint, "last_step": a.LastStep})
	s.emitLocked(e, pb.EventKind_EVENT_KIND_LOG, msg, nil)
}

// generationStartedLocked carries out the core's GenerationStarted
// (rank 0's TaskStarted: where a ring generation's state came from):
// for a recovery or growth, the time it took, the steps done again, and
// the source are logged to the run's metrics.jsonl and announced.
func (s *Server) generationStartedLocked(e *jobEntry, a coordinator.GenerationStarted) {
	if a.Outcome == nil {
		if a.Source != "scratch" {
			s.log.Info("job starting", "job", e.job.Id, "generation", a.Generation, "from", a.From)
		}
		return
	}
	out := a.Outcome
	s.runLogLocked(e, out.Record)
	s.log.Info("job recovered", "job", e.job.Id, "seconds", out.Seconds, "generation", a.Generation, "from", a.From,
		"steps_redone", out.Record["steps_redone"])
	s.emitLocked(e, pb.EventKind_EVENT_KIND_LOG, out.Message, nil)
}

// recoveredLocked carries out the core's Recovered: a recovery ended at
// the new generation's first progress report.
func (s *Server) recoveredLocked(e *jobEntry, a coordinator.Recovered) {
	s.runLogLocked(e, a.Outcome.Record)
	s.log.Info("job recovered", "job", e.job.Id, "seconds", a.Outcome.Seconds, "generation", a.Generation)
	s.emitLocked(e, pb.EventKind_EVENT_KIND_LOG, a.Outcome.Message, nil)
}

// ringCutLocked carries out the core's RingCut: the rank the frame
// counts name as cut off is logged and recorded (the core evicts it and
// recovers or fails the job).
func (s *Server) ringCutLocked(e *jobEntry, a coordinator.RingCut) {
	s.log.Warn("ring link broken", "job", a.Job, "rank", a.Rank, "worker", a.Worker, "address", a.Address, "evidence", a.Evidence)
	s.runLogLocked(e, map[string]any{"kind": "ring_cut", "time": s.cfg.Now().UTC().Format(time.RFC3339Nano), "rank": a.Rank, "worker": a.Worker,
		"address": a.Address, "evidence": a.Evidence, "generation": a.Generation})
}
