package coordinator_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/gradsync/gradsync/coordinator"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

const (
	running   = pb.JobState_JOB_STATE_RUNNING
	cancelled = pb.JobState_JOB_STATE_CANCELLED
	failed    = pb.JobState_JOB_STATE_FAILED
	succeeded = pb.JobState_JOB_STATE_SUCCEEDED
)

// peers is every worker's address, as the test hellos give them.
func peers(ids ...string) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = id + ":1"
	}
	return out
}

// assigns is what starting generation gen of job on ids calls for.
func assigns(job string, gen uint64, ids ...string) []coordinator.Action {
	out := []coordinator.Action{coordinator.StartGeneration{Job: job, Generation: gen, Workers: ids}}
	for r, id := range ids {
		out = append(out, coordinator.Assign{Job: job, Generation: gen, Worker: id, Rank: r, Peers: peers(ids...)})
	}
	return out
}

// runningJob connects workers, submits job (mode, on the first n of
// them) and runs it: generation 1 is assigned.
func runningJob(t *testing.T, job, mode string, n int, workers ...string) *coordinator.Core {
	t.Helper()
	c := coordinator.NewCore(5 * time.Second)
	for _, id := range workers {
		step(t, c, hello(0, id), coordinator.Welcome{Worker: id})
	}
	step(t, c, coordinator.Submit{At: at(0.5), Job: job, Workers: n, Mode: mode}, coordinator.Place{Job: job, Workers: workers[:n]})
	want := append([]coordinator.Action{coordinator.SetState{Job: job, State: running, Message: "running on 3 worker(s)", Workers: workers[:n]}},
		assigns(job, 1, workers[:n]...)...)
	if n != 3 {
		t.Fatal("runningJob scripts run 3-worker jobs")
	}
	step(t, c, coordinator.Prepared{At: at(1), Job: job}, want...)
	return c
}

// elasticJob runs an elastic ring job j (3 workers, at least 2) on w0,
// w1, w2.
func elasticJob(t *testing.T) *coordinator.Core {
	t.Helper()
	c := coordinator.NewCore(5 * time.Second)
	for _, id := range []string{"w0", "w1", "w2"} {
		step(t, c, hello(0, id), coordinator.Welcome{Worker: id})
	}
	step(t, c, coordinator.Submit{At: at(0.5), Job: "j", Workers: 3, MinWorkers: 2, Mode: "ring", StepTimeoutSeconds: 10},
		coordinator.Place{Job: "j", Workers: []string{"w0", "w1", "w2"}})
	step(t, c, coordinator.Prepared{At: at(1), Job: "j"},
		append([]coordinator.Action{coordinator.SetState{Job: "j", State: running, Message: "running on 3 worker(s)", Workers: []string{"w0", "w1", "w2"}}},
			assigns("j", 1, "w0", "w1", "w2")...)...)
	return c
}

// recovering is what the core says as generation gen of j starts on ids
// after the loss of lost (or growth), with the survivors told to stop.
func recovering(gen uint64, stop []string, ids []string, trained int64, from string, tail coordinator.Recovering) []coordinator.Action {
	var out []coordinator.Action
	for _, id := range stop {
		out = append(out, coordinator.CancelTask{Job: "j", Worker: id, Reason: fmt.Sprintf("recovering: generation %d", gen), KeepState: true})
	}
	start := assigns("j", gen, ids...)
	for i, a := range start {
		switch a := a.(type) {
		case coordinator.Assign:
			a.Trained, a.ResumeFrom = trained, from
			start[i] = a
		case coordinator.StartGeneration:
			a.ResumeFrom = from
			start[i] = a
		}
	}
	return append(append(out, start...), tail)
}

