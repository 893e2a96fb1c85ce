package server_test

import (
	"bytes"
	"context"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/jobspec"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
	"github.com/gradsync/gradsync/server"
)

// fedCkptSpec is fedSpec with FedAvgM (the server optimiser has state), a
// number of rounds and checkpoint settings.
func fedCkptSpec(workers int32, rounds int32, ckpt *pb.CheckpointSpec) *pb.JobSpec {
	s := fedSpec(workers)
	s.Federated.Rounds, s.Federated.Strategy = rounds, "fedavgm"
	s.Checkpoint = ckpt
	return s
}

// loadCkpt loads a job's checkpoint after the given number of rounds.
func loadCkpt(t *testing.T, job *pb.Job, rounds int) *checkpoint.State {
	t.Helper()
	st, err := checkpoint.Load(filepath.Join(job.RunDir, "checkpoints", "ckpt-"+strconv.Itoa(rounds)))
	if err != nil {
		t.Fatalf("job %s: no checkpoint after round %d: %v", job.Id, rounds, err)
	}
	return st
}

// sameTensors fails the test unless got and want hold the same tensors,
// bit for bit (and at least one).
func sameTensors(t *testing.T, what string, got, want map[string]checkpoint.Tensor) {
	t.Helper()
	if g, w := slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)); !slices.Equal(g, w) || len(w) == 0 {
		t.Fatalf("%s tensors %v, want %v", what, g, w)
	}
	for name, w := range want {
		if g := got[name]; g.DType != w.DType || !slices.Equal(g.Shape, w.Shape) || !bytes.Equal(g.Data, w.Data) {
			t.Errorf("%s: %s differs", what, name)
		}
	}
}

// progressTo watches a job until it has closed at least rounds rounds.
func (c *cluster) progressTo(ctx context.Context, t *testing.T, id string, rounds int64) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.jobs.WatchJob(ctx, &pb.WatchJobRequest{JobId: id})
	if err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatalf("watching job %s to round %d: %v", id, rounds, err)
		}
		if ev.GetJob().GetProgress().GetStep() >= rounds {
			return
		}
		if isFinalState(ev.GetJob().GetState()) {
			t.Fatalf("job %s ended (%s: %s) before round %d", id, ev.GetJob().GetState(), ev.GetJob().GetMessage(), rounds)
		}
	}
}

func isFinalState(s pb.JobState) bool {
	return s == pb.JobState_JOB_STATE_SUCCEEDED || s == pb.JobState_JOB_STATE_FAILED || s == pb.JobState_JOB_STATE_CANCELLED
}

// TestRealClientCheckpoints: a fedavg job with 3 real clients writes a
// checkpoint every 2 rounds, keeping 3: the global model and the FedAvgM
// momentum as server.momentum.<param>, rounds in the meta — the very
// checkpoint, bit for bit, that the simulation of the same job writes.
func TestRealClientCheckpoints(t *testing.T) {
	ctx := testCtx(t, 120*time.Second)
	c := newCluster(t, server.Config{}, 3)
	c.waitWorkers(ctx, pb.WorkerState_WORKER_STATE_IDLE, "w0", "w1", "w2")
	every := &pb.CheckpointSpec{EverySteps: 2}

	realJob := c.submit(ctx, fedCkptSpec(3, 6, every))
	if j := c.waitState(ctx, realJob.Id, pb.JobState_JOB_STATE_SUCCEEDED, pb.JobState_JOB_STATE_FAILED); j.State != pb.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("real clients: %s", j.Message)
	}
	ents, err := os.ReadDir(filepath.Join(realJob.RunDir, "checkpoints"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), checkpoint.Prefix) {
			names = append(names, e.Name())
		}
	}
	if want := []string{"ckpt-2", "ckpt-4", "ckpt-6"}; !slices.Equal(names, want) {
		t.Errorf("checkpoints %v, want %v (every 2 rounds, keep 3)", names, want)
	}
	got := loadCkpt(t, realJob, 6)
	m := got.Meta
	if m.Step != 6 || m.Epoch != 6 || m.WorldSize != 3 || m.JobID != realJob.Id || m.SpecHash != jobspec.CheckpointHash(realJob.Spec) || m.Optimizer.Name != "" || len(got.Optim) != 0 {
		t.Errorf("meta %+v, %d optimiser tensors; want step = epoch = 6 rounds, 3 workers, the job's id and spec hash, no client optimiser", m, len(got.Optim))
	}
	for _, name := range slices.Sorted(maps.Keys(got.Tensors)) {
		if _, ok := got.Extra["server.momentum."+name]; !ok {
			t.Errorf("no server.momentum.%s among the extra tensors %v", name, slices.Sorted(maps.Keys(got.Extra)))
		}
	}
	if len(got.Extra) != len(got.Tensors) {
		t.Errorf("%d extra tensors for %d model tensors; want the momentum of each parameter", len(got.Extra), len(got.Tensors))
	}

	sim := c.submit(ctx, fedCkptSpec(1, 6, every))
	if j := c.waitState(ctx, sim.Id, pb.JobState_JOB_STATE_SUCCEEDED, pb.JobState_JOB_STATE_FAILED); j.State != pb.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("simulation: %s", j.Message)
	}
	want := loadCkpt(t, sim, 6)
	if want.Meta.Step != m.Step || want.Meta.Epoch != m.Epoch || want.Meta.SpecHash != m.SpecHash {
		t.Errorf("meta %+v; the simulation's %+v", m, want.Meta)
	}
	sameTensors(t, "model", got.Tensors, want.Tensors)
	sameTensors(t, "server state", got.Extra, want.Extra)
	// Both carry the model's metadata for PyTorch users, the same.
	if meta := jobspec.ModelMetadata(realJob.Spec, nil, nil); !maps.Equal(got.ModelMeta, meta) || !maps.Equal(want.ModelMeta, meta) {
		t.Errorf("model.safetensors metadata: real clients %v, simulation %v; want %v", got.ModelMeta, want.ModelMeta, meta)
	}
}

