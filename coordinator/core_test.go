package coordinator_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/gradsync/gradsync/coordinator"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// step feeds one input and checks the actions that come out.
func step(t *testing.T, c *coordinator.Core, in coordinator.Input, want ...coordinator.Action) {
	t.Helper()
	got, err := c.Step(in)
	if err != nil {
		t.Fatalf("Step(%#v): %v", in, err)
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Fatalf("Step(%#v): actions (-want +got)\n%s", in, diff)
	}
}

func hello(sec float64, id string) coordinator.Hello {
	return coordinator.Hello{At: at(sec), Worker: id, Name: id, Address: id + ":1"}
}

func wantWorker(t *testing.T, c *coordinator.Core, id string, state pb.WorkerState, job string) {
	t.Helper()
	w, ok := c.Worker(id)
	if !ok || w.State != state || w.Job != job {
		t.Fatalf("worker %s: %v %q (known %v); want %v %q", id, w.State, w.Job, ok, state, job)
	}
}

// TestCoreQueuesWhileGangIncomplete: a job submitted while fewer workers
// than it asks for are idle is queued (no Place); the job behind it
// waits too (FIFO, no backfilling), and both start, in order, as workers
// arrive.
func TestCoreQueuesWhileGangIncomplete(t *testing.T) {
	c := coordinator.NewCore(5 * time.Second)
	step(t, c, hello(0, "w0"), coordinator.Welcome{Worker: "w0"})
	step(t, c, coordinator.Submit{At: at(1), Job: "big", Workers: 2})
	step(t, c, coordinator.Submit{At: at(1.5), Job: "small", Workers: 1})
	if diff := cmp.Diff([]coordinator.Pending{{Job: "big", Workers: 2}, {Job: "small", Workers: 1}}, c.Queued()); diff != "" {
		t.Fatalf("queue (-want +got)\n%s", diff)
	}
	step(t, c, hello(2, "w1"), coordinator.Welcome{Worker: "w1"}, coordinator.Place{Job: "big", Workers: []string{"w0", "w1"}})
	wantWorker(t, c, "w1", pb.WorkerState_WORKER_STATE_BUSY, "big")
	step(t, c, hello(3, "w2"), coordinator.Welcome{Worker: "w2"}, coordinator.Place{Job: "small", Workers: []string{"w2"}})
	if q := c.Queued(); len(q) != 0 {
		t.Fatalf("queue %v; want empty", q)
	}
	// big runs; its rank 0 finishes first: w0 is idle again, w1 still
	// busy with big.
	step(t, c, coordinator.Prepared{At: at(4), Job: "big"},
		coordinator.SetState{Job: "big", State: pb.JobState_JOB_STATE_RUNNING, Message: "running on 2 worker(s)", Workers: []string{"w0", "w1"}},
		coordinator.StartGeneration{Job: "big", Generation: 1, Workers: []string{"w0", "w1"}},
		coordinator.Assign{Job: "big", Generation: 1, Worker: "w0", Rank: 0, Peers: []string{"w0:1", "w1:1"}},
		coordinator.Assign{Job: "big", Generation: 1, Worker: "w1", Rank: 1, Peers: []string{"w0:1", "w1:1"}})
	step(t, c, coordinator.TaskDone{At: at(9), Worker: "w0", Job: "big", Generation: 1, Rank: 0})
	wantWorker(t, c, "w0", pb.WorkerState_WORKER_STATE_IDLE, "")
	wantWorker(t, c, "w1", pb.WorkerState_WORKER_STATE_BUSY, "big")
	if diff := cmp.Diff([]string{"w0"}, c.Idle()); diff != "" {
		t.Fatalf("idle (-want +got)\n%s", diff)
	}
}

// TestCoreCancelQueued: a queued job cancelled before it was placed
// leaves the queue, and the job behind it starts when it fits.
func TestCoreCancelQueued(t *testing.T) {
	c := coordinator.NewCore(5 * time.Second)
	step(t, c, hello(0, "w0"), coordinator.Welcome{Worker: "w0"})
	step(t, c, coordinator.Submit{At: at(1), Job: "a", Workers: 3})
	step(t, c, coordinator.Submit{At: at(1), Job: "b", Workers: 1})
	step(t, c, coordinator.Cancel{At: at(2), Job: "a"}, coordinator.EndJob{Job: "a", State: pb.JobState_JOB_STATE_CANCELLED, Message: "cancelled by user"},
		coordinator.Place{Job: "b", Workers: []string{"w0"}})
}