// TestW2LostGeneration2OnW0W1W3: w2 of an elastic ring job on {w0, w1,
// w2} is lost at t=3 s, after step 30; the core asks for the checkpoint
// pin, then tells the survivors to stop generation 1 keeping their
// in-memory snapshots and assigns generation 2 to w0, w1 and the idle
// w3; rank 0 says it started from rank 1's snapshot, which ends the
// recovery.
func TestW2LostGeneration2OnW0W1W3(t *testing.T) {
	c := elasticJob(t)
	step(t, c, hello(2, "w3"), coordinator.Welcome{Worker: "w3"})
	for r, id := range []string{"w0", "w1", "w2"} {
		step(t, c, coordinator.Progress{At: at(2.5), Job: "j", Worker: id, Generation: 1, Rank: r, Step: 30})
	}
	step(t, c, coordinator.Disconnected{At: at(3), Worker: "w2", Reason: "its connection broke"}, coordinator.Disconnect{Worker: "w2"},
		coordinator.WorkerLost{Worker: "w2", Address: "w2:1", Job: "j", Reason: "its connection broke", Silent: 3 * time.Second},
		coordinator.PinCheckpoint{Job: "j", Generation: 2})
	if p := c.RecoveryPhase("j"); p != coordinator.Pinning {
		t.Fatalf("phase %v; want pinning", p)
	}
	step(t, c, coordinator.Pinned{At: at(3.1), Job: "j"}, recovering(2, []string{"w0", "w1"}, []string{"w0", "w1", "w3"}, 30, "",
		coordinator.Recovering{Job: "j", Lost: "w2", Address: "w2:1", Reason: "its connection broke", Generation: 2, Workers: 3, Before: 2, LastStep: 30})...)
	wantWorker(t, c, "w3", pb.WorkerState_WORKER_STATE_BUSY, "j")
	// A late report of generation 1 changes nothing.
	step(t, c, coordinator.TaskDone{At: at(3.5), Worker: "w0", Job: "j", Generation: 1, Rank: 0, Error: "cancelled"})
	got, err := c.Step(coordinator.Started{At: at(4), Worker: "w0", Job: "j", Rank: 0,
		Task: &pb.TaskStarted{JobId: "j", Generation: 2, Source: "memory", SourceRank: 1, Step: 29, NewestStep: 30}})
	if err != nil || len(got) != 1 {
		t.Fatalf("TaskStarted: %v, %v", got, err)
	}
	if gs, ok := got[0].(coordinator.GenerationStarted); !ok || gs.Outcome == nil || gs.Outcome.Record["steps_redone"] != int64(1) {
		t.Fatalf("TaskStarted: %#v; want the recovery's end, one step redone", got[0])
	}
	if p := c.RecoveryPhase("j"); p != coordinator.Steady {
		t.Fatalf("phase %v; want steady", p)
	}
	if j, _ := c.Job("j"); j.Generation != 2 || j.State != running || !cmp.Equal(j.Members, []string{"w0", "w1", "w3"}) {
		t.Fatalf("job %+v; want generation 2 running on w0, w1, w3", j)
	}
}

// TestElasticGrowsBackOntoIdleWorker: an elastic job that lost w2 and
// found no idle worker runs on two; when w4 connects it grows back onto
// it: every member stops its generation (keeping its snapshot), and
// generation 3 runs on all three. Before its recovery ended it does not
// grow.
func TestElasticGrowsBackOntoIdleWorker(t *testing.T) {
	c := elasticJob(t)
	step(t, c, coordinator.Disconnected{At: at(3), Worker: "w2", Reason: "gone"}, coordinator.Disconnect{Worker: "w2"},
		coordinator.WorkerLost{Worker: "w2", Address: "w2:1", Job: "j", Reason: "gone", Silent: 3 * time.Second},
		coordinator.PinCheckpoint{Job: "j", Generation: 2})
	step(t, c, coordinator.Pinned{At: at(3), Job: "j", Path: "ckpt-10"}, recovering(2, []string{"w0", "w1"}, []string{"w0", "w1"}, 0, "ckpt-10",
		coordinator.Recovering{Job: "j", Lost: "w2", Address: "w2:1", Reason: "gone", Checkpoint: "ckpt-10", Generation: 2, Workers: 2, Before: 2})...)
	step(t, c, hello(5, "w4"), coordinator.Welcome{Worker: "w4"}) // still rejoining
	step(t, c, coordinator.Progress{At: at(6), Job: "j", Worker: "w0", Generation: 2, Rank: 0, Step: 12},
		coordinator.Recovered{Job: "j", Generation: 2, Outcome: coordinator.Outcome{
			Message: "recovered from the loss of w2 in 3.0s: generation 2 training again from step 10 (about 0 steps redone)",
			Record: map[string]any{"kind": "recovered", "time": "2026-01-02T03:04:11Z", "lost_worker": "w2", "recovery_seconds": 3.0,
				"generation": uint64(2), "last_step_before": int64(0), "checkpoint": "ckpt-10", "steps_redone": int64(0), "first_step_reported": int64(12)},
			Seconds: 3}})
	step(t, c, hello(7, "w5"), coordinator.Welcome{Worker: "w5"}, coordinator.PinCheckpoint{Job: "j", Generation: 3})
	step(t, c, coordinator.Pinned{At: at(7.5), Job: "j"}, recovering(3, []string{"w0", "w1"}, []string{"w0", "w1", "w4"}, 12, "ckpt-10",
		coordinator.Recovering{Job: "j", Checkpoint: "ckpt-10", Generation: 3, Workers: 3, Before: 2, LastStep: 12})...)
}

