package server

import (
	"fmt"
	"slices"
	"time"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// The straggler rule. The delay attributed to a rank is, per step, how
// long its data arrives after the others': in ring mode its right
// neighbour's wait for its first frame of each collective, in ps mode how
// far its gradient's last frame trails the first rank's. A rank is a
// straggler when its delay is at least stragglerMinDelay and at least
// stragglerFactor times the median of the other ranks' delays in
// stragglerReports consecutive reports; the episode ends when its delay
// falls below half of stragglerMinDelay. Ordinary jitter (a few ms on
// loopback, a GC pause in one report) stays far below that.
const (
	stragglerMinDelay = 50 * time.Millisecond
	stragglerFactor   = 3
	stragglerReports  = 2
)

// stragglerDetector applies the straggler rule to one generation of a
// job: observe takes each report's delay, attributed to the rank that
// caused it. It is a pure state machine; the caller owns clocks and
// reporting.
type stragglerDetector struct {
	gen     uint64
	delay   []float64 // seconds per step, latest report, by rank
	known   []bool    // a delay has been reported for the rank
	strikes []int     // consecutive reports that met the rule
	active  []bool    // in a reported straggler episode
}

func newStragglerDetector(gen uint64, world int) *stragglerDetector {
	return &stragglerDetector{gen: gen, delay: make([]float64, world), known: make([]bool, world),
		strikes: make([]int, world), active: make([]bool, world)}
}

// observe records that rank delayed each step by delay seconds (in the
// latest report) and says whether a straggler episode of rank begins or
// ends with it; median is the other ranks' median delay.
func (d *stragglerDetector) observe(rank int, delay float64) (begins, ends bool, median float64) {
	d.delay[rank], d.known[rank] = delay, true
	var others []float64
	for r, v := range d.delay {
		if r != rank && d.known[r] {
			others = append(others, v)
		}
	}
	if len(others) == 0 {
		return false, false, 0
	}
	slices.Sort(others)
	median = others[len(others)/2]
	if len(others)%2 == 0 {
		median = (others[len(others)/2-1] + others[len(others)/2]) / 2
	}
	slow := delay >= stragglerMinDelay.Seconds() && delay >= stragglerFactor*median
	switch {
	case slow:
		d.strikes[rank]++
		if d.strikes[rank] >= stragglerReports && !d.active[rank] {
			d.active[rank] = true
			return true, false, median
		}
	case d.active[rank] && delay < stragglerMinDelay.Seconds()/2:
		d.strikes[rank], d.active[rank] = 0, false
		return false, true, median
	default:
		d.strikes[rank] = 0
	}
	return false, false, median
}

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
		culprit, delay = (r+n-1)%n, p.LeftWaitSeconds
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
	if d := e.stragglers; d == nil || d.gen != j.Generation || len(d.delay) != n {
		e.stragglers = newStragglerDetector(j.Generation, n)
	}
	begins, ends, median := e.stragglers.observe(culprit, delay)
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
	if e.run != nil {
		kind := "straggler"
		if ends {
			kind = "straggler_end"
		}
		_ = e.run.Log(map[string]any{"kind": kind, "time": now.UTC().Format(time.RFC3339Nano), "rank": culprit, "worker": id,
			"address": addr, "delay_seconds": delay, "median_others_seconds": median, "compute_seconds": compute,
			"step": p.Step, "generation": j.Generation, "mode": j.Spec.GetMode()})
	}
	s.emitLocked(e, pb.EventKind_EVENT_KIND_LOG, msg, nil)
}
