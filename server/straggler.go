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
		if delay, ok = e.ps.takeLag(r); !ok {
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
	if w := s.workers[id]; w != nil {
		addr = w.info.Address
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

// arrivalLags measures, step by step, how far each rank's gradient trails
// the first rank's at the parameter server. The zero value is ready; it
// is guarded by psJob.mu.
type arrivalLags struct {
	at  []time.Time     // when each rank's last frame of the current step arrived
	sum []time.Duration // lags since the last takeLag, by rank
	n   []int
}

// arrived records rank's last gradient frame of a step at now; complete
// says it was the step's last rank, so every rank's arrival is known.
func (l *arrivalLags) arrived(rank, world int, now time.Time, complete bool) {
	if len(l.at) != world {
		l.at, l.sum, l.n = make([]time.Time, world), make([]time.Duration, world), make([]int, world)
	}
	l.at[rank] = now
	if !complete {
		return
	}
	first := l.at[0]
	for _, t := range l.at[1:] {
		if t.Before(first) {
			first = t
		}
	}
	for r, t := range l.at {
		l.sum[r] += t.Sub(first)
		l.n[r]++
	}
}

// takeLag returns rank's mean lag per step in seconds since the last call.
func (p *psJob) takeLag(rank int) (float64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := &p.lags
	if rank >= len(l.n) || l.n[rank] == 0 {
		return 0, false
	}
	mean := l.sum[rank].Seconds() / float64(l.n[rank])
	l.sum[rank], l.n[rank] = 0, 0
	return mean, true
}
