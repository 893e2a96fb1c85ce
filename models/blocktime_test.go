package models

import (
	"math"
	"testing"
)

// TestBlockTimes: one finite, positive figure per block; cutting by them
// never leaves a larger slowest stage (by those figures) than cutting by
// parameter count.
func TestBlockTimes(t *testing.T) {
	for _, name := range []string{"cnn", "resnet8", "vit-tiny"} {
		t.Run(name, func(t *testing.T) {
			net, err := New(name, Options{Channels: 1, Height: 28, Width: 28, Classes: 10, Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer net.Close()
			times, err := BlockTimes(net, 8, 3)
			if err != nil {
				t.Fatal(err)
			}
			blocks := net.Blocks()
			if len(times) != len(blocks) {
				t.Fatalf("%d times for %d blocks", len(times), len(blocks))
			}
			for i, v := range times {
				if !(v > 0) || math.IsInf(v, 0) {
					t.Errorf("block %s: %v s", blocks[i].Name, v)
				}
			}
			slowest := func(st []Stage) float64 {
				worst := 0.0
				for _, s := range st {
					sum := 0.0
					for _, b := range s.Blocks {
						for i := range blocks {
							if blocks[i].Name == b.Name {
								sum += times[i]
							}
						}
					}
					worst = max(worst, sum)
				}
				return worst
			}
			byTime, err := Partition(net, 2, Balance{By: ByTime, Times: times})
			if err != nil {
				t.Fatal(err)
			}
			byParams, err := Partition(net, 2, Balance{})
			if err != nil {
				t.Fatal(err)
			}
			if a, b := slowest(byTime), slowest(byParams); a > b {
				t.Errorf("cut by time: slowest stage %.3g s; by parameters %.3g s", a, b)
			}
			t.Logf("%s: block seconds %.3g; stage 1 starts at %s by time, at %s by parameters", name, times,
				byTime[1].Blocks[0].Name, byParams[1].Blocks[0].Name)
		})
	}
}

// TestBlockTimesRefuses: nonsense arguments are errors, not panics.
func TestBlockTimesRefuses(t *testing.T) {
	net, err := New("mlp", Options{Channels: 1, Height: 28, Width: 28, Classes: 10, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer net.Close()
	for _, c := range [][2]int{{0, 1}, {1, 0}, {-1, 3}} {
		if _, err := BlockTimes(net, c[0], c[1]); err == nil {
			t.Errorf("batch %d reps %d: no error", c[0], c[1])
		}
	}
}
