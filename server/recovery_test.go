package server_test

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
	"github.com/gradsync/gradsync/server"
)

// TestElasticRecoversFromMemory: an elastic ring job without any
// checkpoint loses one of three workers; the two survivors go on from
// the newest in-memory snapshot they share (at most one step back),
// and the job ends SUCCEEDED on two workers. The recovery is in the
// job's events and in metrics.jsonl: who was lost, how long it took,
// where the state came from, and how many steps were redone.
func TestElasticRecoversFromMemory(t *testing.T) {
	ctx := testCtx(t, 90*time.Second)
	c := newCluster(t, server.Config{}, 0)
	c.addTCPWorker("em-0")
	c.addTCPWorker("em-1")
	victim := c.addTCPWorker("em-2")
	job := c.submit(ctx, &pb.JobSpec{Model: "logreg", Mode: "ring", Workers: proto.Int32(3), MinWorkers: 2, LogEverySteps: 5,
		Dataset: &pb.DatasetSpec{Name: "synthetic"}, Epochs: proto.Int32(4), // about 250 steps: the victim stops at step 25, and the rest is the survivors' (was 8 epochs; the checks are on the recovery, not on the job's length)
		Compression: &pb.CompressionSpec{Type: "topk", Ratio: 0.1, StartIter: -1}})
	stream, err := c.jobs.WatchJob(ctx, &pb.WatchJobRequest{JobId: job.Id})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	var logs []string
	var final *pb.Job
	for final == nil {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatalf("watch ended: %v (logs %q)", err, logs)
		}
		j := ev.GetJob()
		if ev.Kind == pb.EventKind_EVENT_KIND_LOG {
			logs = append(logs, ev.Message)
		}
		if !stopped && ev.Kind == pb.EventKind_EVENT_KIND_PROGRESS && j.GetProgress().GetStep() > 20 {
			victim.stop(t) // its stream ends: the job shrinks to two workers
			stopped = true
		}
		if s := j.GetState(); s == pb.JobState_JOB_STATE_SUCCEEDED || s == pb.JobState_JOB_STATE_FAILED || s == pb.JobState_JOB_STATE_CANCELLED {
			final = j
		}
	}
	if final.State != pb.JobState_JOB_STATE_SUCCEEDED || len(final.WorkerIds) != 2 || final.Generation != 2 {
		t.Fatalf("job %v on %v (generation %d): %q; logs %q", final.State, final.WorkerIds, final.Generation, final.Message, logs)
	}
	var event string
	for _, l := range logs {
		if strings.HasPrefix(l, "recovered from the loss of em-2") {
			event = l
		}
	}
	if !strings.Contains(event, "in-memory snapshot of rank") {
		t.Errorf("no recovery event naming the in-memory snapshot; logs %q", logs)
	}

	// metrics.jsonl has the recovery's record.
	f, err := os.Open(filepath.Join(final.RunDir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rec map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatal(err)
		}
		if m["kind"] == "recovered" {
			rec = m
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if rec == nil {
		t.Fatal("metrics.jsonl has no recovered record")
	}
	redone, _ := rec["steps_redone"].(float64)
	start, _ := rec["start_step"].(float64)
	if rec["source"] != "memory" || rec["lost_worker"] != "em-2" || redone > 1 || start < 20 {
		t.Errorf("recovered record %v: want source memory, lost em-2, start step ≥ 20, at most 1 step redone", rec)
	}
	t.Logf("%s\n%v", event, rec)
	if took, _ := rec["recovery_seconds"].(float64); took <= 0 {
		t.Errorf("recovery_seconds %v", rec["recovery_seconds"])
	}
}
