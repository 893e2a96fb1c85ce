package server_test

import (
	"bytes"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
	"github.com/gradsync/gradsync/server"
)

// psCkptSpec is a one-worker ps job (on the fake worker) that writes a
// checkpoint every 2 steps: SGD with lr 1, momentum 0.9 and a constant
// schedule, so every update is known exactly.
func psCkptSpec() *pb.JobSpec {
	spec := longSpec(1)
	spec.Mode = "ps"
	spec.BatchSize = proto.Int32(100)
	spec.Optimizer = &pb.OptimizerSpec{Lr: proto.Float64(1), Momentum: proto.Float64(0.9)}
	spec.LrSchedule = &pb.ScheduleSpec{Name: "constant"}
	spec.Checkpoint = &pb.CheckpointSpec{EverySteps: 2, Keep: 10}
	return spec
}

// flatParams returns a checkpoint's parameters as one flat buffer in the
// model's layout.
func flatParams(t *testing.T, spec *pb.JobSpec, st *checkpoint.State) []float32 {
	t.Helper()
	c, h, w, classes := jobspec.InputShape(spec)
	net, err := models.New(spec.GetModel(), models.Options{Channels: c, Height: h, Width: w, Classes: classes})
	if err != nil {
		t.Fatal(err)
	}
	if err := net.LoadState(st.Tensors); err != nil {
		t.Fatal(err)
	}
	return slices.Clone(net.Params())
}

