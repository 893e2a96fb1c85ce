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
		{"no workers", []pj{{Job: "j1", Workers: 1}}, nil, nil},
		{"fits", []pj{{Job: "j1", Workers: 2}}, []string{"a", "b", "c"}, []pl{{"j1", []string{"a", "b"}}}},
		{"two fit", []pj{{Job: "j1", Workers: 1}, {Job: "j2", Workers: 2}}, []string{"a", "b", "c"}, []pl{{"j1", []string{"a"}}, {"j2", []string{"b", "c"}}}},
		{"head blocks", []pj{{Job: "j1", Workers: 3}, {Job: "j2", Workers: 1}}, []string{"a", "b"}, nil},
		{"second blocks third", []pj{{Job: "j1", Workers: 1}, {Job: "j2", Workers: 5}, {Job: "j3", Workers: 1}}, []string{"a", "b"}, []pl{{"j1", []string{"a"}}}},
	}
	for _, c := range cases {
		got := coordinator.Schedule(c.queue, c.idle, nil, nil)
		if diff := cmp.Diff(c.want, got); diff != "" {
			t.Errorf("%s: (-want +got)\n%s", c.name, diff)
		}
	}
}

// TestScheduleEntrypoints: a job that runs a user's command goes only to
// workers that run commands; FIFO still holds (it blocks the queue behind
// it while too few such workers are idle), and the others stay free for
// the jobs behind it once it is placed.
func TestScheduleEntrypoints(t *testing.T) {
	runs := func(id string) bool { return id == "b" || id == "d" }
	queue := []coordinator.Pending{{Job: "torch", Workers: 2, Entrypoint: true}, {Job: "go", Workers: 2}}
	if got := coordinator.Schedule(queue, []string{"a", "b", "c"}, runs, nil); got != nil {
		t.Fatalf("one command-running worker idle: placed %v; want nothing (FIFO)", got)
	}
	if got := coordinator.Schedule(queue, []string{"a", "b", "c"}, nil, nil); got != nil {
		t.Fatalf("no worker runs commands: placed %v; want nothing", got)
	}
	got := coordinator.Schedule(queue, []string{"a", "b", "c", "d"}, runs, nil)
	want := []coordinator.Placement{{Job: "torch", Workers: []string{"b", "d"}}, {Job: "go", Workers: []string{"a", "c"}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("(-want +got)\n%s", diff)
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
		if got := coordinator.Schedule(queue, idle, nil, nil); got != nil {
			t.Fatalf("with %v idle: placed %v; want nothing until the gang of 3 is complete", idle, got)
		}
	}
	idle = append(idle, "w2")
	got := coordinator.Schedule(queue, idle, nil, nil)
	want := []coordinator.Placement{{Job: "big", Workers: []string{"w0", "w1", "w2"}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("gang complete (-want +got)\n%s", diff)
	}
	idle = append(idle, "w3")
	got = coordinator.Schedule(queue, idle, nil, nil)
	want = append(want, coordinator.Placement{Job: "small", Workers: []string{"w3"}})
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("one more worker (-want +got)\n%s", diff)
	}
}
