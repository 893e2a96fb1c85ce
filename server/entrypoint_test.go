package server_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
	"github.com/gradsync/gradsync/server"
)

// TestEntrypointJobsOnlyOnAllowingWorkers: the idle worker picked first
// does not run commands, so an entrypoint job goes to the one that does,
// and its command's output lands in the run directory.
func TestEntrypointJobsOnlyOnAllowingWorkers(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	c := newCluster(t, server.Config{}, 0)
	c.entrypoints = map[string]bool{"w1": true}
	c.addTCPWorker("w0")
	c.waitWorkers(ctx, pb.WorkerState_WORKER_STATE_IDLE, "w0")
	c.addTCPWorker("w1")
	c.waitWorkers(ctx, pb.WorkerState_WORKER_STATE_IDLE, "w0", "w1")
	job := c.submit(ctx, &pb.JobSpec{Workers: proto.Int32(1),
		Entrypoint: &pb.EntrypointSpec{Command: []string{"/bin/sh", "-c", `echo "rank $RANK of $WORLD_SIZE"`}}})
	done := c.waitState(ctx, job.Id, pb.JobState_JOB_STATE_SUCCEEDED)
	if len(done.WorkerIds) != 1 || done.WorkerIds[0] != "w1" {
		t.Fatalf("ran on %v, want [w1] (w0 does not allow entrypoints)", done.WorkerIds)
	}
	b, err := os.ReadFile(filepath.Join(done.RunDir, "rank-0.log"))
	if err != nil || !strings.Contains(string(b), "rank 0 of 1") {
		t.Fatalf("rank-0.log: %q, %v", b, err)
	}
}

// TestEntrypointResumeFromScriptCheckpoint: a script's job gets its
// checkpoint folder (GRADSYNC_CHECKPOINT_DIR); resuming the job
// (submit --resume) gives the new job's script the newest file it saved
// there, by step (GRADSYNC_RESUME_FROM); a job whose script saved none
// cannot be resumed.
func TestEntrypointResumeFromScriptCheckpoint(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	c := newCluster(t, server.Config{}, 0)
	c.entrypoints = map[string]bool{"w0": true}
	c.addTCPWorker("w0")
	script := `set -e
if [ -n "$GRADSYNC_RESUME_FROM" ]; then
  echo "resumed from $(basename "$GRADSYNC_RESUME_FROM"): $(cat "$GRADSYNC_RESUME_FROM")"
  [ "$(cat "$GRADSYNC_RESUME_FROM")" = twelve ]
else
  mkdir -p "$GRADSYNC_CHECKPOINT_DIR"
  echo five > "$GRADSYNC_CHECKPOINT_DIR/script-step-5.pt"
  echo twelve > "$GRADSYNC_CHECKPOINT_DIR/script-step-12.pt"
fi`
	job := c.submit(ctx, &pb.JobSpec{Workers: proto.Int32(1), Entrypoint: &pb.EntrypointSpec{Command: []string{"/bin/sh", "-c", script}}})
	c.waitState(ctx, job.Id, pb.JobState_JOB_STATE_SUCCEEDED)
	resp, err := c.jobs.SubmitJob(ctx, &pb.SubmitJobRequest{ResumeJobId: job.Id})
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(resp.Job.ResumeFrom) != "script-step-12.pt" {
		t.Fatalf("resume from %q, want the script's newest checkpoint, script-step-12.pt", resp.Job.ResumeFrom)
	}
	done := c.waitState(ctx, resp.Job.Id, pb.JobState_JOB_STATE_SUCCEEDED)
	b, err := os.ReadFile(filepath.Join(done.RunDir, "rank-0.log"))
	if err != nil || !strings.Contains(string(b), "resumed from script-step-12.pt: twelve") {
		t.Fatalf("the resumed job's rank-0.log: %q, %v", b, err)
	}

	none := c.submit(ctx, &pb.JobSpec{Workers: proto.Int32(1), Entrypoint: &pb.EntrypointSpec{Command: []string{"/bin/true"}}})
	c.waitState(ctx, none.Id, pb.JobState_JOB_STATE_SUCCEEDED)
	_, err = c.jobs.SubmitJob(ctx, &pb.SubmitJobRequest{ResumeJobId: none.Id})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "saved no checkpoint") {
		t.Fatalf("resume of a job whose script saved nothing: %v, want FailedPrecondition", err)
	}
}
