package server

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/coordinator"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// recoverLocked keeps an elastic ring job (min_workers < workers) going
// after it lost a worker: the survivors (and idle workers, up to the
// job's size) stop the broken step, the generation is bumped, and the new
// generation's ranks agree on the newest state one of them holds in
// memory (worker/agree.go), or else resume from the latest checkpoint.
// With lost nil it grows a job that runs below its size onto idle
// workers the same way. It reports whether it will (false: the job
// cannot, and the caller fails it with failMsg).
//
// It runs in two halves: this one decides (the job can recover with the
// workers there are) and enters the Pinning phase; the latest checkpoint
// is found and pinned off the lock; recoverPinnedLocked then plans the
// new generation again with the workers there are by then, or fails
// the job with failMsg.
func (s *Server) recoverLocked(e *jobEntry, lost *lostWorker, reason, failMsg string) bool {
	j := e.job
	spec := j.Spec
	if !coordinator.Elastic(spec) {
		return false
	}
	if e.recovery.Pinning() {
		// A recovery is already on its way; it leaves out every worker
		// lost by then. Growth waits for it.
		return lost != nil
	}
	lostID := ""
	if lost != nil {
		lostID = lost.id
	}
	if _, ok := e.recovery.Plan(s.survivorsLocked(e, lostID), s.core.Idle(), int(spec.GetWorkers()), int(spec.GetMinWorkers()), lost == nil); !ok {
		return false
	}
	p := coordinator.Pin{Gen: j.Generation, Reason: reason, FailMsg: failMsg}
	if lost != nil {
		p.Lost, p.Address, p.Silent = lost.id, lost.address, lost.silent
	}
	e.recovery.AwaitPin(p)
	// The checkpoint is the fallback when no rank holds a snapshot. The
	// new generation's ranks load a pinned copy: the old generation's
	// rank 0 may still be writing or replacing checkpoints.
	job := proto.Clone(j).(*pb.Job)
	tag := fmt.Sprintf("g%d", j.Generation+1)
	s.mu.later(func() {
		path, err := "", error(nil)
		if latest := latestCheckpoint(job); latest != "" {
			s.mu.offLock("a checkpoint pin")
			path, err = checkpoint.Pin(checkpointDir(job.RunDir), latest, tag, 4)
		}
		s.mu.within(func() { s.recoverPinnedLocked(e, path, err) })
	})
	return true
}

// survivorsLocked lists the job's workers that are still there, but
// lost and those evicted from its ring.
func (s *Server) survivorsLocked(e *jobEntry, lost string) []string {
	var ids []string
	for _, id := range e.job.WorkerIds {
		if w, ok := s.workerLocked(id); ok && id != lost && w.State != pb.WorkerState_WORKER_STATE_LOST && !e.recovery.Evicted(id) {
			ids = append(ids, id)
		}
	}
	return ids
}

// recoverPinnedLocked is recoverLocked's second half, once the checkpoint
// to fall back to is pinned (path; "" when the job has none).
func (s *Server) recoverPinnedLocked(e *jobEntry, path string, pinErr error) {
	p, ok := e.recovery.Pinned()
	j := e.job
	if !ok || s.closed || j.State != pb.JobState_JOB_STATE_RUNNING || j.Generation != p.Gen {
		return // the job ended or moved on meanwhile
	}
	spec := j.Spec
	fail := func() {
		if p.FailMsg != "" {
			s.endJobLocked(e, pb.JobState_JOB_STATE_FAILED, p.FailMsg, nil)
		}
	}
	if pinErr != nil {
		s.log.Warn("pinning the checkpoint to resume from failed", "job", j.Id, "err", pinErr)
		fail()
		return
	}
	if path == "" {
		path = j.ResumeFrom
	}
	survivors := s.survivorsLocked(e, p.Lost)
	before := len(survivors)
	ids, ok := e.recovery.Plan(survivors, s.core.Idle(), int(spec.GetWorkers()), int(spec.GetMinWorkers()), p.Lost == "")
	if !ok {
		fail()
		return
	}
	now := s.cfg.Now()
	var lastStep int64
	for _, r := range j.Ranks {
		lastStep = max(lastStep, r.GetStep())
	}
	gen := j.Generation + 1
	j.ResumeFrom = path
	e.recovery.Begin(now, p.Lost, p.Silent, lastStep, path)
	// The core stops the current generation's tasks and assigns the next.
	s.mustStepLocked(coordinator.Regenerate{At: now, Job: j.Id, Lost: p.Lost, Workers: ids})
	from := "the ranks' in-memory snapshots (no checkpoint)"
	if path != "" {
		from = "the ranks' in-memory snapshots or " + path
	}
	var msg string
	if p.Lost != "" {
		msg = fmt.Sprintf("worker %s (%s) lost: %s; recovering on %d worker(s) from %s (generation %d)",
			p.Lost, p.Address, p.Reason, len(ids), from, gen)
		s.log.Warn("job recovering", "job", j.Id, "lost", p.Lost, "workers", len(ids), "from", from, "generation", gen)
		s.cfg.Metrics.Recovered()
	} else {
		msg = fmt.Sprintf("growing from %d to %d worker(s) from %s (generation %d)", before, len(ids), from, gen)
		s.log.Info("job growing", "job", j.Id, "workers", len(ids), "from", from, "generation", gen)
	}
	{
		kind := "recovery"
		if p.Lost == "" {
			kind = "grow"
		}
		s.runLogLocked(e, map[string]any{"kind": kind, "time": now.UTC().Format(time.RFC3339Nano), "lost_worker": p.Lost,
			"reason": p.Reason, "generation": gen, "workers": len(ids), "checkpoint": path, "last_step": lastStep})
	}
	s.emitLocked(e, pb.EventKind_EVENT_KIND_LOG, msg, nil)
}

// taskStartedLocked records where a ring generation's state came from
// (rank 0's TaskStarted) and, for a recovery or growth, ends it: the time
// it took, the steps done again, and the source are logged to the run's
// metrics.jsonl and announced as a job event.
func (s *Server) taskStartedLocked(workerID string, st *pb.TaskStarted) {
	e := s.runningJobLocked(workerID, st.GetJobId(), st.GetRank())
	if e == nil || st.Generation != e.job.Generation {
		return
	}
	out, ended := e.recovery.Started(s.cfg.Now(), st, len(e.job.WorkerIds))
	if !ended {
		if st.Source != "scratch" {
			s.log.Info("job starting", "job", e.job.Id, "generation", st.Generation, "from", coordinator.StartedFrom(st))
		}
		return
	}
	s.runLogLocked(e, out.Record)
	s.log.Info("job recovered", "job", e.job.Id, "seconds", out.Seconds, "generation", e.job.Generation, "from", coordinator.StartedFrom(st),
		"steps_redone", out.Record["steps_redone"])
	s.emitLocked(e, pb.EventKind_EVENT_KIND_LOG, out.Message, nil)
}