// TestPSCheckpoints drives a ps job's parameter server by hand: it writes
// a checkpoint after every second step holding exactly the parameters it
// sends for that step, the momentum buffer and the sampler position; a
// cancel writes one at the last step; a resume starts from it and the next
// update uses the restored momentum.
func TestPSCheckpoints(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	h := newPSHarness(ctx, t)
	spec := psCkptSpec()
	job := h.c.submit(ctx, spec)
	var a *pb.Assignment
	for a == nil {
		a = h.f.next(ctx, t).GetAssignment()
	}
	if a.CheckpointDir == "" {
		t.Fatal("assignment without a checkpoint dir")
	}
	// A job with checkpoints needs the size of the training split.
	_, _, err := h.join(ctx, t, goodJoin(a))
	wantCode(t, "join without train_examples", err, codes.InvalidArgument, "train_examples")

	join := goodJoin(a)
	join.TrainExamples = 500
	stream, params, err := h.join(ctx, t, join)
	if err != nil {
		t.Fatal(err)
	}
	const g = 0.5
	for step := int64(0); step < 3; step++ {
		if err := stream.Send(&pb.SyncRequest{Msg: &pb.SyncRequest_Gradient{Gradient: gradFrame(a, step, g)}}); err != nil {
			t.Fatal(err)
		}
		if params, err = recvParams(stream, a.NumParams, step+1); err != nil {
			t.Fatal(err)
		}
		if step+1 == 2 {
			// Written before the parameters of step 2 were sent.
			st, err := checkpoint.Load(filepath.Join(a.CheckpointDir, "ckpt-2"))
			if err != nil {
				t.Fatal(err)
			}
			m := st.Meta
			if m.JobID != job.Id || m.Step != 2 || m.Epoch != 0 || m.EpochConsumed != 200 || m.WorldSize != 1 ||
				m.SpecHash != jobspec.CheckpointHash(a.Spec) || m.Optimizer.Name != "sgd" {
				t.Errorf("ckpt-2 meta %+v; want step 2, epoch 0, 200 positions consumed (2 steps × 100), world 1, sgd", m)
			}
			if got := flatParams(t, a.Spec, st); !slices.Equal(got, params) {
				t.Error("ckpt-2 holds other parameters than those sent for step 2")
			}
			for name, tn := range st.Optim {
				v, _ := tn.Float32s()
				for _, x := range v {
					if x != float32(0.9*g+g) { // torch: buf = g, then 0.9·buf + g
						t.Fatalf("%s holds %v, want %v", name, x, 0.9*g+g)
					}
				}
			}
			if len(st.Optim) == 0 {
				t.Error("ckpt-2 has no momentum buffer")
			}
		}
	}
	if _, err := os.Stat(filepath.Join(a.CheckpointDir, "ckpt-3")); err == nil {
		t.Fatal("ckpt-3 written though every_steps is 2")
	}

	// Cancelling writes the state after step 3 before CancelJob returns.
	h.cancel(ctx, t, a)
	st3, err := checkpoint.Load(filepath.Join(a.CheckpointDir, "ckpt-3"))
	if err != nil {
		t.Fatalf("no checkpoint at cancellation: %v", err)
	}
	if st3.Meta.Step != 3 || st3.Meta.EpochConsumed != 300 || !slices.Equal(flatParams(t, a.Spec, st3), params) {
		t.Fatalf("cancel checkpoint: meta %+v; parameters equal to step 3's: %v", st3.Meta, slices.Equal(flatParams(t, a.Spec, st3), params))
	}

	// Resume: the parameter server starts at step 3 with those parameters
	// and the momentum buffer, so the next update is the fourth of a
	// momentum run.
	resp, err := h.c.jobs.SubmitJob(ctx, &pb.SubmitJobRequest{ResumeJobId: job.Id})
	if err != nil {
		t.Fatal(err)
	}
	var b *pb.Assignment
	for b == nil {
		b = h.f.next(ctx, t).GetAssignment()
	}
	defer h.cancel(ctx, t, b)
	if b.JobId != resp.Job.Id || b.ResumeFrom == "" {
		t.Fatalf("assignment %v, want job %s resuming", b, resp.Job.Id)
	}
	rj := goodJoin(b)
	rj.TrainExamples = 500
	rs, err := h.c.ps.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Send(&pb.SyncRequest{Msg: &pb.SyncRequest_Join{Join: rj}}); err != nil {
		t.Fatal(err)
	}
	p3, err := recvParams(rs, b.NumParams, 3)
	if err != nil {
		t.Fatalf("resumed job's first parameters: %v", err)
	}
	if !slices.Equal(p3, params) {
		t.Fatal("the resumed job starts from other parameters than the checkpoint's")
	}
	if err := rs.Send(&pb.SyncRequest{Msg: &pb.SyncRequest_Gradient{Gradient: gradFrame(b, 3, g)}}); err != nil {
		t.Fatal(err)
	}
	p4, err := recvParams(rs, b.NumParams, 4)
	if err != nil {
		t.Fatal(err)
	}
	buf := float32(g) // the momentum buffer after steps 1..4
	for range 3 {
		buf = 0.9*buf + g
	}
	for i := range p4 {
		if want := p3[i] - buf; p4[i] != want && math.Abs(float64(p4[i]-want)) > 1e-6 {
			t.Fatalf("param %d: %v after the resumed step, want %v (momentum restored)", i, p4[i], want)
		}
	}
}