// TestCancelStopsEveryMemberThenTasksStopped: cancelling a running job
// ends it (EndJob CANCELLED) and tells every member to stop; the core
// says TasksStopped only once every task has stopped — one said so, one
// was lost — and a report of another generation does not count.
func TestCancelStopsEveryMemberThenTasksStopped(t *testing.T) {
	c := runningJob(t, "j", "ps", 3, "w0", "w1", "w2")
	step(t, c, coordinator.Cancel{At: at(5), Job: "j", Reason: "enough"},
		coordinator.EndJob{Job: "j", State: cancelled, Message: "cancelled by user: enough", Running: true},
		coordinator.CancelTask{Job: "j", Worker: "w0", Reason: "cancelled by user: enough"},
		coordinator.CancelTask{Job: "j", Worker: "w1", Reason: "cancelled by user: enough"},
		coordinator.CancelTask{Job: "j", Worker: "w2", Reason: "cancelled by user: enough"})
	// Its workers are free at once (the next job may be placed on them).
	wantWorker(t, c, "w1", pb.WorkerState_WORKER_STATE_IDLE, "")
	if j, _ := c.Job("j"); !cmp.Equal(j.Stopping(), []string{"w0", "w1", "w2"}) {
		t.Fatalf("stopping %v; want every member", j.Stopping())
	}
	step(t, c, coordinator.TaskDone{At: at(5.2), Worker: "w1", Job: "j", Generation: 1, Rank: 1, Error: "cancelled"})
	step(t, c, coordinator.TaskDone{At: at(5.3), Worker: "w0", Job: "j", Generation: 7, Rank: 0, Error: "cancelled"})
	step(t, c, coordinator.Disconnected{At: at(5.4), Worker: "w2", Reason: "gone"}, coordinator.Disconnect{Worker: "w2"},
		coordinator.WorkerLost{Worker: "w2", Address: "w2:1", Reason: "gone", Silent: 5400 * time.Millisecond})
	step(t, c, coordinator.TaskDone{At: at(5.5), Worker: "w0", Job: "j", Generation: 1, Rank: 0, Error: "cancelled"},
		coordinator.TasksStopped{Job: "j"})
	// A second cancel is refused: the job ended.
	_, err := c.Step(coordinator.Cancel{At: at(6), Job: "j"})
	var ended *coordinator.EndedError
	if !errors.As(err, &ended) || ended.State != cancelled {
		t.Fatalf("second cancel: %v; want an EndedError (CANCELLED)", err)
	}
	if _, err := c.Step(coordinator.Cancel{At: at(6), Job: "nope"}); !errors.Is(err, coordinator.ErrUnknownJob) {
		t.Fatalf("cancel of an unknown job: %v", err)
	}
}

