package server_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/coordinator"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
	"github.com/gradsync/gradsync/server"
)

// TestCancelThenResume: `gradsync cancel JOB` then `gradsync submit
// --resume JOB` back to back succeeds, 20 times in a row, for ring and ps
// jobs whose only checkpoint is the one written as they stop (rank 0's
// for ring, the parameter server's for ps): CancelJob returns once that
// checkpoint is on disk. Each job is cancelled after it reported a step
// of its own (an event, not a delay), so it has something to save. Rank
// 0 evaluates after every epoch (a few steps each), so a cancel may land
// during an evaluation, which keeps the state as a cancel between steps
// does (worker's TestTrainerStopsEarly covers that case deterministically).
func TestCancelThenResume(t *testing.T) {
	for _, mode := range []string{"ring", "ps"} {
		t.Run(mode, func(t *testing.T) {
			ctx := testCtx(t, 120*time.Second)
			c := newCluster(t, server.Config{}, 0)
			c.addTCPWorker(mode + "-0")
			c.addTCPWorker(mode + "-1")
			job := c.submit(ctx, &pb.JobSpec{Model: "mlp", Mode: mode, Workers: proto.Int32(2), LogEverySteps: 1, Epochs: proto.Int32(1000), EvalEveryEpoch: proto.Bool(true),
				Dataset:    &pb.DatasetSpec{Name: "synthetic", SyntheticTrain: 400, SyntheticTest: 50},
				Checkpoint: &pb.CheckpointSpec{EverySteps: 1 << 40}})
			var steps []int64
			for i := range 20 {
				steps = append(steps, c.waitStep(ctx, job.Id))
				if _, err := c.jobs.CancelJob(ctx, &pb.CancelJobRequest{JobId: job.Id}); err != nil {
					t.Fatalf("round %d: cancel: %v", i, err)
				}
				resp, err := c.jobs.SubmitJob(ctx, &pb.SubmitJobRequest{ResumeJobId: job.Id})
				if err != nil {
					t.Fatalf("round %d: resume right after the cancel: %v", i, err)
				}
				if resp.Job.ResumeFrom == "" {
					t.Fatalf("round %d: the resumed job starts from no checkpoint", i)
				}
				job = resp.Job
			}
			last := c.waitStep(ctx, job.Id)
			if _, err := c.jobs.CancelJob(ctx, &pb.CancelJobRequest{JobId: job.Id}); err != nil {
				t.Fatal(err)
			}
			// Every resume went on from where the job before it stopped.
			steps = append(steps, last)
			for i := 1; i < len(steps); i++ {
				if steps[i] <= steps[i-1] {
					t.Fatalf("steps reported by the 21 jobs %v: job %d did not go on past job %d", steps, i, i-1)
				}
			}
		})
	}
}

// waitStep follows a job's events until it reports progress and returns
// that step; the job ending first fails the test.
func (c *cluster) waitStep(ctx context.Context, id string) int64 {
	c.t.Helper()
	return c.waitProgress(ctx, id, func(p *pb.Progress) bool { return p.Step > 0 }).GetProgress().GetStep()
}

// waitProgress follows a job's events until a progress report satisfies
// ok and returns the job then; the job ending first fails the test.
func (c *cluster) waitProgress(ctx context.Context, id string, ok func(*pb.Progress) bool) *pb.Job {
	c.t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.jobs.WatchJob(ctx, &pb.WatchJobRequest{JobId: id})
	if err != nil {
		c.t.Fatalf("WatchJob: %v", err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			c.t.Fatalf("job %s: waiting for progress: %v", id, err)
		}
		j := ev.GetJob()
		if coordinator.Final(j.GetState()) {
			c.t.Fatalf("job %s ended %v before the progress waited for: %q", id, j.GetState(), j.GetMessage())
		}
		if ev.Kind == pb.EventKind_EVENT_KIND_PROGRESS && ok(j.GetProgress()) {
			return j
		}
	}
}