// TestPSResumeIsBitIdentical: a ps job cancelled part way and resumed
// with `submit --resume` ends with the same parameters and optimiser
// state, bit for bit, as the same job run without interruption (two
// workers: the shard's sum of two gradients does not depend on their
// order).
func TestPSResumeIsBitIdentical(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	c := newCluster(t, server.Config{}, 0)
	// Slow steps leave time to cancel part way (they change no numbers).
	c.stepDelay = map[string]time.Duration{"w0": time.Millisecond, "w1": time.Millisecond}
	c.addWorker("w0")
	c.addWorker("w1")
	const epochs = 12
	spec := &pb.JobSpec{Model: "logreg", Mode: "ps", Workers: proto.Int32(2), Epochs: proto.Int32(epochs), BatchSize: proto.Int32(20),
		LogEverySteps: 5, Seed: proto.Int64(3), Optimizer: &pb.OptimizerSpec{Name: "adam", Lr: proto.Float64(0.01)},
		Dataset:    &pb.DatasetSpec{Name: "synthetic", SyntheticTrain: 400, SyntheticTest: 100},
		Checkpoint: &pb.CheckpointSpec{EveryEpochs: epochs}} // only at the end (and on cancel)
	const total = epochs * 400 / 2 / 20

	final := func(job *pb.Job) *checkpoint.State {
		t.Helper()
		st, err := checkpoint.Load(filepath.Join(job.RunDir, "checkpoints", "ckpt-"+strconv.Itoa(total)))
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
		if ev.GetJob().GetProgress().GetStep() >= 20 {
			break
		}
	}
	if _, err := c.jobs.CancelJob(ctx, &pb.CancelJobRequest{JobId: part.Id}); err != nil {
		t.Fatalf("cancel at step ≥ 20 of %d: %v", total, err)
	}
	_, path, _, err := checkpoint.Latest(filepath.Join(part.RunDir, "checkpoints"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.jobs.SubmitJob(ctx, &pb.SubmitJobRequest{ResumeJobId: part.Id})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Job.ResumeFrom != path {
		t.Errorf("resumes from %s, want the cancel checkpoint %s", resp.Job.ResumeFrom, path)
	}
	if j := c.waitState(ctx, resp.Job.Id, pb.JobState_JOB_STATE_SUCCEEDED, pb.JobState_JOB_STATE_FAILED); j.State != pb.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("resumed job: %s", j.Message)
	}
	t.Logf("cancelled at %s, resumed to step %d", filepath.Base(path), total)
	got := final(resp.Job)
	if got.Meta.Epoch != epochs || got.Meta.EpochConsumed != 0 || got.Meta.Optimizer != want.Meta.Optimizer {
		t.Errorf("final meta %+v, undisturbed %+v", got.Meta, want.Meta)
	}
	for what, pair := range map[string][2]map[string]checkpoint.Tensor{"model": {got.Tensors, want.Tensors}, "optimiser": {got.Optim, want.Optim}} {
		g, w := pair[0], pair[1]
		if !slices.Equal(slices.Sorted(maps.Keys(g)), slices.Sorted(maps.Keys(w))) || len(w) == 0 {
			t.Fatalf("%s tensors %v, undisturbed %v", what, slices.Sorted(maps.Keys(g)), slices.Sorted(maps.Keys(w)))
		}
		for name := range w {
			if !bytes.Equal(g[name].Data, w[name].Data) {
				t.Errorf("%s: %s differs from the undisturbed run's", what, name)
			}
		}
	}
}

// TestPSJobResumesAfterServerRestart: a ps job running when the server
// stops gracefully gets a checkpoint at its last step; the restarted
// server requeues it and it finishes from there once the workers are back.
func TestPSJobResumesAfterServerRestart(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	c := newCluster(t, server.Config{}, 0)
	c.stepDelay = map[string]time.Duration{"w0": 2 * time.Millisecond} // time to stop the server part way
	c.addWorker("w0")
	spec := &pb.JobSpec{Model: "logreg", Mode: "ps", Workers: proto.Int32(1), Epochs: proto.Int32(12), BatchSize: proto.Int32(20),
		LogEverySteps: 5, Dataset: &pb.DatasetSpec{Name: "synthetic", SyntheticTrain: 400, SyntheticTest: 100},
		Checkpoint: &pb.CheckpointSpec{EverySteps: 1 << 40}}
	job := c.submit(ctx, spec)
	stream, err := c.jobs.WatchJob(ctx, &pb.WatchJobRequest{JobId: job.Id})
	if err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ev.GetJob().GetProgress().GetStep() >= 20 {
			break
		}
	}
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
	if st.Meta.Step < 20 {
		t.Fatalf("resumes from step %d; want the checkpoint written at shutdown, at step ≥ 20", st.Meta.Step)
	}
	if f := c.waitState(ctx, job.Id, pb.JobState_JOB_STATE_SUCCEEDED, pb.JobState_JOB_STATE_FAILED); f.State != pb.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("resumed job: %s", f.Message)
	}
}