// TestCancelWhilePreparing: a job cancelled while the shell prepares it
// leaves its workers at once (the next job is placed on them); what was
// prepared for it is then dropped.
func TestCancelWhilePreparing(t *testing.T) {
	c := coordinator.NewCore(5 * time.Second)
	step(t, c, hello(0, "w0"), coordinator.Welcome{Worker: "w0"})
	step(t, c, coordinator.Submit{At: at(1), Job: "a", Workers: 1}, coordinator.Place{Job: "a", Workers: []string{"w0"}})
	step(t, c, coordinator.Submit{At: at(1.5), Job: "b", Workers: 1})
	step(t, c, coordinator.Cancel{At: at(2), Job: "a"},
		coordinator.EndJob{Job: "a", State: cancelled, Message: "cancelled by user"},
		coordinator.Place{Job: "b", Workers: []string{"w0"}})
	step(t, c, coordinator.Prepared{At: at(3), Job: "a"}, coordinator.DropPrepared{Job: "a", Ended: true})
	// A queued job cancelled leaves the queue.
	step(t, c, coordinator.Submit{At: at(4), Job: "q", Workers: 2})
	step(t, c, coordinator.Cancel{At: at(5), Job: "q"}, coordinator.EndJob{Job: "q", State: cancelled, Message: "cancelled by user"})
	if q := c.Queued(); len(q) != 0 {
		t.Fatalf("queue %v; want empty", q)
	}
}

// TestPreparationFails: a job whose run directory cannot be made fails
// without running; one whose model cannot be built fails once running
// (nothing was assigned, so no task is cancelled).
func TestPreparationFails(t *testing.T) {
	c := coordinator.NewCore(5 * time.Second)
	step(t, c, hello(0, "w0"), coordinator.Welcome{Worker: "w0"})
	step(t, c, coordinator.Submit{At: at(1), Job: "a", Workers: 1}, coordinator.Place{Job: "a", Workers: []string{"w0"}})
	step(t, c, coordinator.Submit{At: at(1), Job: "b", Workers: 1})
	step(t, c, coordinator.Prepared{At: at(2), Job: "a", RunDirErr: "disk full"},
		coordinator.SetState{Job: "a", State: failed, Message: "creating run directory: disk full"},
		coordinator.Place{Job: "b", Workers: []string{"w0"}})
	step(t, c, coordinator.Prepared{At: at(3), Job: "b", Failure: "building model: no"},
		coordinator.SetState{Job: "b", State: running, Message: "running on 1 worker(s)", Workers: []string{"w0"}},
		coordinator.EndJob{Job: "b", State: failed, Message: "building model: no", Running: true},
		coordinator.TasksStopped{Job: "b"})
	wantWorker(t, c, "w0", pb.WorkerState_WORKER_STATE_IDLE, "")
}

// TestRanksFinish: each rank that finishes frees its worker; the last
// ends the job with rank 0's result and the ranks' throughput summed,
// and nothing is left to stop.
func TestRanksFinish(t *testing.T) {
	c := runningJob(t, "j", "ring", 3, "w0", "w1", "w2")
	step(t, c, coordinator.TaskDone{At: at(8), Worker: "w1", Job: "j", Generation: 1, Rank: 1, Result: &pb.JobResult{ImagesPerSecond: 20}})
	wantWorker(t, c, "w1", pb.WorkerState_WORKER_STATE_IDLE, "")
	step(t, c, coordinator.TaskDone{At: at(8.1), Worker: "w0", Job: "j", Generation: 1, Rank: 0, Result: &pb.JobResult{ImagesPerSecond: 10, TestAccuracy: 0.5, Epochs: 2}})
	got, err := c.Step(coordinator.TaskDone{At: at(8.2), Worker: "w2", Job: "j", Generation: 1, Rank: 2, Result: &pb.JobResult{ImagesPerSecond: 30}})
	if err != nil {
		t.Fatal(err)
	}
	want := []coordinator.Action{
		coordinator.EndJob{Job: "j", State: succeeded, Message: "test accuracy 50.00% after 2 epoch(s)",
			Result: &pb.JobResult{ImagesPerSecond: 60, TestAccuracy: 0.5, Epochs: 2}, Running: true},
		coordinator.TasksStopped{Job: "j"},
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Fatalf("last rank done (-want +got)\n%s", diff)
	}
	wantWorker(t, c, "w2", pb.WorkerState_WORKER_STATE_IDLE, "")
}

