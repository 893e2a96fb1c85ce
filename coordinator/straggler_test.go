package coordinator_test

import (
	"testing"

	"github.com/gradsync/gradsync/coordinator"
)

// TestStragglerDetector: an episode begins after two reports that meet
// the rule, is announced once, and ends when the rank keeps up again;
// jitter, a single slow report, and a job-wide slowdown are no episode.
func TestStragglerDetector(t *testing.T) {
	type report struct {
		rank         int
		delay        float64
		begins, ends bool
	}
	cases := []struct {
		name    string
		world   int
		reports []report
	}{
		{"slow rank", 3, []report{
			{0, 0.002, false, false}, {2, 0.001, false, false}, {1, 0.2, false, false},
			{0, 0.003, false, false}, {2, 0.002, false, false}, {1, 0.21, true, false},
			{1, 0.2, false, false}, {1, 0.2, false, false}, // announced once
			{1, 0.03, false, false}, // between the thresholds: still slow-ish, not over
			{1, 0.01, false, true},
			{1, 0.2, false, false}, {1, 0.2, true, false}, // a new episode
		}},
		{"one slow report is jitter", 3, []report{
			{0, 0.002, false, false}, {2, 0.001, false, false}, {1, 0.3, false, false},
			{1, 0.002, false, false}, {1, 0.3, false, false}, {1, 0.002, false, false},
		}},
		{"below the minimum", 3, []report{
			{0, 0.001, false, false}, {2, 0.001, false, false}, {1, 0.04, false, false}, {1, 0.04, false, false}, {1, 0.04, false, false},
		}},
		{"everyone slow is no straggler", 4, []report{
			{0, 0.1, false, false}, {1, 0.12, false, false}, {2, 0.11, false, false}, {3, 0.2, false, false},
			{0, 0.1, false, false}, {1, 0.12, false, false}, {2, 0.11, false, false}, {3, 0.2, false, false},
		}},
		{"two ranks", 2, []report{
			{0, 0.001, false, false}, {1, 0.15, false, false}, {0, 0.001, false, false}, {1, 0.15, true, false},
		}},
		{"no others reported yet", 3, []report{{1, 0.5, false, false}, {1, 0.5, false, false}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := coordinator.NewStragglers(1, tc.world)
			for i, r := range tc.reports {
				begins, ends, _ := d.Observe(r.rank, r.delay)
				if begins != r.begins || ends != r.ends {
					t.Errorf("report %d (rank %d, %.3fs): begins %v ends %v; want %v %v", i, r.rank, r.delay, begins, ends, r.begins, r.ends)
				}
			}
		})
	}
}

// TestStragglersPerGeneration: a new generation (or world size) needs a
// new detector, so an episode of the old ring is not carried over.
func TestStragglersPerGeneration(t *testing.T) {
	var d *coordinator.Stragglers
	if d.For(1, 3) {
		t.Fatal("a nil detector follows no generation")
	}
	d = coordinator.NewStragglers(1, 3)
	if !d.For(1, 3) || d.For(2, 3) || d.For(1, 2) {
		t.Fatal("For: want generation 1 of 3 only")
	}
	if got := coordinator.RingDelayCulprit(0, 3); got != 2 {
		t.Fatalf("rank 0 waits for rank %d; want 2", got)
	}
}
