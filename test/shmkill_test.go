package e2e

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestKillRingRankSharedMemory is TestKillRingRank on the shared-memory
// data plane: three worker processes move their ring to shared memory
// (each logs it), one is killed with SIGKILL mid-job, and the job fails
// naming it while the survivors, waiting in the segments, notice the dead
// process (its pidfd) instead of hanging, leave the ring and take the
// next job. (That nothing is left in /dev/shm is shmring's own test:
// segments are unlinked as soon as both sides map them.)
func TestKillRingRankSharedMemory(t *testing.T) {
	skipIfShort(t)
	ctx := testCtx(t, 90*time.Second)
	dir := t.TempDir()
	s := startServer(ctx, t, "127.0.0.1:0", filepath.Join(dir, "data"), filepath.Join(dir, "runs"))
	survivors := []*proc{s.startWorker(ctx, t, "shm-0")}
	victim := s.startWorker(ctx, t, "shm-1")
	survivors = append(survivors, s.startWorker(ctx, t, "shm-2"))
	long := s.submit(ctx, t, "--mode", "ring", "--transport", "shm", "--model", "mlp", "--dataset", "synthetic", "--workers", "3",
		"--epochs", "1000", "--log-every", "5")
	watch := start(t, "watch", "watch", long.ID, "--json", "--server", s.addr)
	if _, err := watch.stdout.wait(ctx, watch.exited, func(l string) bool { return strings.Contains(l, `"event":"progress"`) }); err != nil {
		t.Fatalf("no progress from the ring job: %v", err)
	}
	for _, p := range append([]*proc{victim}, survivors...) {
		if !strings.Contains(p.stderr.String(), "collectives over shared memory") {
			t.Fatalf("%s did not move its ring to shared memory:\n%s", p.name, p.stderr)
		}
	}
	victim.signal(t, syscall.SIGKILL)
	killed := time.Now()
	if code := watch.wait(testCtx(t, 10*time.Second), t); code != 1 {
		t.Errorf("watch of the failed job: exit %d, want 1", code)
	}
	t.Logf("shared-memory ring job ended %.1fs after the kill", time.Since(killed).Seconds())
	if sum := parseSummary(t, watch.stdout.all()); sum.State != "FAILED" || !strings.Contains(sum.Message, "shm-1") {
		t.Errorf("after kill -9 of shm-1: state %s, message %q; want FAILED naming shm-1", sum.State, sum.Message)
	}
	s.waitWorker(ctx, t, "shm-0", "IDLE")
	s.waitWorker(ctx, t, "shm-2", "IDLE")
	out, code := gradsync(ctx, t, "submit", "--server", s.addr, "--watch", "--json", "--mode", "ring", "--transport", "shm",
		"--model", "logreg", "--dataset", "synthetic", "--workers", "2", "--max-steps", "20")
	if sum := parseSummary(t, out); code != 0 || sum.State != "SUCCEEDED" {
		t.Errorf("the survivors' next shared-memory ring job: exit %d, %+v", code, sum)
	}
}
