package server_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
