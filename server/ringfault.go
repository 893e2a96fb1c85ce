package server

import (
	"fmt"
	"time"

	"github.com/gradsync/gradsync/coordinator"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// ringFailedLocked records a ring rank's failure report. Once every rank
// of the generation has reported, and their frame counts show the link
// that lost frames, the rank cut off is evicted (an elastic job recovers
// without it) or the job fails naming it; it reports whether it acted.
// Otherwise the caller's usual handling applies.
func (s *Server) ringFailedLocked(e *jobEntry, d coordinator.RankFailed) bool {
	j := e.job
	n := len(j.WorkerIds)
	minIdle := j.Spec.GetStepTimeoutSeconds() / 2
	rank, why, ok := e.recovery.RingFailed(j.Generation, n, d.Rank, d.Links, minIdle)
	if !ok {
		return false
	}
	id := j.WorkerIds[rank]
	w, ok := s.workerLocked(id)
	if !ok {
		return false
	}
	reason := fmt.Sprintf("cut off from the ring (rank %d): %s", rank, why)
	now := s.cfg.Now()
	s.log.Warn("ring link broken", "job", j.Id, "rank", rank, "worker", id, "address", w.Address, "evidence", why)
	s.runLogLocked(e, map[string]any{"kind": "ring_cut", "time": now.UTC().Format(time.RFC3339Nano), "rank": rank, "worker": id,
		"address": w.Address, "evidence": why, "generation": j.Generation})
	e.recovery.Evict(id) // never taken back into this job
	// The worker is still connected (its heartbeats arrive) and BUSY, so
	// recovery neither keeps it nor takes it as an idle worker.
	failMsg := fmt.Sprintf("worker %s (%s) %s", id, w.Address, reason)
	if !s.recoverLocked(e, &lostWorker{id: id, address: w.Address, silent: now.Sub(w.Seen)}, reason, failMsg) {
		s.endJobLocked(e, pb.JobState_JOB_STATE_FAILED, failMsg, nil)
	}
	s.mustStepLocked(coordinator.Evict{At: now, Job: j.Id, Worker: id, Reason: reason})
	return true
}