// TestRealClientResumeIsBitIdentical: a fedavg job with 3 real clients
// (FedAvgM) cancelled part way leaves a checkpoint at its last closed
// round; resumed with submit --resume, its clients join again, its rounds
// evaluate as the undisturbed run's, and it ends with the same global
// model and server momentum, bit for bit. A job resumed from its final
// checkpoint only evaluates; a resume on another number of clients is
// refused.
func TestRealClientResumeIsBitIdentical(t *testing.T) {
	ctx := testCtx(t, 180*time.Second)
	c := newCluster(t, server.Config{}, 3)
	c.waitWorkers(ctx, pb.WorkerState_WORKER_STATE_IDLE, "w0", "w1", "w2")
	const rounds = 40
	spec := fedCkptSpec(3, rounds, &pb.CheckpointSpec{EveryEpochs: rounds}) // at the end (and on cancel)

	whole := c.submit(ctx, spec)
	wj := c.waitState(ctx, whole.Id, pb.JobState_JOB_STATE_SUCCEEDED, pb.JobState_JOB_STATE_FAILED)
	if wj.State != pb.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("undisturbed job: %s", wj.Message)
	}
	want := loadCkpt(t, whole, rounds)
	wantEvals := map[int32]*pb.WatchJobResponse{}
	for _, ev := range evalEvents(c.watchAll(ctx, whole.Id)) {
		wantEvals[ev.Epoch] = ev
	}
	if len(wantEvals) != rounds {
		t.Fatalf("undisturbed job: %d evaluations, want %d", len(wantEvals), rounds)
	}

	part := c.submit(ctx, spec)
	c.progressTo(ctx, t, part.Id, 3)
	if _, err := c.jobs.CancelJob(ctx, &pb.CancelJobRequest{JobId: part.Id}); err != nil {
		t.Fatalf("cancel after round 3: %v", err)
	}
	// The coordinator writes the cancel checkpoint before CancelJob returns.
	stopped, path, _, err := checkpoint.Latest(filepath.Join(part.RunDir, "checkpoints"))
	if err != nil {
		t.Fatalf("no checkpoint at cancellation: %v", err)
	}
	if stopped.Meta.Step < 3 || stopped.Meta.Step >= rounds {
		t.Fatalf("cancel checkpoint after %d rounds; want 3 ≤ rounds < %d", stopped.Meta.Step, rounds)
	}
	if len(stopped.Extra) == 0 {
		t.Error("cancel checkpoint without the server momentum")
	}

	_, err = c.jobs.SubmitJob(ctx, &pb.SubmitJobRequest{ResumeJobId: part.Id, Spec: &pb.JobSpec{Workers: proto.Int32(2)}})
	wantCode(t, "resume of 3 real clients on 2 workers", err, codes.InvalidArgument, "3 federated clients", "on 3 workers")

	resp, err := c.jobs.SubmitJob(ctx, &pb.SubmitJobRequest{ResumeJobId: part.Id})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Job.ResumeFrom != path {
		t.Errorf("resumes from %s, want the cancel checkpoint %s", resp.Job.ResumeFrom, path)
	}
	rj := c.waitState(ctx, resp.Job.Id, pb.JobState_JOB_STATE_SUCCEEDED, pb.JobState_JOB_STATE_FAILED)
	if rj.State != pb.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("resumed job: %s", rj.Message)
	}
	t.Logf("cancelled at %s, resumed to round %d: accuracy %.4f, undisturbed %.4f", filepath.Base(path), rounds, rj.Result.GetTestAccuracy(), wj.Result.GetTestAccuracy())
	evs := evalEvents(c.watchAll(ctx, resp.Job.Id))
	if len(evs) != rounds-int(stopped.Meta.Step) {
		t.Errorf("resumed job: %d evaluations, want one for each of rounds %d..%d", len(evs), stopped.Meta.Step+1, rounds)
	}
	for _, ev := range evs {
		w := wantEvals[ev.Epoch]
		if ev.Epoch <= int32(stopped.Meta.Step) || w == nil || math.Float64bits(ev.TestAccuracy) != math.Float64bits(w.TestAccuracy) ||
			math.Float64bits(ev.TestLoss) != math.Float64bits(w.TestLoss) {
			t.Errorf("resumed round %d: accuracy %v, loss %v; undisturbed %v, %v", ev.Epoch, ev.TestAccuracy, ev.TestLoss, w.GetTestAccuracy(), w.GetTestLoss())
		}
	}
	if rj.Result.GetSteps() != rounds || math.Float64bits(rj.Result.GetTestAccuracy()) != math.Float64bits(wj.Result.GetTestAccuracy()) {
		t.Errorf("resumed result %v; undisturbed %v", rj.Result, wj.Result)
	}
	got := loadCkpt(t, resp.Job, rounds)
	sameTensors(t, "model", got.Tensors, want.Tensors)
	sameTensors(t, "server state", got.Extra, want.Extra)

	// From the final checkpoint nothing is left but the final evaluation.
	resp, err = c.jobs.SubmitJob(ctx, &pb.SubmitJobRequest{ResumeJobId: whole.Id})
	if err != nil {
		t.Fatal(err)
	}
	fj := c.waitState(ctx, resp.Job.Id, pb.JobState_JOB_STATE_SUCCEEDED, pb.JobState_JOB_STATE_FAILED)
	if fj.State != pb.JobState_JOB_STATE_SUCCEEDED || fj.Result.GetSteps() != rounds ||
		math.Float64bits(fj.Result.GetTestAccuracy()) != math.Float64bits(wj.Result.GetTestAccuracy()) {
		t.Errorf("resumed from the final checkpoint: %s %q, result %v; want SUCCEEDED with the undisturbed result %v", fj.State, fj.Message, fj.Result, wj.Result)
	}
	if evs := evalEvents(c.watchAll(ctx, resp.Job.Id)); len(evs) != 1 || evs[0].Epoch != rounds {
		t.Errorf("resumed from the final checkpoint: %d evaluations; want one, of round %d", len(evs), rounds)
	}
}