// TestRankFails: a ps rank's failure fails the job, and the others are
// told to stop (the failed one is not waited for); a ring rank's goes
// to the recovery (TestRingCutEvicts); a report on a
// rank the worker does not hold is refused.
func TestRankFails(t *testing.T) {
	c := runningJob(t, "p", "ps", 3, "w0", "w1", "w2")
	step(t, c, coordinator.TaskDone{At: at(4), Worker: "w1", Job: "p", Generation: 1, Rank: 1, Error: "boom"},
		coordinator.EndJob{Job: "p", State: failed, Message: "rank 1 (worker w1): boom", Running: true},
		coordinator.CancelTask{Job: "p", Worker: "w0", Reason: "rank 1 (worker w1): boom"},
		coordinator.CancelTask{Job: "p", Worker: "w1", Reason: "rank 1 (worker w1): boom"},
		coordinator.CancelTask{Job: "p", Worker: "w2", Reason: "rank 1 (worker w1): boom"})
	if j, _ := c.Job("p"); !cmp.Equal(j.Stopping(), []string{"w0", "w2"}) {
		t.Fatalf("stopping %v; want w0, w2", j.Stopping())
	}

	c = runningJob(t, "r", "ring", 3, "w0", "w1", "w2")
	step(t, c, coordinator.TaskDone{At: at(4), Worker: "w2", Job: "r", Generation: 1, Rank: 2, Error: "ring broke", Links: &pb.RingLinks{FramesSent: 4}})
	var rankErr *coordinator.RankError
	if _, err := c.Step(coordinator.TaskDone{At: at(5), Worker: "w0", Job: "r", Generation: 1, Rank: 1}); !errors.As(err, &rankErr) {
		t.Fatalf("w0 reporting rank 1: %v; want a RankError", err)
	}
}

// TestRingCutEvicts: when every rank's frame counts show that w1's
// links lost frames, w1 is cut off: the elastic job recovers without it
// (it is told to stop and never taken back), and a ring rank's failure
// the counts do not explain fails the job only once the heartbeat
// timeout passed with no recovery.
func TestRingCutEvicts(t *testing.T) {
	c := elasticJob(t)
	links := []*pb.RingLinks{
		{FramesSent: 10, FramesReceived: 10, LeftIdleSeconds: 0},
		{FramesSent: 10, FramesReceived: 4, LeftIdleSeconds: 6},
		{FramesSent: 10, FramesReceived: 10, LeftIdleSeconds: 0},
	}
	step(t, c, coordinator.TaskDone{At: at(4), Worker: "w0", Job: "j", Generation: 1, Rank: 0, Error: "ring broke", Links: links[0]})
	step(t, c, coordinator.TaskDone{At: at(4), Worker: "w2", Job: "j", Generation: 1, Rank: 2, Error: "ring broke", Links: links[2]})
	got, err := c.Step(coordinator.TaskDone{At: at(4), Worker: "w1", Job: "j", Generation: 1, Rank: 1, Error: "ring broke", Links: links[1]})
	if err != nil || len(got) < 3 {
		t.Fatalf("the last report: %v, %v", got, err)
	}
	if cut, ok := got[0].(coordinator.RingCut); !ok || cut.Worker != "w1" || cut.Rank != 1 {
		t.Fatalf("first action %#v; want w1 cut off", got[0])
	}
	if diff := cmp.Diff([]coordinator.Action{coordinator.PinCheckpoint{Job: "j", Generation: 2},
		coordinator.CancelTask{Job: "j", Worker: "w1", Reason: "evicted: cut off from the ring (rank 1): " + got[0].(coordinator.RingCut).Evidence}}, got[1:]); diff != "" {
		t.Fatalf("after the cut (-want +got)\n%s", diff)
	}
	wantWorker(t, c, "w1", pb.WorkerState_WORKER_STATE_IDLE, "")
	step(t, c, coordinator.Pinned{At: at(4.2), Job: "j"}, recovering(2, []string{"w0", "w2"}, []string{"w0", "w2"}, 0, "",
		coordinator.Recovering{Job: "j", Lost: "w1", Address: "w1:1", Reason: "cut off from the ring (rank 1): " + got[0].(coordinator.RingCut).Evidence,
			Generation: 2, Workers: 2, Before: 2})...)

	// A ps-less ring job that is not elastic: a rank's unexplained
	// failure waits for the heartbeat timeout, then fails the job.
	c = runningJob(t, "r", "ring", 3, "w0", "w1", "w2")
	step(t, c, coordinator.TaskDone{At: at(4), Worker: "w2", Job: "r", Generation: 1, Rank: 2, Error: "ring broke", Links: &pb.RingLinks{FramesSent: 4}})
	for _, id := range []string{"w0", "w1", "w2"} {
		step(t, c, coordinator.Heard{At: at(8), Worker: id})
	}
	step(t, c, coordinator.Tick{At: at(8.9)})
	step(t, c, coordinator.Tick{At: at(9.1)},
		coordinator.EndJob{Job: "r", State: failed, Message: "rank 2 (worker w2): ring broke", Running: true},
		coordinator.CancelTask{Job: "r", Worker: "w0", Reason: "rank 2 (worker w2): ring broke"},
		coordinator.CancelTask{Job: "r", Worker: "w1", Reason: "rank 2 (worker w2): ring broke"},
		coordinator.CancelTask{Job: "r", Worker: "w2", Reason: "rank 2 (worker w2): ring broke"})
}

