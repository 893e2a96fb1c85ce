package worker

import (
	"context"
	"time"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// ringStatser is a ring that times its waits for the left neighbour and
// counts its frames (ringrpc's does).
type ringStatser interface {
	WaitStats() (collectives int64, waited time.Duration)
	FrameCounts() (sent, arrived int64)
	LeftIdle() time.Duration
}

// ringStatsOf returns the ring statistics of a ring-mode synchroniser, or
// nil.
func ringStatsOf(s synchronizer) ringStatser {
	if rs, ok := s.(*ringSync); ok {
		if st, ok := rs.ring.(ringStatser); ok {
			return st
		}
	}
	return nil
}

// stepTimes accumulates, between two progress reports, what a slow rank
// is identified by: this rank's compute time per step and (ring mode) its
// wait for the left neighbour.
type stepTimes struct {
	ring       ringStatser // nil outside ring mode
	compute    time.Duration
	steps      int
	lastWaited time.Duration
}

func newStepTimes(s synchronizer) *stepTimes {
	t := &stepTimes{ring: ringStatsOf(s)}
	if t.ring != nil {
		_, t.lastWaited = t.ring.WaitStats()
	}
	return t
}

// step records one step's forward and backward time.
func (t *stepTimes) step(compute time.Duration) {
	t.compute += compute
	t.steps++
}

// report fills p's per-step means since the last report and starts the
// next period.
func (t *stepTimes) report(p *pb.Progress) {
	if t.steps == 0 {
		return
	}
	p.ComputeSeconds = t.compute.Seconds() / float64(t.steps)
	if t.ring != nil {
		_, waited := t.ring.WaitStats()
		p.LeftWaitSeconds = (waited - t.lastWaited).Seconds() / float64(t.steps)
		t.lastWaited = waited
	}
	t.compute, t.steps = 0, 0
}

// ringFailure is a ring-mode task's error with the ring's frame counts at
// the time it failed, which the coordinator compares link by link to find
// a link that lost frames.
type ringFailure struct {
	err   error
	links *pb.RingLinks
}

func (e *ringFailure) Error() string { return e.err.Error() }

func (e *ringFailure) Unwrap() error { return e.err }

// withRingLinks wraps err with s's frame counts in ring mode.
func withRingLinks(s synchronizer, err error) error {
	st := ringStatsOf(s)
	if st == nil {
		return err
	}
	sent, arrived := st.FrameCounts()
	return &ringFailure{err: err, links: &pb.RingLinks{FramesSent: sent, FramesReceived: arrived, LeftIdleSeconds: st.LeftIdle().Seconds()}}
}

// injectDelay is the --debug-step-delay fault injection: it makes this
// rank slow by d per step, returning early when ctx ends.
func injectDelay(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
