package server

import (
	"fmt"
	"time"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// ringCulprit finds the rank cut off from a ring from every rank's frame
// counts after the ring stalled (links[r] is rank r's report). Link
// r → r+1 lost frames when r sent more than arrived at r+1 and r+1's left
// link has been idle for at least minIdle seconds (a link that is merely
// slow, or a rank that closed while frames were in flight, is not idle
// that long). A rank at both ends of broken links is cut off; with a single
// broken link the rank whose endpoint stopped receiving is (its address is
// what its neighbour cannot reach). Any other pattern names nobody.
func ringCulprit(links []*pb.RingLinks, minIdle float64) (culprit int, why string, ok bool) {
	n := len(links)
	if n < 2 {
		return 0, "", false
	}
	for _, l := range links {
		if l == nil {
			return 0, "", false
		}
	}
	var broken []int // senders of broken links
	ends := make([]int, n)
	for r := range n {
		to := (r + 1) % n
		if links[r].FramesSent > links[to].FramesReceived && links[to].LeftIdleSeconds >= minIdle {
			broken = append(broken, r)
			ends[r]++
			ends[to]++
		}
	}
	describe := func(r int) string {
		to := (r + 1) % n
		return fmt.Sprintf("rank %d sent %d frames to rank %d, %d arrived, none for %.1fs",
			r, links[r].FramesSent, to, links[to].FramesReceived, links[to].LeftIdleSeconds)
	}
	switch {
	case len(broken) == 1:
		return (broken[0] + 1) % n, describe(broken[0]), true
	case len(broken) == 2 && n > 2:
		for r, k := range ends {
			if k == 2 {
				return r, describe(broken[0]) + "; " + describe(broken[1]), true
			}
		}
	}
	return 0, "", false
}

// ringFailedLocked records a ring rank's failure report. Once every rank
// of the generation has reported, and their frame counts show the link
// that lost frames, the rank cut off is evicted (an elastic job recovers
// without it) or the job fails naming it; it reports whether it acted.
// Otherwise the caller's usual handling applies.
func (s *Server) ringFailedLocked(e *jobEntry, d *pb.TaskDone) bool {
	j := e.job
	n := len(j.WorkerIds)
	if d.RingLinks == nil || int(d.Rank) >= n {
		return false
	}
	if e.ringLinks == nil || e.ringLinksGen != j.Generation || len(e.ringLinks) != n {
		e.ringLinks, e.ringLinksGen = make([]*pb.RingLinks, n), j.Generation
	}
	e.ringLinks[d.Rank] = d.RingLinks
	minIdle := j.Spec.GetStepTimeoutSeconds() / 2
	rank, why, ok := ringCulprit(e.ringLinks, minIdle)
	if !ok {
		return false
	}
	e.ringLinks = nil
	id := j.WorkerIds[rank]
	w := s.workers[id]
	if w == nil {
		return false
	}
	reason := fmt.Sprintf("cut off from the ring (rank %d): %s", rank, why)
	now := s.cfg.Now()
	s.log.Warn("ring link broken", "job", j.Id, "rank", rank, "worker", id, "address", w.info.Address, "evidence", why)
	if e.run != nil {
		_ = e.run.Log(map[string]any{"kind": "ring_cut", "time": now.UTC().Format(time.RFC3339Nano), "rank": rank, "worker": id,
			"address": w.info.Address, "evidence": why, "generation": j.Generation})
	}
	if e.evicted == nil {
		e.evicted = map[string]bool{}
	}
	e.evicted[id] = true // never taken back into this job
	// The worker is still connected (its heartbeats arrive) and BUSY, so
	// recovery neither keeps it nor takes it as an idle worker.
	recovered := s.recoverLocked(e, w, reason)
	if !recovered {
		s.endJobLocked(e, pb.JobState_JOB_STATE_FAILED, fmt.Sprintf("worker %s (%s) %s", id, w.info.Address, reason))
	}
	if w.info.JobId == j.Id {
		w.send(&pb.ConnectResponse{Msg: &pb.ConnectResponse_Cancel{Cancel: &pb.CancelTask{JobId: j.Id, Reason: "evicted: " + reason}}})
		w.info.JobId = ""
		w.info.State = pb.WorkerState_WORKER_STATE_IDLE
	}
	s.scheduleLocked()
	return true
}