// TestShutdownStopsWaiting: at shutdown no task reports any more, so a
// cancel waiting for them returns.
func TestShutdownStopsWaiting(t *testing.T) {
	c := runningJob(t, "j", "ring", 3, "w0", "w1", "w2")
	step(t, c, coordinator.End{At: at(4), Job: "j", State: failed, Message: "x"},
		coordinator.EndJob{Job: "j", State: failed, Message: "x", Running: true},
		coordinator.CancelTask{Job: "j", Worker: "w0", Reason: "x"},
		coordinator.CancelTask{Job: "j", Worker: "w1", Reason: "x"},
		coordinator.CancelTask{Job: "j", Worker: "w2", Reason: "x"})
	step(t, c, coordinator.Shutdown{At: at(5)}, coordinator.TasksStopped{Job: "j"})
	step(t, c, coordinator.TaskDone{At: at(6), Worker: "w0", Job: "j", Generation: 1, Rank: 0})
}

// TestStragglerReportedOncePerEpisode: in a 3-rank ring job, w2 (rank 2)
// delays rank 0 by 0.2 s a step; the core reports the episode once, at
// the second slow report, names rank 2 and its address, reports its end
// once, and a new generation starts the rule afresh.
func TestStragglerReportedOncePerEpisode(t *testing.T) {
	c := runningJob(t, "j", "ring", 3, "w0", "w1", "w2")
	report := func(sec float64, gen uint64, rank int, wait float64, want ...coordinator.Action) {
		t.Helper()
		ids := []string{"w0", "w1", "w2"}
		step(t, c, coordinator.Progress{At: at(sec), Job: "j", Worker: ids[rank], Generation: gen, Rank: rank, Step: int64(sec), LeftWait: wait}, want...)
	}
	report(2, 1, 1, 0.002) // rank 1 waits for rank 0
	report(2, 1, 2, 0.001)
	report(2, 1, 0, 0.2) // rank 0 waits for rank 2
	report(4, 1, 1, 0.002)
	report(4, 1, 0, 0.21, coordinator.Straggler{Job: "j", Worker: "w2", Address: "w2:1", Mode: "ring", Generation: 1, Rank: 2, Step: 4, Delay: 0.21, Median: 0.0015})
	report(6, 1, 0, 0.2)
	report(8, 1, 0, 0.2) // the same episode: not reported again
	report(10, 1, 0, 0.01, coordinator.Straggler{Job: "j", Worker: "w2", Address: "w2:1", Mode: "ring", Generation: 1, Rank: 2, Step: 10, Delay: 0.01, Median: 0.0015, Ends: true})
	// A report of another generation, or from a worker not holding the
	// rank, is not counted.
	report(11, 2, 0, 0.3)
	step(t, c, coordinator.Progress{At: at(11), Job: "j", Worker: "w1", Generation: 1, Rank: 0, LeftWait: 0.3})
	report(12, 1, 0, 0.3)
	report(14, 1, 0, 0.3, coordinator.Straggler{Job: "j", Worker: "w2", Address: "w2:1", Mode: "ring", Generation: 1, Rank: 2, Step: 14, Delay: 0.3, Median: 0.0015})
	// A ps job's delay is the lag its parameter server measured; a
	// report without one counts nothing.
	c = runningJob(t, "p", "ps", 3, "w0", "w1", "w2")
	for _, sec := range []float64{1, 2} {
		step(t, c, coordinator.Progress{At: at(sec), Job: "p", Worker: "w0", Generation: 1, Rank: 0, Lag: 0.001, HasLag: true})
		step(t, c, coordinator.Progress{At: at(sec), Job: "p", Worker: "w2", Generation: 1, Rank: 2, LeftWait: 0.5})
	}
	step(t, c, coordinator.Progress{At: at(3), Job: "p", Worker: "w1", Generation: 1, Rank: 1, Lag: 0.1, HasLag: true})
	step(t, c, coordinator.Progress{At: at(4), Job: "p", Worker: "w1", Generation: 1, Rank: 1, Step: 4, Lag: 0.1, HasLag: true},
		coordinator.Straggler{Job: "p", Worker: "w1", Address: "w1:1", Mode: "ps", Generation: 1, Rank: 1, Step: 4, Delay: 0.1, Median: 0.001})
}

