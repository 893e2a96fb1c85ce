package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
	"github.com/gradsync/gradsync/server"
)

func TestTrainSyntheticTwoWorkers(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	c := newCluster(t, server.Config{}, 2)
	job := c.submit(ctx, quickSpec(2))
	if job.State != pb.JobState_JOB_STATE_PENDING && job.State != pb.JobState_JOB_STATE_RUNNING {
		t.Errorf("submitted job state %v", job.State)
	}
	if job.Spec.GetBatchSize() != 32 || job.Spec.GetLrSchedule().GetName() != "cosine" {
		t.Errorf("stored spec not normalized: %v", job.Spec)
	}
	evs := c.watchAll(ctx, job.Id)

	// Events: STATE (submitted), STATE RUNNING, PROGRESS…, EVAL…, and the
	// final STATE SUCCEEDED last.
	var states []pb.JobState
	kinds := map[pb.EventKind]int{}
	var lastStep int64
	for _, ev := range evs {
		kinds[ev.Kind]++
		switch ev.Kind {
		case pb.EventKind_EVENT_KIND_STATE:
			states = append(states, ev.GetJob().GetState())
		case pb.EventKind_EVENT_KIND_PROGRESS:
			p := ev.GetJob().GetProgress()
			if p.GetStep() < lastStep || p.GetTotalSteps() <= 0 || math.IsNaN(p.GetLoss()) {
				t.Errorf("bad progress event: %v", p)
			}
			lastStep = p.GetStep()
		case pb.EventKind_EVENT_KIND_EVAL:
			if ev.Epoch < 1 || ev.TestAccuracy <= 0 || ev.TestAccuracy > 1 {
				t.Errorf("bad eval event: epoch %d accuracy %v", ev.Epoch, ev.TestAccuracy)
			}
		}
	}
	wantStates := []pb.JobState{pb.JobState_JOB_STATE_PENDING, pb.JobState_JOB_STATE_RUNNING, pb.JobState_JOB_STATE_SUCCEEDED}
	if !slicesEqual(states, wantStates) {
		t.Errorf("state events %v, want %v", states, wantStates)
	}
	if kinds[pb.EventKind_EVENT_KIND_PROGRESS] == 0 || kinds[pb.EventKind_EVENT_KIND_EVAL] != 2 {
		t.Errorf("event kinds %v; want progress events and 2 evals (one per epoch)", kinds)
	}
	last := evs[len(evs)-1]
	if last.Kind != pb.EventKind_EVENT_KIND_STATE || last.GetJob().GetState() != pb.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("last event %v %v %q; want STATE SUCCEEDED", last.Kind, last.GetJob().GetState(), last.GetJob().GetMessage())
	}

	got, err := c.jobs.GetJob(ctx, &pb.GetJobRequest{JobId: job.Id})
	if err != nil {
		t.Fatal(err)
	}
	j := got.Job
	if j.State != pb.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("GetJob: state %v (%s)", j.State, j.Message)
	}
	if acc := j.GetResult().GetTestAccuracy(); acc <= 0.9 {
		t.Errorf("test accuracy %v, want > 0.9", acc)
	}
	if j.GetResult().GetEpochs() != 2 || j.GetResult().GetSteps() == 0 {
		t.Errorf("result %v: want 2 epochs and some steps", j.GetResult())
	}
	if len(j.WorkerIds) != 2 || j.Generation != 1 || j.StartedAt == nil || j.FinishedAt == nil {
		t.Errorf("job %v: want 2 worker ids, generation 1, start and finish times", j)
	}
	if j.RunDir != filepath.Join(c.cfg.RunsDir, j.Id) {
		t.Errorf("run_dir %q, want %q", j.RunDir, filepath.Join(c.cfg.RunsDir, j.Id))
	}
	// The run directory holds the spec, the metrics and the summary.
	var sum map[string]any
	b, err := os.ReadFile(filepath.Join(j.RunDir, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &sum); err != nil || sum["state"] != "SUCCEEDED" || sum["job_id"] != j.Id {
		t.Errorf("summary.json = %s (err %v)", b, err)
	}
	m, err := os.ReadFile(filepath.Join(j.RunDir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{`"kind":"progress"`, `"kind":"eval"`, `"kind":"state"`} {
		if !strings.Contains(string(m), kind) {
			t.Errorf("metrics.jsonl lacks %s", kind)
		}
	}
	if _, err := os.Stat(filepath.Join(j.RunDir, "spec.json")); err != nil {
		t.Error(err)
	}

	// The workers are idle again and a late watcher still gets the whole
	// history, ending with the final state.
	c.waitWorkers(ctx, pb.WorkerState_WORKER_STATE_IDLE, "w0", "w1")
	again := c.watchAll(ctx, job.Id)
	if len(again) != len(evs) {
		t.Errorf("late watcher got %d events, first got %d", len(again), len(evs))
	}

	// ListJobs shows it; filtering by state works.
	list, err := c.jobs.ListJobs(ctx, &pb.ListJobsRequest{})
	if err != nil || len(list.Jobs) != 1 || list.Jobs[0].Id != job.Id {
		t.Errorf("ListJobs = %v, %v", list, err)
	}
	list, err = c.jobs.ListJobs(ctx, &pb.ListJobsRequest{State: pb.JobState_JOB_STATE_RUNNING})
	if err != nil || len(list.Jobs) != 0 {
		t.Errorf("ListJobs(RUNNING) = %v, %v", list, err)
	}
}

func slicesEqual[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestListJobsOrderAndLimit(t *testing.T) {
	ctx := testCtx(t, 20*time.Second)
	c := newCluster(t, server.Config{}, 0) // no workers: jobs stay PENDING
	var ids []string
	for range 3 {
		ids = append(ids, c.submit(ctx, quickSpec(1)).Id)
	}
	list, err := c.jobs.ListJobs(ctx, &pb.ListJobsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Jobs) != 3 {
		t.Fatalf("ListJobs: %d jobs, want 3", len(list.Jobs))
	}
	for i, j := range list.Jobs {
		if j.State != pb.JobState_JOB_STATE_PENDING {
			t.Errorf("job %s state %v, want PENDING (no workers)", j.Id, j.State)
		}
		if i > 0 && j.CreatedAt.AsTime().After(list.Jobs[i-1].CreatedAt.AsTime()) {
			t.Errorf("ListJobs not newest first: %v", list.Jobs)
		}
	}
	list, err = c.jobs.ListJobs(ctx, &pb.ListJobsRequest{PageSize: 2})
	if err != nil || len(list.Jobs) != 2 {
		t.Errorf("ListJobs(page_size 2) = %d jobs, %v", len(list.Jobs), err)
	}
	_, err = c.jobs.ListJobs(ctx, &pb.ListJobsRequest{PageSize: 5000})
	wantCode(t, "page_size 5000", err, codes.InvalidArgument, "page_size")
	_, err = c.jobs.ListJobs(ctx, &pb.ListJobsRequest{State: 42})
	wantCode(t, "state 42", err, codes.InvalidArgument, "state")

	// A pending job can be cancelled too.
	resp, err := c.jobs.CancelJob(ctx, &pb.CancelJobRequest{JobId: ids[0], Reason: "not needed"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Job.State != pb.JobState_JOB_STATE_CANCELLED || !strings.Contains(resp.Job.Message, "not needed") {
		t.Errorf("cancelled pending job: %v %q", resp.Job.State, resp.Job.Message)
	}
}

func TestCancelRunningJobFreesWorkers(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	c := newCluster(t, server.Config{}, 2)
	long := c.submit(ctx, longSpec(2))
	running := c.waitState(ctx, long.Id, pb.JobState_JOB_STATE_RUNNING)
	if len(running.WorkerIds) != 2 {
		t.Fatalf("running on %v", running.WorkerIds)
	}
	// The next job waits: both workers are busy.
	next := c.submit(ctx, quickSpec(2))
	c.waitWorkers(ctx, pb.WorkerState_WORKER_STATE_BUSY, "w0", "w1")
	// Wait for training to be under way (a progress report).
	c.waitStep(ctx, long.Id)
	g, err := c.jobs.GetJob(ctx, &pb.GetJobRequest{JobId: next.Id})
	if err != nil || g.Job.State != pb.JobState_JOB_STATE_PENDING {
		t.Fatalf("second job: %v, %v; want PENDING while the workers are busy", g, err)
	}

	resp, err := c.jobs.CancelJob(ctx, &pb.CancelJobRequest{JobId: long.Id})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Job.State != pb.JobState_JOB_STATE_CANCELLED {
		t.Errorf("CancelJob returned state %v", resp.Job.State)
	}
	// The freed workers take the next job and finish it.
	done := c.waitState(ctx, next.Id, pb.JobState_JOB_STATE_SUCCEEDED)
	if done.GetResult().GetTestAccuracy() <= 0.9 {
		t.Errorf("next job accuracy %v", done.GetResult().GetTestAccuracy())
	}
	c.waitWorkers(ctx, pb.WorkerState_WORKER_STATE_IDLE, "w0", "w1")
	final := c.waitState(ctx, long.Id, pb.JobState_JOB_STATE_CANCELLED)
	if !strings.Contains(final.Message, "cancel") {
		t.Errorf("cancelled job message %q", final.Message)
	}
	// Its run directory has a summary too.
	if _, err := os.Stat(filepath.Join(final.RunDir, "summary.json")); err != nil {
		t.Error(err)
	}

	// Cancelling a finished job is refused.
	_, err = c.jobs.CancelJob(ctx, &pb.CancelJobRequest{JobId: long.Id})
	wantCode(t, "cancel cancelled job", err, codes.FailedPrecondition, long.Id, "CANCELLED")
	_, err = c.jobs.CancelJob(ctx, &pb.CancelJobRequest{JobId: next.Id})
	wantCode(t, "cancel succeeded job", err, codes.FailedPrecondition, "SUCCEEDED")
}

func TestUnknownJob(t *testing.T) {
	ctx := testCtx(t, 20*time.Second)
	c := newCluster(t, server.Config{}, 0)
	_, err := c.jobs.GetJob(ctx, &pb.GetJobRequest{JobId: "job-nope"})
	wantCode(t, "GetJob", err, codes.NotFound, "job-nope")
	_, err = c.jobs.CancelJob(ctx, &pb.CancelJobRequest{JobId: "job-nope"})
	wantCode(t, "CancelJob", err, codes.NotFound, "job-nope")
	stream, err := c.jobs.WatchJob(ctx, &pb.WatchJobRequest{JobId: "job-nope"})
	if err == nil {
		_, err = stream.Recv()
	}
	wantCode(t, "WatchJob", err, codes.NotFound, "job-nope")
	_, err = c.jobs.GetJob(ctx, &pb.GetJobRequest{})
	wantCode(t, "GetJob without id", err, codes.InvalidArgument, "job_id")
	_, err = c.jobs.CancelJob(ctx, &pb.CancelJobRequest{JobId: "x", Reason: strings.Repeat("r", 2000)})
	wantCode(t, "CancelJob long reason", err, codes.InvalidArgument, "reason")
}

func TestSubmitInvalidSpec(t *testing.T) {
	ctx := testCtx(t, 20*time.Second)
	c := newCluster(t, server.Config{}, 0)
	cases := []struct {
		name  string
		spec  *pb.JobSpec
		field string
	}{
		{"unknown model", &pb.JobSpec{Model: "gpt5"}, "model"},
		{"batch_size -1", &pb.JobSpec{BatchSize: proto.Int32(-1)}, "batch_size"},
		{"batch_size 0", &pb.JobSpec{BatchSize: proto.Int32(0)}, "batch_size"},
		{"negative lr", &pb.JobSpec{Optimizer: &pb.OptimizerSpec{Lr: proto.Float64(-1)}}, "optimizer.lr"},
		{"NaN lr", &pb.JobSpec{Optimizer: &pb.OptimizerSpec{Lr: proto.Float64(math.NaN())}}, "optimizer.lr"},
		{"workers -1", &pb.JobSpec{Workers: proto.Int32(-1)}, "workers"},
		{"workers 0", &pb.JobSpec{Workers: proto.Int32(0)}, "workers"},
		{"unknown dataset", &pb.JobSpec{Dataset: &pb.DatasetSpec{Name: "imagenet"}}, "dataset.name"},
		{"gradient clipping in fedavg", &pb.JobSpec{Mode: "fedavg", GradClipNorm: 1}, "grad_clip_norm"},
		{"powersgd in fedavg", &pb.JobSpec{Mode: "fedavg", Compression: &pb.CompressionSpec{Type: "powersgd"}}, "compression.type"},
		{"async parameter server with checkpoints", &pb.JobSpec{ParameterServer: &pb.ParameterServerSpec{Consistency: "async"}, Checkpoint: &pb.CheckpointSpec{EverySteps: 10}}, "parameter_server.consistency"},
		{"two parameter-server shards with compression", &pb.JobSpec{ParameterServer: &pb.ParameterServerSpec{Shards: 2}, Compression: &pb.CompressionSpec{Type: "int8"}}, "parameter_server.shards"},
		{"checkpoint keep -1", &pb.JobSpec{Checkpoint: &pb.CheckpointSpec{EverySteps: 10, Keep: -1}}, "checkpoint.keep"},
		{"adam with momentum", &pb.JobSpec{Optimizer: &pb.OptimizerSpec{Name: "adam", Momentum: proto.Float64(0.5)}}, "optimizer.momentum"},
		{"negative grad clip", &pb.JobSpec{GradClipNorm: -1}, "grad_clip_norm"},
	}
	for _, tc := range cases {
		_, err := c.jobs.SubmitJob(ctx, &pb.SubmitJobRequest{Spec: tc.spec})
		wantCode(t, tc.name, err, codes.InvalidArgument, tc.field)
	}
	list, err := c.jobs.ListJobs(ctx, &pb.ListJobsRequest{})
	if err != nil || len(list.Jobs) != 0 {
		t.Errorf("refused specs were stored: %v, %v", list, err)
	}
}

// TestWorkerDeathFailsJob cancels one worker's context mid-job, as if its
// process died: the job fails naming that worker, well within the
// heartbeat timeout, and the surviving worker is free again.
func TestWorkerDeathFailsJob(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	cfg := server.Config{HeartbeatInterval: 100 * time.Millisecond, HeartbeatTimeout: time.Second}
	c := newCluster(t, cfg, 2)
	job := c.submit(ctx, longSpec(2))
	c.waitState(ctx, job.Id, pb.JobState_JOB_STATE_RUNNING)
	c.waitStep(ctx, job.Id)
	victim := c.workers[1]
	victim.stop(t)
	dctx, cancel := testCtxWithin(ctx, cfg.HeartbeatTimeout+3*time.Second)
	defer cancel()
	final := c.waitState(dctx, job.Id, pb.JobState_JOB_STATE_FAILED)
	if !strings.Contains(final.Message, victim.id) {
		t.Errorf("failure message %q does not name the lost worker %s", final.Message, victim.id)
	}
	c.waitWorkers(ctx, pb.WorkerState_WORKER_STATE_LOST, victim.id)
	c.waitWorkers(ctx, pb.WorkerState_WORKER_STATE_IDLE, "w0")
	// The survivor takes the next job.
	next := c.submit(ctx, quickSpec(1))
	c.waitState(ctx, next.Id, pb.JobState_JOB_STATE_SUCCEEDED)
}

// TestSilentWorkerFailsJob holds a worker's stream open but stops its
// heartbeats: the monitor declares it lost after the heartbeat timeout.
func TestSilentWorkerFailsJob(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	cfg := server.Config{HeartbeatInterval: 100 * time.Millisecond, HeartbeatTimeout: 500 * time.Millisecond}
	c := newCluster(t, cfg, 0)
	f := c.connectFake(ctx, "silent", false)
	job := c.submit(ctx, longSpec(1))
	if a := f.next(ctx, t).GetAssignment(); a.GetJobId() != job.Id {
		t.Fatalf("fake worker got %v, want the assignment of %s", a, job.Id)
	}
	final := c.waitState(ctx, job.Id, pb.JobState_JOB_STATE_FAILED)
	if !strings.Contains(final.Message, "silent") || !strings.Contains(final.Message, "heartbeat") {
		t.Errorf("failure message %q: want the worker id and the missing heartbeat", final.Message)
	}
	c.waitWorkers(ctx, pb.WorkerState_WORKER_STATE_LOST, "silent")
}

// TestRestartKeepsJobs stops the server with jobs in every state and starts
// a new one on the same data directory.
func TestRestartKeepsJobs(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	c := newCluster(t, server.Config{}, 1)
	ok := c.submit(ctx, quickSpec(1))
	c.waitState(ctx, ok.Id, pb.JobState_JOB_STATE_SUCCEEDED)
	cancelled := c.submit(ctx, longSpec(1))
	c.waitState(ctx, cancelled.Id, pb.JobState_JOB_STATE_RUNNING)
	if _, err := c.jobs.CancelJob(ctx, &pb.CancelJobRequest{JobId: cancelled.Id}); err != nil {
		t.Fatal(err)
	}
	bad := c.submit(ctx, &pb.JobSpec{Model: "logreg", Dataset: &pb.DatasetSpec{Name: "mnist", DataDir: t.TempDir()}})
	c.waitState(ctx, bad.Id, pb.JobState_JOB_STATE_FAILED) // no IDX files there
	running := c.submit(ctx, longSpec(1))
	c.waitState(ctx, running.Id, pb.JobState_JOB_STATE_RUNNING)
	pending := c.submit(ctx, quickSpec(3)) // never fits on one worker
	want := map[string]pb.JobState{
		ok.Id: pb.JobState_JOB_STATE_SUCCEEDED, cancelled.Id: pb.JobState_JOB_STATE_CANCELLED,
		bad.Id: pb.JobState_JOB_STATE_FAILED, running.Id: pb.JobState_JOB_STATE_FAILED,
		pending.Id: pb.JobState_JOB_STATE_PENDING,
	}
	before, err := c.jobs.ListJobs(ctx, &pb.ListJobsRequest{})
	if err != nil {
		t.Fatal(err)
	}

	c.stopServer()
	c.startServer()

	after, err := c.jobs.ListJobs(ctx, &pb.ListJobsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Jobs) != len(want) {
		t.Fatalf("after restart: %d jobs, want %d", len(after.Jobs), len(want))
	}
	for i, j := range after.Jobs {
		if j.Id != before.Jobs[i].Id {
			t.Errorf("order changed at %d: %s, was %s", i, j.Id, before.Jobs[i].Id)
		}
		if j.State != want[j.Id] {
			t.Errorf("job %s: state %v after restart, want %v (%q)", j.Id, j.State, want[j.Id], j.Message)
		}
		if !proto.Equal(j.Spec, before.Jobs[i].Spec) {
			t.Errorf("job %s: spec changed across the restart", j.Id)
		}
	}
	g, err := c.jobs.GetJob(ctx, &pb.GetJobRequest{JobId: ok.Id})
	if err != nil || g.Job.GetResult().GetTestAccuracy() <= 0.9 {
		t.Errorf("succeeded job after restart: %v, %v; want its result kept", g, err)
	}
	g, err = c.jobs.GetJob(ctx, &pb.GetJobRequest{JobId: running.Id})
	if err != nil {
		t.Fatal(err)
	}
	if g.Job.FinishedAt == nil || g.Job.Message == "" {
		t.Errorf("job running at shutdown: %v; want a finish time and a message", g.Job)
	}
	// Server.shutdown means to keep the job RUNNING in the store so that the
	// restart marks it failed with "the server stopped while the job was
	// running"; today the worker streams closed at shutdown fail it first
	// ("worker … lost: disconnected by the coordinator"). Either way it is
	// FAILED; the message is logged for the record.
	t.Logf("job running at shutdown ends with: %q", g.Job.Message)

	// The worker reconnects to the new server, and the restarted server
	// runs new work (the pending 3-worker job still blocks the FIFO queue,
	// so cancel it first).
	c.waitWorkers(ctx, pb.WorkerState_WORKER_STATE_IDLE, "w0")
	if _, err := c.jobs.CancelJob(ctx, &pb.CancelJobRequest{JobId: pending.Id}); err != nil {
		t.Fatal(err)
	}
	next := c.submit(ctx, quickSpec(1))
	c.waitState(ctx, next.Id, pb.JobState_JOB_STATE_SUCCEEDED)
}

// TestWatchAfterRestart: a job loaded from the store must still be
// watchable: at least one STATE event with its final state, then the end of
// the stream (`gradsync watch JOB` fails on a stream without events).
func TestWatchAfterRestart(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c := newCluster(t, server.Config{}, 1)
	job := c.submit(ctx, quickSpec(1))
	c.waitState(ctx, job.Id, pb.JobState_JOB_STATE_SUCCEEDED)
	c.stopServer()
	c.startServer()
	evs := c.watchAll(ctx, job.Id)
	if len(evs) == 0 {
		t.Fatal("WatchJob of a job loaded from the store ended without any event")
	}
	last := evs[len(evs)-1]
	if last.Kind != pb.EventKind_EVENT_KIND_STATE || last.GetJob().GetState() != pb.JobState_JOB_STATE_SUCCEEDED {
		t.Errorf("last event after restart: %v %v; want STATE SUCCEEDED", last.Kind, last.GetJob().GetState())
	}
}

func TestConnectRefusals(t *testing.T) {
	ctx := testCtx(t, 20*time.Second)
	c := newCluster(t, server.Config{}, 0)
	try := func(first *pb.ConnectRequest) error {
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stream, err := c.coord.Connect(sctx)
		if err != nil {
			return err
		}
		if err := stream.Send(first); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		m, err := stream.Recv()
		if err == nil && m.GetWelcome() == nil {
			t.Errorf("first answer %v, want a welcome", m)
		}
		return err
	}
	err := try(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Heartbeat{Heartbeat: &pb.Heartbeat{}}})
	wantCode(t, "heartbeat first", err, codes.InvalidArgument, "hello")
	err = try(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Hello{Hello: &pb.Hello{WorkerId: "x"}}})
	wantCode(t, "no address", err, codes.InvalidArgument, "address")
	err = try(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Hello{Hello: &pb.Hello{WorkerId: strings.Repeat("x", 200), Address: "a:1"}}})
	wantCode(t, "long id", err, codes.InvalidArgument, "worker_id")
	// A second live worker with the same id is refused.
	c.connectFake(ctx, "dup", true)
	err = try(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Hello{Hello: &pb.Hello{WorkerId: "dup", Address: "b:1"}}})
	wantCode(t, "duplicate id", err, codes.AlreadyExists, "dup")
	// Without an id the coordinator assigns one.
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.coord.Connect(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Hello{Hello: &pb.Hello{Address: "c:1"}}}); err != nil {
		t.Fatal(err)
	}
	m, err := stream.Recv()
	if err != nil || !strings.HasPrefix(m.GetWelcome().GetWorkerId(), "w-") || m.GetWelcome().GetHeartbeatIntervalSeconds() != 1 {
		t.Errorf("welcome %v, %v; want an assigned id w-… and the default 1s heartbeat", m, err)
	}
}

// TestWatchEndsAtShutdown: a watcher of a job that is still open when the
// server stops should be told "server is shutting down" (Unavailable) at
// once, not held until the 2s graceful-stop limit and cut off by the
// transport.
func TestWatchEndsAtShutdown(t *testing.T) {
	ctx := testCtx(t, 20*time.Second)
	c := newCluster(t, server.Config{}, 0)
	j := c.submit(ctx, quickSpec(1)) // stays PENDING: no workers
	stream, err := c.jobs.WatchJob(ctx, &pb.WatchJobRequest{JobId: j.Id})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	c.stopServer()
	_, err = stream.Recv()
	wantCode(t, "watch at shutdown", err, codes.Unavailable, "shutting down")
}

// TestAPIRateLimit: a client calling the jobs API faster than its rate gets
// ResourceExhausted; worker-facing services are never limited.
func TestAPIRateLimit(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c := newCluster(t, server.Config{APIRate: 1}, 0) // burst 3
	var limited error
	for i := 0; i < 10 && limited == nil; i++ {
		_, limited = c.jobs.ListJobs(ctx, &pb.ListJobsRequest{})
	}
	wantCode(t, "ListJobs past the rate", limited, codes.ResourceExhausted, "calls per second")
}
