package server

import (
	"fmt"
	"time"

	"github.com/gradsync/gradsync/coordinator"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// stepProgressLocked feeds one progress report of rank r to the core,
// which applies the straggler rule (coordinator.Progress); a ps rank's
// delay is what the job's parameter server measured.
func (s *Server) stepProgressLocked(e *jobEntry, workerID string, r int, p *pb.Progress, now time.Time) {
	in := coordinator.Progress{At: now, Job: e.job.Id, Worker: workerID, Generation: e.job.Generation, Rank: r, Step: p.Step,
		LeftWait: p.LeftWaitSeconds}
	if e.job.Spec.GetMode() == "ps" && e.ps != nil && len(e.job.WorkerIds) > 1 {
		in.Lag, in.HasLag = e.ps.TakeLag(r)
	}
	s.mustStepLocked(in)
}

// stragglerLocked carries out the core's Straggler: a new episode is
// announced (event, metric, metrics.jsonl), and so is its end.
func (s *Server) stragglerLocked(e *jobEntry, a coordinator.Straggler) {
	j := e.job
	culprit, id, addr, delay, median := a.Rank, a.Worker, a.Address, a.Delay, a.Median
	how := fmt.Sprintf("rank %d waits that long for its data", (culprit+1)%len(j.WorkerIds))
	if a.Mode == "ps" {
		how = "its gradient reaches the parameter server that long after the first rank's"
	}
	var compute float64
	if culprit < len(j.Ranks) {
		compute = j.Ranks[culprit].GetComputeSeconds()
	}
	var msg string
	if !a.Ends {
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
	kind := "straggler"
	if a.Ends {
		kind = "straggler_end"
	}
	s.runLogLocked(e, map[string]any{"kind": kind, "time": s.cfg.Now().UTC().Format(time.RFC3339Nano), "rank": culprit, "worker": id,
		"address": addr, "delay_seconds": delay, "median_others_seconds": median, "compute_seconds": compute,
		"step": a.Step, "generation": a.Generation, "mode": a.Mode})
	s.emitLocked(e, pb.EventKind_EVENT_KIND_LOG, msg, nil)
}
