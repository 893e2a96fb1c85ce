package coordinator_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gradsync/gradsync/coordinator"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

const gib = 1 << 30

// TestScheduleMemory: ranks go where their memory need fits — the first
// idle workers when they fit (today's order), else the largest needs on
// the workers that offer most; a job that fits nowhere now blocks the
// queue; a worker that reports nothing fits anything.
func TestScheduleMemory(t *testing.T) {
	mem := map[string]uint64{"a": 1 * gib, "b": 4 * gib, "c": 2 * gib, "d": 0}
	memory := func(id string) uint64 { return mem[id] }
	stages := []coordinator.Need{{Bytes: 3 * gib, What: "pipeline stage 0 of 2"}, {Bytes: gib / 2, What: "pipeline stage 1 of 2"}}
	type pl = coordinator.Placement
	cases := []struct {
		name  string
		queue []coordinator.Pending
		idle  []string
		want  []pl
	}{
		{"no needs: idle order", []coordinator.Pending{{Job: "j", Workers: 2}}, []string{"a", "c"}, []pl{{"j", []string{"a", "c"}}}},
		{"first fit kept", []coordinator.Pending{{Job: "j", Workers: 2, Memory: stages}}, []string{"b", "a"}, []pl{{"j", []string{"b", "a"}}}},
		{"stage 0 moved to the largest", []coordinator.Pending{{Job: "j", Workers: 2, Memory: stages}}, []string{"a", "c", "b"}, []pl{{"j", []string{"b", "c"}}}},
		{"D=2: each replica's stage 0 on a large one", []coordinator.Pending{{Job: "j", Workers: 4, Memory: stages}}, []string{"a", "c", "b", "d"},
			[]pl{{"j", []string{"d", "c", "b", "a"}}}},
		{"does not fit: blocks", []coordinator.Pending{{Job: "j", Workers: 2, Memory: stages}, {Job: "k", Workers: 1}}, []string{"a", "c"}, nil},
		{"not reported fits", []coordinator.Pending{{Job: "j", Workers: 1, Memory: []coordinator.Need{{Bytes: 100 * gib}}}}, []string{"a", "d"}, []pl{{"j", []string{"d"}}}},
	}
	for _, c := range cases {
		got := coordinator.Schedule(c.queue, c.idle, nil, memory)
		if diff := cmp.Diff(c.want, got); diff != "" {
			t.Errorf("%s: (-want +got)\n%s", c.name, diff)
		}
	}
}

// TestCoreRefusesWhatNoWorkerHolds: with every worker connected that the
// job asks for, a job whose stage no worker's memory holds fails at
// placement naming the stage, what it needs and what the workers offer,
// and the job behind it starts; with too few workers connected it waits.
// A pipeline whose stages each fit is placed.
func TestCoreRefusesWhatNoWorkerHolds(t *testing.T) {
	c := coordinator.NewCore(5 * time.Second)
	limited := func(sec float64, id string, mem uint64) coordinator.Hello {
		h := hello(sec, id)
		h.Memory = mem
		return h
	}
	step(t, c, limited(0, "w0", 2*gib), coordinator.Welcome{Worker: "w0"})
	whole := []coordinator.Need{{Bytes: 5 * gib, What: "the whole model (parameters 1.00 GiB, …)"}}
	step(t, c, coordinator.Submit{At: at(1), Job: "big", Workers: 1, Memory: whole},
		coordinator.EndJob{Job: "big", State: pb.JobState_JOB_STATE_FAILED,
			Message: "cannot be placed: rank 0 holds the whole model (parameters 1.00 GiB, …), which needs 5.00 GiB of memory, but the largest worker offers 2.00 GiB (workers' memory: w0 2.00 GiB)"})
	if q := c.Queued(); len(q) != 0 {
		t.Fatalf("queue %v after the refusal; want empty", q)
	}
	// 4 stages that each fit: it waits for its 4th worker, then runs.
	stages := []coordinator.Need{{Bytes: 2 * gib, What: "stage 0"}, {Bytes: gib, What: "stage 1"}, {Bytes: gib, What: "stage 2"}, {Bytes: gib, What: "stage 3"}}
	step(t, c, coordinator.Submit{At: at(2), Job: "pipe", Workers: 4, Memory: stages})
	step(t, c, limited(3, "w1", gib), coordinator.Welcome{Worker: "w1"})
	step(t, c, limited(4, "w2", gib), coordinator.Welcome{Worker: "w2"})
	step(t, c, limited(5, "w3", gib), coordinator.Welcome{Worker: "w3"},
		coordinator.Place{Job: "pipe", Workers: []string{"w0", "w1", "w2", "w3"}})
	// The same stages where stage 0 fits no idle or busy worker: refused,
	// naming it; the small job behind it then starts.
	step(t, c, limited(6, "w4", gib), coordinator.Welcome{Worker: "w4"})
	step(t, c, coordinator.Submit{At: at(7), Job: "pipe2", Workers: 2,
		Memory: []coordinator.Need{{Bytes: 3 * gib, What: "pipeline stage 0 of 2"}, {Bytes: gib, What: "pipeline stage 1 of 2"}}},
		coordinator.EndJob{Job: "pipe2", State: pb.JobState_JOB_STATE_FAILED,
			Message: "cannot be placed: rank 0 holds pipeline stage 0 of 2, which needs 3.00 GiB of memory, but the largest worker offers 2.00 GiB (workers' memory: w0 2.00 GiB, w1 1.00 GiB, w2 1.00 GiB, w3 1.00 GiB, w4 1.00 GiB)"})
	step(t, c, coordinator.Submit{At: at(8), Job: "small", Workers: 1}, coordinator.Place{Job: "small", Workers: []string{"w4"}})
}

// A refusal message names the stage that does not fit.
func TestUnplaceableNamesTheStage(t *testing.T) {
	memory := func(id string) uint64 { return map[string]uint64{"a": gib, "b": 2 * gib}[id] }
	j := coordinator.Pending{Job: "j", Workers: 2, Memory: []coordinator.Need{{Bytes: gib / 2, What: "pipeline stage 0 of 2"}, {Bytes: 3 * gib, What: "pipeline stage 1 of 2"}}}
	why := coordinator.Unplaceable(j, []string{"a", "b"}, nil, memory)
	if !strings.Contains(why, "rank 1 holds pipeline stage 1 of 2, which needs 3.00 GiB") || !strings.Contains(why, "a 1.00 GiB, b 2.00 GiB") &&
		!strings.Contains(why, "b 2.00 GiB, a 1.00 GiB") {
		t.Fatalf("message %q", why)
	}
	if why := coordinator.Unplaceable(j, []string{"a"}, nil, memory); why != "" {
		t.Fatalf("one worker for two ranks: %q; want \"\" (it waits)", why)
	}
}