// TestCoreLiveness: w2 goes silent after t=1 s; the tick at t=3 s with a
// 1.5 s timeout declares it lost (its stream closed, its job told, the
// silence measured), and only it; the job it was placed on fails (it is
// not elastic); a late disconnect changes nothing.
func TestCoreLiveness(t *testing.T) {
	c := coordinator.NewCore(1500 * time.Millisecond)
	for _, id := range []string{"w0", "w1", "w2"} {
		step(t, c, hello(0, id), coordinator.Welcome{Worker: id})
	}
	step(t, c, coordinator.Submit{At: at(0.5), Job: "j", Workers: 3}, coordinator.Place{Job: "j", Workers: []string{"w0", "w1", "w2"}})
	step(t, c, coordinator.Heard{At: at(1), Worker: "w2"})
	step(t, c, coordinator.Heard{At: at(2.5), Worker: "w0"})
	step(t, c, coordinator.Heard{At: at(2.5), Worker: "w1"})
	step(t, c, coordinator.Tick{At: at(2.4)})
	step(t, c, coordinator.Tick{At: at(3)}, coordinator.Disconnect{Worker: "w2"},
		coordinator.WorkerLost{Worker: "w2", Address: "w2:1", Job: "j", Reason: "no heartbeat for 2.0s (timeout 1.5s)", Silent: 2 * time.Second, Timeout: true},
		coordinator.EndJob{Job: "j", State: pb.JobState_JOB_STATE_FAILED, Message: "worker w2 (rank 2, w2:1) lost: no heartbeat for 2.0s (timeout 1.5s)"})
	wantWorker(t, c, "w0", pb.WorkerState_WORKER_STATE_IDLE, "")
	wantWorker(t, c, "w2", pb.WorkerState_WORKER_STATE_LOST, "")
	step(t, c, coordinator.Disconnected{At: at(3.1), Worker: "w2", Reason: "connection closed"})
	step(t, c, coordinator.Heard{At: at(3.2), Worker: "w2"})
	if w, _ := c.Worker("w2"); !w.Seen.Equal(at(1)) {
		t.Fatalf("a lost worker's late message moved its last-seen time to %v", w.Seen)
	}
}

// TestCoreReconnect: a connected worker id is refused (nothing changes);
// once it is lost the id may connect again, idle and picked by its new
// connection time.
func TestCoreReconnect(t *testing.T) {
	c := coordinator.NewCore(5 * time.Second)
	step(t, c, hello(0, "w0"), coordinator.Welcome{Worker: "w0"})
	step(t, c, hello(1, "w1"), coordinator.Welcome{Worker: "w1"})
	_, err := c.Step(hello(2, "w0"))
	var ce *coordinator.ConnectedError
	if !errors.As(err, &ce) || ce.Address != "w0:1" {
		t.Fatalf("second hello of w0: %v; want a ConnectedError naming w0:1", err)
	}
	step(t, c, coordinator.Disconnected{At: at(3), Worker: "w0", Reason: "connection closed"}, coordinator.Disconnect{Worker: "w0"},
		coordinator.WorkerLost{Worker: "w0", Address: "w0:1", Reason: "connection closed", Silent: 3 * time.Second})
	step(t, c, hello(4, "w0"), coordinator.Welcome{Worker: "w0"})
	if diff := cmp.Diff([]string{"w1", "w0"}, c.Idle()); diff != "" {
		t.Fatalf("idle order (-want +got)\n%s", diff)
	}
}

// TestCoreShutdown: once stopping, nothing is placed.
func TestCoreShutdown(t *testing.T) {
	c := coordinator.NewCore(5 * time.Second)
	step(t, c, coordinator.Shutdown{At: at(0)})
	step(t, c, coordinator.Submit{At: at(1), Job: "j", Workers: 1})
	step(t, c, hello(2, "w0"), coordinator.Welcome{Worker: "w0"})
}