// TestLostPipelineStageIsNamed: a pipeline job (2 replicas of 2 stages)
// that loses w3 fails naming its rank's stage and replica, placed or
// running.
func TestLostPipelineStageIsNamed(t *testing.T) {
	ws := []string{"w0", "w1", "w2", "w3"}
	for _, run := range []bool{false, true} {
		c := coordinator.NewCore(5 * time.Second)
		for _, id := range ws {
			step(t, c, hello(0, id), coordinator.Welcome{Worker: id})
		}
		step(t, c, coordinator.Submit{At: at(0.5), Job: "p", Workers: 4, MinWorkers: 4, Mode: "ring", Stages: 2}, coordinator.Place{Job: "p", Workers: ws})
		if run {
			step(t, c, coordinator.Prepared{At: at(1), Job: "p"}, append([]coordinator.Action{coordinator.SetState{Job: "p", State: running, Message: "running on 4 worker(s)", Workers: ws}},
				assigns("p", 1, ws...)...)...)
		}
		acts, err := c.Step(coordinator.Disconnected{At: at(3), Worker: "w3", Reason: "gone"})
		if err != nil {
			t.Fatal(err)
		}
		const want = "worker w3 (rank 3, pipeline stage 1 of 2, replica 1, w3:1) lost: gone"
		found := false
		for _, a := range acts {
			if e, ok := a.(coordinator.EndJob); ok {
				found = e.State == failed && e.Message == want
				if !found {
					t.Errorf("running %v: %+v; want FAILED %q", run, e, want)
				}
			}
		}
		if !found {
			t.Errorf("running %v: actions %+v; want EndJob FAILED %q", run, acts, want)
		}
	}
}

