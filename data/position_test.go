package data

import "testing"

// TestPositionMatchesTheTrainer walks the trainer's loop (an epoch
// resumed at consumed, then whole epochs; min(epochStart+b·batch·world, n)
// after b steps) and checks Position after every step count.
func TestPositionMatchesTheTrainer(t *testing.T) {
	for _, c := range []struct{ n, world, batch, epoch, consumed int }{
		{100, 1, 10, 0, 0},
		{100, 3, 7, 0, 0},
		{101, 2, 8, 2, 0},
		{101, 2, 8, 2, 40},
		{97, 4, 5, 1, 96},
		{10, 3, 64, 0, 0},
		{10, 3, 64, 0, 5},
	} {
		type pos struct {
			epoch    int
			consumed int64
			end      bool
		}
		want := []pos{{c.epoch, int64(c.consumed), false}}
		e, start := c.epoch, c.consumed
		for len(want) < 200 {
			nb := ResumeSteps(c.n, start, c.world, c.batch)
			for b := 1; b <= nb; b++ {
				if b == nb {
					want = append(want, pos{e + 1, 0, true})
				} else {
					want = append(want, pos{e, int64(min(start+b*c.batch*c.world, c.n)), false})
				}
			}
			e, start = e+1, 0
		}
		for steps, w := range want {
			ge, gc, gend := Position(c.n, c.world, c.batch, c.epoch, int64(c.consumed), int64(steps))
			if (pos{ge, gc, gend}) != w {
				t.Fatalf("%+v: after %d steps: Position = (%d, %d, %v), want (%d, %d, %v)", c, steps, ge, gc, gend, w.epoch, w.consumed, w.end)
			}
		}
	}
}

func TestPositionPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("Position(n = 0) did not panic")
		}
	}()
	Position(0, 1, 1, 0, 0, 1)
}
