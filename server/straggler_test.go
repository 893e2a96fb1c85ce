package server_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/coordinator"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
	"github.com/gradsync/gradsync/server"
)

// stragglerEvents runs a 3-worker job of mode in which worker w1 is
// slowed by delay per step, and returns the job's straggler events and
// w1's rank.
func stragglerEvents(t *testing.T, mode string, delay time.Duration, steps int64) ([]string, int) {
	ctx := testCtx(t, 90*time.Second)
	c := newCluster(t, server.Config{}, 0)
	c.stepDelay = map[string]time.Duration{"w1": delay}
	for i := range 3 {
		c.addTCPWorker(fmt.Sprintf("w%d", i))
	}
	c.waitWorkers(ctx, pb.WorkerState_WORKER_STATE_IDLE, "w0", "w1", "w2")
	job := c.submit(ctx, &pb.JobSpec{Model: "logreg", Mode: mode, Workers: proto.Int32(3), LogEverySteps: 2, MaxSteps: steps,
		Dataset: &pb.DatasetSpec{Name: "synthetic", SyntheticTrain: 2000, SyntheticTest: 200}})
	var out []string
	var final *pb.Job
	for _, ev := range c.watchAll(ctx, job.Id) {
		final = ev.GetJob()
		if ev.Kind == pb.EventKind_EVENT_KIND_LOG && strings.Contains(ev.Message, "straggler") {
			out = append(out, ev.Message)
		}
	}
	if final.GetState() != pb.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("job %v: %q", final.GetState(), final.GetMessage())
	}
	for r, p := range final.GetRanks() {
		t.Logf("rank %d (%s): compute %.3fs, left wait %.3fs per step", r, final.GetWorkerIds()[r], p.GetComputeSeconds(), p.GetLeftWaitSeconds())
	}
	return out, slices.Index(final.GetWorkerIds(), "w1")
}

// TestStragglerReported: a ring or ps job with one worker slowed by 150 ms
// a step reports it once, naming its rank, worker and address and the
// delay; an undisturbed job reports none.
func TestStragglerReported(t *testing.T) {
	for _, mode := range []string{"ring", "ps"} {
		t.Run(mode, func(t *testing.T) {
			evs, rank := stragglerEvents(t, mode, 150*time.Millisecond, 12)
			t.Logf("events: %q", evs)
			if len(evs) != 1 || !strings.Contains(evs[0], fmt.Sprintf("straggler: rank %d (worker w1, 127.0.0.1:", rank)) {
				t.Fatalf("straggler events %q; want one naming rank %d (worker w1, its address)", evs, rank)
			}
			// The figures the event reports meet the rule that named the
			// rank (how large they are depends on the machine's load, so
			// they are not bounded from above).
			var delay, median float64
			if i := strings.Index(evs[0], "delays every step by "); i < 0 {
				t.Fatalf("event %q does not say the delay", evs[0])
			} else if _, err := fmt.Sscanf(evs[0][i:], "delays every step by %fs", &delay); err != nil {
				t.Fatalf("event %q: %v", evs[0], err)
			}
			if i := strings.Index(evs[0], "median of the other ranks "); i < 0 {
				t.Fatalf("event %q does not say the others' median", evs[0])
			} else if _, err := fmt.Sscanf(evs[0][i:], "median of the other ranks %fs", &median); err != nil {
				t.Fatalf("event %q: %v", evs[0], err)
			}
			if delay+0.001 < coordinator.StragglerMinDelay.Seconds() || delay+0.002 < coordinator.StragglerFactor*median { // printed to the ms
				t.Errorf("delay %.3fs per step (others' median %.3fs) does not meet the straggler rule", delay, median)
			}
		})
		t.Run(mode+"/undisturbed", func(t *testing.T) {
			if evs, _ := stragglerEvents(t, mode, 0, 100); len(evs) != 0 {
				t.Fatalf("undisturbed job reported %q", evs)
			}
		})
	}
}