// TestCommandFailed: an entrypoint rank whose own command failed (its
// ring whole) is the cause. An elastic job evicts its worker and
// recovers at once on the workers that run commands — never on one that
// does not, even when it is idle; any other job fails at once naming the
// rank, without waiting for the heartbeat timeout.
func TestCommandFailed(t *testing.T) {
	c := coordinator.NewCore(5 * time.Second)
	runs := &pb.Resources{AllowsEntrypoints: true}
	for _, id := range []string{"w0", "w1", "w2", "w3"} {
		h := hello(0, id)
		if id != "w3" { // w3 does not run commands
			h.Resources = runs
		}
		step(t, c, h, coordinator.Welcome{Worker: id})
	}
	step(t, c, coordinator.Submit{At: at(0.5), Job: "j", Workers: 3, MinWorkers: 2, Mode: "ring", StepTimeoutSeconds: 10, Entrypoint: true},
		coordinator.Place{Job: "j", Workers: []string{"w0", "w1", "w2"}})
	step(t, c, coordinator.Prepared{At: at(1), Job: "j"},
		append([]coordinator.Action{coordinator.SetState{Job: "j", State: running, Message: "running on 3 worker(s)", Workers: []string{"w0", "w1", "w2"}}},
			assigns("j", 1, "w0", "w1", "w2")...)...)
	// w0's script saw the ring break (a victim): that waits.
	step(t, c, coordinator.TaskDone{At: at(4), Worker: "w0", Job: "j", Generation: 1, Rank: 0, Error: "peer rank 1 is gone"})
	// w1's own command crashed: evicted, recovery at once — on w0 and
	// w2 only: the idle w3 runs no commands.
	step(t, c, coordinator.TaskDone{At: at(4.1), Worker: "w1", Job: "j", Generation: 1, Rank: 1, Error: "exited with status 1", CommandFailed: true},
		coordinator.PinCheckpoint{Job: "j", Generation: 2})
	wantWorker(t, c, "w1", pb.WorkerState_WORKER_STATE_IDLE, "")
	step(t, c, coordinator.Pinned{At: at(4.2), Job: "j"}, recovering(2, []string{"w0", "w2"}, []string{"w0", "w2"}, 0, "",
		coordinator.Recovering{Job: "j", Lost: "w1", Address: "w1:1", Reason: "its command failed (rank 1): exited with status 1",
			Generation: 2, Workers: 2, Before: 2})...)
	wantWorker(t, c, "w3", pb.WorkerState_WORKER_STATE_IDLE, "")
	// The heartbeat timeout after the victim's report fails nothing.
	for _, id := range []string{"w0", "w1", "w2", "w3"} {
		step(t, c, coordinator.Heard{At: at(9.5), Worker: id})
	}
	step(t, c, coordinator.Tick{At: at(9.6)})
	if j, _ := c.Job("j"); j.State != running || j.Generation != 2 {
		t.Fatalf("job %+v; want generation 2 running", j)
	}

	// Not elastic: failed at once, naming the rank.
	c = coordinator.NewCore(5 * time.Second)
	for _, id := range []string{"w0", "w1", "w2"} {
		h := hello(0, id)
		h.Resources = runs
		step(t, c, h, coordinator.Welcome{Worker: id})
	}
	step(t, c, coordinator.Submit{At: at(0.5), Job: "r", Workers: 3, MinWorkers: 3, Mode: "ring", Entrypoint: true},
		coordinator.Place{Job: "r", Workers: []string{"w0", "w1", "w2"}})
	step(t, c, coordinator.Prepared{At: at(1), Job: "r"},
		append([]coordinator.Action{coordinator.SetState{Job: "r", State: running, Message: "running on 3 worker(s)", Workers: []string{"w0", "w1", "w2"}}},
			assigns("r", 1, "w0", "w1", "w2")...)...)
	step(t, c, coordinator.TaskDone{At: at(4), Worker: "w2", Job: "r", Generation: 1, Rank: 2, Error: "boom", CommandFailed: true},
		coordinator.EndJob{Job: "r", State: failed, Message: "rank 2 (worker w2): boom", Running: true},
		coordinator.CancelTask{Job: "r", Worker: "w0", Reason: "rank 2 (worker w2): boom"},
		coordinator.CancelTask{Job: "r", Worker: "w1", Reason: "rank 2 (worker w2): boom"},
		coordinator.CancelTask{Job: "r", Worker: "w2", Reason: "rank 2 (worker w2): boom"})
}
