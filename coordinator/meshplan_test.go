package coordinator

import (
	"slices"
	"testing"
)

// TestPlanStages: a pipeline job's new generation runs on whole replicas,
// each survivor on the stage it held where it can be.
func TestPlanStages(t *testing.T) {
	// 2 replicas × 2 stages: a0 b0 | a1 b1 (ranks 0..3; stage = rank mod 2).
	held := map[string]int{"a0": 0, "b0": 1, "a1": 0, "b1": 1}
	var r Recovery
	for _, tc := range []struct {
		name            string
		survivors, idle []string
		grow            bool
		want            []string // nil: refused
	}{
		{"b0 lost, nobody idle: one replica, each on its stage", []string{"a0", "a1", "b1"}, nil, false, []string{"a0", "b1"}},
		{"a0 lost, nobody idle", []string{"b0", "a1", "b1"}, nil, false, []string{"a1", "b0"}},
		{"b0 lost, a spare: two replicas again, the spare takes the lost stage", []string{"a0", "a1", "b1"}, []string{"x"}, false, []string{"a0", "b1", "a1", "x"}},
		{"both of stage 1 lost: a survivor changes stage", []string{"a0", "a1"}, nil, false, []string{"a0", "a1"}},
		{"one survivor: below one replica", []string{"a0"}, nil, false, nil},
		{"growth by a part of a replica is none", []string{"a0", "b1"}, []string{"x"}, true, nil},
		{"growth by a replica", []string{"a0", "b1"}, []string{"x", "y", "z"}, true, []string{"a0", "b1", "x", "y"}},
	} {
		got, ok := r.PlanStages(tc.survivors, tc.idle, 4, 2, 2, tc.grow, held, nil)
		if ok != (tc.want != nil) || !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, %v; want %v", tc.name, got, ok, tc.want)
		}
	}
	// An evicted worker is never taken back.
	r.Evict("x")
	if got, ok := r.PlanStages([]string{"a0", "a1", "b1"}, []string{"x"}, 4, 2, 2, false, held, nil); !ok || !slices.Equal(got, []string{"a0", "b1"}) {
		t.Errorf("with x evicted: %v, %v", got, ok)
	}
}
