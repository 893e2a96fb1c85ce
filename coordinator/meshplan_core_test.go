package coordinator_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gradsync/gradsync/coordinator"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// run feeds in to c and returns its actions.
func run(t *testing.T, c *coordinator.Core, in coordinator.Input) []coordinator.Action {
	t.Helper()
	out, err := c.Step(in)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// startJob submits j on workers (which must be idle and all it asks
// for) and prepares it.
func startJob(t *testing.T, c *coordinator.Core, s coordinator.Submit, workers ...string) {
	t.Helper()
	out := run(t, c, s)
	if len(out) != 1 || !cmp.Equal(out[0], coordinator.Place{Job: s.Job, Workers: workers}) {
		t.Fatalf("submit: %v; want it placed on %v", out, workers)
	}
	run(t, c, coordinator.Prepared{At: s.At, Job: s.Job})
}

// TestPipelineRecoversOnWholeReplicas: an elastic pipeline job of 2
// replicas × 2 stages on w0 w1 | w2 w3 loses w1 (stage 1 of replica 0)
// with nobody idle: generation 2 runs on one replica, w0 on stage 0 and
// w3 on stage 1 (each on the stage it held), and w2, which makes up no
// whole replica, is freed.
func TestPipelineRecoversOnWholeReplicas(t *testing.T) {
	c := coordinator.NewCore(5 * time.Second)
	for _, id := range []string{"w0", "w1", "w2", "w3"} {
		run(t, c, hello(0, id))
	}
	startJob(t, c, coordinator.Submit{At: at(1), Job: "p", Workers: 4, MinWorkers: 2, Mode: "ring", Stages: 2, StepTimeoutSeconds: 10},
		"w0", "w1", "w2", "w3")
	run(t, c, coordinator.Disconnected{At: at(3), Worker: "w1", Reason: "gone"})
	run(t, c, coordinator.Pinned{At: at(3), Job: "p"})
	if j, _ := c.Job("p"); j.Generation != 2 || !cmp.Equal(j.Members, []string{"w0", "w3"}) {
		t.Fatalf("generation %d on %v; want 2 on w0 w3", j.Generation, j.Members)
	}
	wantWorker(t, c, "w2", pb.WorkerState_WORKER_STATE_IDLE, "")
	wantWorker(t, c, "w3", pb.WorkerState_WORKER_STATE_BUSY, "p")
}

// TestElasticGrowthRespectsMemory: an elastic job whose ranks need 2 GiB
// that runs below its size does not grow onto an idle worker offering
// 1 GiB, and grows onto one offering 4 GiB; a pipeline job's lost stage
// goes only to a spare that holds that stage.
func TestElasticGrowthRespectsMemory(t *testing.T) {
	limited := func(sec float64, id string, mem uint64) coordinator.Hello {
		h := hello(sec, id)
		h.Memory = mem
		return h
	}
	c := coordinator.NewCore(5 * time.Second)
	for _, id := range []string{"w0", "w1", "w2"} {
		run(t, c, limited(0, id, 4*gib))
	}
	need := []coordinator.Need{{Bytes: 2 * gib, What: "the whole model"}}
	startJob(t, c, coordinator.Submit{At: at(1), Job: "j", Workers: 3, MinWorkers: 2, Mode: "ring", StepTimeoutSeconds: 10, Memory: need}, "w0", "w1", "w2")
	run(t, c, coordinator.Disconnected{At: at(1.5), Worker: "w2", Reason: "gone"})
	run(t, c, coordinator.Pinned{At: at(1.5), Job: "j"})
	run(t, c, coordinator.Progress{At: at(1.8), Job: "j", Worker: "w0", Generation: 2, Rank: 0, Step: 5}) // the recovery ends
	if out := run(t, c, limited(2, "small", gib)); len(out) != 1 {
		t.Fatalf("a 1 GiB worker connects: %v; want only its welcome (no growth)", out)
	}
	out := run(t, c, limited(3, "large", 4*gib))
	if len(out) != 2 || !cmp.Equal(out[1], coordinator.PinCheckpoint{Job: "j", Generation: 3}) {
		t.Fatalf("a 4 GiB worker connects: %v; want growth", out)
	}
	run(t, c, coordinator.Pinned{At: at(3), Job: "j"})
	if j, _ := c.Job("j"); j.Generation != 3 || !cmp.Equal(j.Members, []string{"w0", "w1", "large"}) {
		t.Fatalf("grew onto %v; want w0 w1 large", j.Members)
	}

	// A pipeline whose stage 0 needs 3 GiB and stage 1 1 GiB: w0 (stage
	// 0) is lost; the 2 GiB spare cannot hold stage 0, so the job goes
	// on as one replica on the survivors of replica 1.
	c = coordinator.NewCore(5 * time.Second)
	for _, id := range []string{"w0", "w1", "w2", "w3"} {
		run(t, c, limited(0, id, 4*gib))
	}
	stages := []coordinator.Need{{Bytes: 3 * gib, What: "stage 0"}, {Bytes: gib, What: "stage 1"}}
	startJob(t, c, coordinator.Submit{At: at(1), Job: "p", Workers: 4, MinWorkers: 2, Mode: "ring", Stages: 2, StepTimeoutSeconds: 10, Memory: stages},
		"w0", "w1", "w2", "w3")
	run(t, c, limited(2, "spare", 2*gib))
	run(t, c, coordinator.Disconnected{At: at(3), Worker: "w0", Reason: "gone"})
	run(t, c, coordinator.Pinned{At: at(3), Job: "p"})
	if j, _ := c.Job("p"); !cmp.Equal(j.Members, []string{"w2", "w1"}) {
		t.Fatalf("generation 2 on %v; want w2 w1 (the 2 GiB spare holds no stage 0)", j.Members)
	}
	wantWorker(t, c, "w3", pb.WorkerState_WORKER_STATE_IDLE, "")
}
