package worker

import "testing"

// TestStepPlan: where a task starts (scratch, mid-epoch, at an epoch's
// end, with another world size than the one that stopped) decides the
// steps of each epoch, the step count it ends at, and the positions after
// each step — those snapshots and checkpoints record.
func TestStepPlan(t *testing.T) {
	// 100 examples, 2 ranks of 8 per step: 50 per rank, 7 steps an epoch.
	p := stepPlan{trainLen: 100, world: 2, batch: 8, perEpoch: 7, epochs: 2}
	cases := []struct {
		name     string
		plan     stepPlan
		from     position
		steps0   int // steps in the start epoch
		total    int64
		consumed []int64 // the start epoch's positions after each step but its last
	}{
		{"scratch", p, position{}, 7, 14, []int64{16, 32, 48, 64, 80, 96}},
		// 3 steps of 16 done: 52 positions left, 26 a rank, 4 steps.
		{"mid-epoch", p, position{step: 3, consumed: 48}, 4, 14, []int64{64, 80, 96}},
		{"an epoch's end", p, position{step: 7, epoch: 1}, 7, 14, []int64{16, 32, 48, 64, 80, 96}},
		{"max_steps", stepPlan{trainLen: 100, world: 2, batch: 8, perEpoch: 7, epochs: 2, maxSteps: 9}, position{}, 7, 9,
			[]int64{16, 32, 48, 64, 80, 96}},
		// Three ranks go on where two stopped: 52 left, 18 a rank, 3
		// steps of 24; the last consumes the rest (capped at 100).
		{"another world size", stepPlan{trainLen: 100, world: 3, batch: 8, perEpoch: 5, epochs: 2}, position{step: 3, consumed: 48},
			3, 3 + 3 + 5, []int64{72, 96}},
		{"past the last epoch", p, position{step: 14, epoch: 2}, 7, 14, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.plan.total(c.from); got != c.total {
				t.Errorf("total = %d, want %d", got, c.total)
			}
			if c.from.epoch >= c.plan.epochs {
				return
			}
			e := c.from.epoch
			nb := c.plan.stepsIn(e, c.from)
			if nb != c.steps0 {
				t.Errorf("steps in epoch %d = %d, want %d", e, nb, c.steps0)
			}
			if next := c.plan.stepsIn(e+1, c.from); next != c.plan.perEpoch {
				t.Errorf("steps in epoch %d = %d, want a whole epoch's %d", e+1, next, c.plan.perEpoch)
			}
			start := c.plan.epochStart(e, c.from)
			if start != c.from.consumed || c.plan.epochStart(e+1, c.from) != 0 {
				t.Errorf("epoch starts: %d then %d; want %d then 0", start, c.plan.epochStart(e+1, c.from), c.from.consumed)
			}
			step := c.from.step
			for b := range nb {
				step++
				at := c.plan.after(step, e, start, b, nb)
				want := position{step: step, epoch: e + 1} // the epoch's end
				if b+1 < nb {
					want = position{step: step, epoch: e, consumed: c.consumed[b]}
				}
				if at != want {
					t.Errorf("after batch %d: %+v, want %+v", b, at, want)
				}
			}
		})
	}
	// The last batch of a resumed epoch ends it even when the order's
	// positions run out before it (capped at the split's size).
	if at := p.after(5, 0, 96, 0, 2); at != (position{step: 5, consumed: 100}) {
		t.Errorf("after the first of two batches from 96: %+v, want consumed 100", at)
	}
}
