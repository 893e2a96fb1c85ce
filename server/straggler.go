package server

import (
	"fmt"
	"time"

	"github.com/gradsync/gradsync/coordinator"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// noteDelayLocked feeds one progress report of rank r to the job's
// straggler detector: in ring mode the report's left wait is the delay of
// r's left neighbour; in ps mode the parameter server measured r's own.
// A new episode is announced (event, metric, metrics.jsonl) once, and so
// is its end.
func (s *Server) noteDelayLocked(e *jobEntry, r int, p *pb.Progress, now time.Time) {
	j := e.job
	n := len(j.WorkerIds)
	if n < 2 {
		return
	}
	var culprit int
	var delay float64
	var how string
	switch j.Spec.GetMode() {
	case "ring":
		culprit, delay = coordinator.RingDelayCulprit(r, n), p.LeftWaitSeconds
		how = fmt.Sprintf("rank %d waits that long for its data", r)
	case "ps":
		if e.ps == nil {
			return
		}
		var ok bool
		if delay, ok = e.ps.TakeLag(r); !ok {
			return
		}
		culprit = r
		how = "its gradient reaches the parameter server that long after the first rank's"
	default:
		return
	}
	if !e.stragglers.For(j.Generation, n) {
		e.stragglers = coordinator.NewStragglers(j.Generation, n)
	}
	begins, ends, median := e.stragglers.Observe(culprit, delay)
	if !begins && !ends {
		return
	}
	id := j.WorkerIds[culprit]
	addr := ""
	if w, ok := s.workerLocked(id); ok {
		addr = w.Address
	}
	compute := j.Ranks[culprit].GetComputeSeconds()
	var msg string
	if begins {
		s.cfg.Metrics.StragglerFound()
		s.cfg.Metrics.SetStragglerDelay(j.Id, culprit, delay)
		msg = fmt.Sprintf("straggler: rank %d (worker %s, %s) delays every step by %.3fs (%s; median of the other ranks %.3fs); its compute %.3fs per step",
			culprit, id, addr, delay, how, median, compute)
		s.log.Warn("straggler", "job", j.Id, "rank", culprit, "worker", id, "address", addr, "delay_seconds", delay, "median_seconds", median)
	} else {
		s.cfg.Metrics.SetStragglerDelay(j.Id, culprit, 0)
		msg = fmt.Sprintf("straggler rank %d (worker %s, %s) keeps up again: %.3fs per step", culprit, id, addr, delay)
		s.log.Info("straggler keeps up again", "job", j.Id, "rank", culprit, "worker", id)
	}
	{
		kind := "straggler"
		if ends {
			kind = "straggler_end"
		}
		s.runLogLocked(e, map[string]any{"kind": kind, "time": now.UTC().Format(time.RFC3339Nano), "rank": culprit, "worker": id,
			"address": addr, "delay_seconds": delay, "median_others_seconds": median, "compute_seconds": compute,
			"step": p.Step, "generation": j.Generation, "mode": j.Spec.GetMode()})
	}
	s.emitLocked(e, pb.EventKind_EVENT_KIND_LOG, msg, nil)
}