// TestRealClientJobResumesAfterServerRestart: a fedavg job with real
// clients running when the server stops gracefully gets a checkpoint at
// its last closed round; the restarted server requeues it, the clients
// join again, and it ends SUCCEEDED with the model and server momentum
// of an undisturbed run.
func TestRealClientJobResumesAfterServerRestart(t *testing.T) {
	ctx := testCtx(t, 180*time.Second)
	c := newCluster(t, server.Config{}, 3)
	c.waitWorkers(ctx, pb.WorkerState_WORKER_STATE_IDLE, "w0", "w1", "w2")
	const rounds = 30
	spec := fedCkptSpec(3, rounds, &pb.CheckpointSpec{EveryEpochs: rounds})

	whole := c.submit(ctx, spec)
	if j := c.waitState(ctx, whole.Id, pb.JobState_JOB_STATE_SUCCEEDED, pb.JobState_JOB_STATE_FAILED); j.State != pb.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("undisturbed job: %s", j.Message)
	}
	want := loadCkpt(t, whole, rounds)

	job := c.submit(ctx, spec)
	c.progressTo(ctx, t, job.Id, 3)
	c.stopServer()
	c.startServer()
	j, err := c.jobs.GetJob(ctx, &pb.GetJobRequest{JobId: job.Id})
	if err != nil {
		t.Fatal(err)
	}
	if j.Job.State != pb.JobState_JOB_STATE_PENDING || j.Job.ResumeFrom == "" {
		t.Fatalf("after the restart: %v %q, resume from %q; want PENDING with a checkpoint", j.Job.State, j.Job.Message, j.Job.ResumeFrom)
	}
	st, err := checkpoint.Load(j.Job.ResumeFrom)
	if err != nil {
		t.Fatal(err)
	}
	if st.Meta.Step < 3 || st.Meta.Step >= rounds {
		t.Fatalf("resumes after round %d; want the checkpoint written at shutdown, 3 ≤ rounds < %d", st.Meta.Step, rounds)
	}
	f := c.waitState(ctx, job.Id, pb.JobState_JOB_STATE_SUCCEEDED, pb.JobState_JOB_STATE_FAILED)
	if f.State != pb.JobState_JOB_STATE_SUCCEEDED || f.Result.GetSteps() != rounds {
		t.Fatalf("resumed job: %s %q, result %v", f.State, f.Message, f.Result)
	}
	t.Logf("stopped after round %d, resumed to round %d: accuracy %.4f", st.Meta.Step, rounds, f.Result.GetTestAccuracy())
	got := loadCkpt(t, job, rounds)
	sameTensors(t, "model", got.Tensors, want.Tensors)
	sameTensors(t, "server state", got.Extra, want.Extra)
}
