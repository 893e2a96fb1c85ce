package worker

import (
	"time"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// stepTimes accumulates, between two progress reports, what the
// coordinator finds a slow rank by: this rank's compute time per step and
// (ring mode) its wait for the left neighbour.
type stepTimes struct {
	compute    time.Duration
	steps      int
	lastWaited time.Duration
}

// newStepTimes starts counting; waited is the synchronizer's total wait
// for the left neighbour so far (syncStats.leftWait).
func newStepTimes(waited time.Duration) *stepTimes { return &stepTimes{lastWaited: waited} }

// step records one step's forward and backward time.
func (t *stepTimes) step(compute time.Duration) {
	t.compute += compute
	t.steps++
}

// report fills p's per-step means since the last report, given the total
// wait for the left neighbour now, and starts the next period.
func (t *stepTimes) report(p *pb.Progress, waited time.Duration) {
	if t.steps == 0 {
		return
	}
	p.ComputeSeconds = t.compute.Seconds() / float64(t.steps)
	p.LeftWaitSeconds = (waited - t.lastWaited).Seconds() / float64(t.steps)
	t.lastWaited = waited
	t.compute, t.steps = 0, 0
}
