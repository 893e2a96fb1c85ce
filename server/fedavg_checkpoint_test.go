package server_test

import (
	"bytes"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/checkpoint"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
	"github.com/gradsync/gradsync/server"
)

// TestFedAvgResumeIsBitIdentical: a fedavg job (FedAvgM, so the server
// optimiser has state) cancelled after a few rounds leaves a checkpoint at
// its last closed round; resumed, it ends with the same global model and
// server momentum, bit for bit, as the job run without interruption.
func TestFedAvgResumeIsBitIdentical(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	c := newCluster(t, server.Config{}, 1)
	const rounds = 100
	spec := &pb.JobSpec{Model: "logreg", Mode: "fedavg", Seed: proto.Int64(9),
		Dataset:    &pb.DatasetSpec{Name: "synthetic", SyntheticTrain: 1000, SyntheticTest: 100},
		Federated:  &pb.FederatedSpec{Rounds: rounds, Clients: 8, Fraction: 0.5, LocalEpochs: 1, Strategy: "fedavgm"},
		Checkpoint: &pb.CheckpointSpec{EveryEpochs: rounds}} // at the end (and on cancel)
	final := func(job *pb.Job) *checkpoint.State {
		t.Helper()
		st, err := checkpoint.Load(filepath.Join(job.RunDir, "checkpoints", "ckpt-"+strconv.Itoa(rounds)))
		if err != nil {
			t.Fatalf("job %s: no final checkpoint: %v", job.Id, err)
		}
		return st
	}
	whole := c.submit(ctx, spec)
	if j := c.waitState(ctx, whole.Id, pb.JobState_JOB_STATE_SUCCEEDED, pb.JobState_JOB_STATE_FAILED); j.State != pb.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("undisturbed job: %s", j.Message)
	}
	want := final(whole)
	if want.Meta.Step != rounds || want.Meta.Epoch != rounds || len(want.Extra) == 0 {
		t.Fatalf("final checkpoint: step %d, epoch %d, %d extra tensors; want %d rounds and the server momentum", want.Meta.Step, want.Meta.Epoch, len(want.Extra), rounds)
	}
	for name := range want.Extra {
		if !strings.HasPrefix(name, "server.momentum.") {
			t.Errorf("extra tensor %q; want server.momentum.<param>", name)
		}
	}

	part := c.submit(ctx, spec)
	stream, err := c.jobs.WatchJob(ctx, &pb.WatchJobRequest{JobId: part.Id})
	if err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ev.GetJob().GetProgress().GetStep() >= 3 {
			break
		}
	}
	if _, err := c.jobs.CancelJob(ctx, &pb.CancelJobRequest{JobId: part.Id}); err != nil {
		t.Fatalf("cancel after round 3 of %d: %v", rounds, err)
	}
	// The worker writes the cancel checkpoint as its task stops, and
	// CancelJob returns once the task said it stopped: it is on disk.
	c.waitWorkers(ctx, pb.WorkerState_WORKER_STATE_IDLE, "w0")
	_, path, _, err := checkpoint.Latest(filepath.Join(part.RunDir, "checkpoints"))
	if err != nil {
		t.Fatalf("no checkpoint once CancelJob returned: %v", err)
	}
	if path == filepath.Join(part.RunDir, "checkpoints", "ckpt-"+strconv.Itoa(rounds)) {
		t.Fatalf("the job ran all %d rounds before the cancel reached it", rounds)
	}
	resp, err := c.jobs.SubmitJob(ctx, &pb.SubmitJobRequest{ResumeJobId: part.Id})
	if err != nil {
		t.Fatal(err)
	}
	if j := c.waitState(ctx, resp.Job.Id, pb.JobState_JOB_STATE_SUCCEEDED, pb.JobState_JOB_STATE_FAILED); j.State != pb.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("resumed job: %s", j.Message)
	}
	t.Logf("cancelled at %s, resumed to round %d", filepath.Base(path), rounds)
	got := final(resp.Job)
	for what, pair := range map[string][2]map[string]checkpoint.Tensor{"model": {got.Tensors, want.Tensors}, "server state": {got.Extra, want.Extra}} {
		g, w := pair[0], pair[1]
		if !slices.Equal(slices.Sorted(maps.Keys(g)), slices.Sorted(maps.Keys(w))) {
			t.Fatalf("%s tensors %v, undisturbed %v", what, slices.Sorted(maps.Keys(g)), slices.Sorted(maps.Keys(w)))
		}
		for name := range w {
			if !bytes.Equal(g[name].Data, w[name].Data) {
				t.Errorf("%s: %s differs from the undisturbed run's", what, name)
			}
		}
	}
}
