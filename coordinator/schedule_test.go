package coordinator_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gradsync/gradsync/coordinator"
)

func TestSchedule(t *testing.T) {
	type pj = coordinator.Pending
	type pl = coordinator.Placement
	cases := []struct {
		name  string
		queue []pj
		idle  []string
		want  []pl
	}{
		{"empty", nil, []string{"a"}, nil},
		{"no workers", []pj{{"j1", 1}}, nil, nil},
		{"fits", []pj{{"j1", 2}}, []string{"a", "b", "c"}, []pl{{"j1", []string{"a", "b"}}}},
		{"two fit", []pj{{"j1", 1}, {"j2", 2}}, []string{"a", "b", "c"}, []pl{{"j1", []string{"a"}}, {"j2", []string{"b", "c"}}}},
		{"head blocks", []pj{{"j1", 3}, {"j2", 1}}, []string{"a", "b"}, nil},
		{"second blocks third", []pj{{"j1", 1}, {"j2", 5}, {"j3", 1}}, []string{"a", "b"}, []pl{{"j1", []string{"a"}}}},
	}
	for _, c := range cases {
		got := coordinator.Schedule(c.queue, c.idle)
		if diff := cmp.Diff(c.want, got); diff != "" {
			t.Errorf("%s: (-want +got)\n%s", c.name, diff)
		}
	}
}

// TestScheduleQueuedWhileGangIncomplete: as workers arrive one by one, a
// 3-worker job waits until its whole gang is idle, and the 1-worker job
// behind it waits too (no backfilling).
func TestScheduleQueuedWhileGangIncomplete(t *testing.T) {
	queue := []coordinator.Pending{{Job: "big", Workers: 3}, {Job: "small", Workers: 1}}
	var idle []string
	for _, w := range []string{"w0", "w1"} {
		idle = append(idle, w)
		if got := coordinator.Schedule(queue, idle); got != nil {
			t.Fatalf("with %v idle: placed %v; want nothing until the gang of 3 is complete", idle, got)
		}
	}
	idle = append(idle, "w2")
	got := coordinator.Schedule(queue, idle)
	want := []coordinator.Placement{{Job: "big", Workers: []string{"w0", "w1", "w2"}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("gang complete (-want +got)\n%s", diff)
	}
	idle = append(idle, "w3")
	got = coordinator.Schedule(queue, idle)
	want = append(want, coordinator.Placement{Job: "small", Workers: []string{"w3"}})
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("one more worker (-want +got)\n%s", diff)
	}
}
