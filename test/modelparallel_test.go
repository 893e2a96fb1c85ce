package e2e

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLabelShards submits a label-sharded job with a bad spec (refused
// with InvalidArgument naming the field), then a 2-shard mlp job whose
// shard 1's worker is killed with SIGKILL once it trains: the job fails
// within 10 s naming that worker and its label shard, and the survivor
// is free for the next job.
func TestLabelShards(t *testing.T) {
	skipIfShort(t)
	ctx := testCtx(t, 90*time.Second)
	dir := t.TempDir()
	s := startServer(ctx, t, "127.0.0.1:0", filepath.Join(dir, "data"), filepath.Join(dir, "runs"))
	bad := start(t, "gradsync submit", append(append([]string{"submit", "--server", s.addr}, s.sec...),
		"--model", "mlp", "--dataset", "synthetic", "--workers", "3", "--label-shards", "2")...)
	code := bad.wait(ctx, t)
	if all := strings.Join(bad.stderr.all(), "\n"); code == 0 || !strings.Contains(all, "InvalidArgument") || !strings.Contains(all, "parallelism.label_shards") {
		t.Errorf("3 workers for 2 label shards: exit %d, %q; want InvalidArgument naming parallelism.label_shards", code, all)
	}
	worker := func(id string) *proc {
		p := start(t, "worker "+id, append([]string{"worker", "--server", s.addr, "--id", id, "--runs-dir", filepath.Join(dir, "wruns")}, s.sec...)...)
		s.waitWorker(ctx, t, id, "IDLE")
		return p
	}
	worker("shard-a")
	victim := worker("shard-b")
	long := s.submit(ctx, t, "--model", "mlp", "--dataset", "synthetic", "--workers", "2", "--label-shards", "2",
		"--epochs", "1000", "--log-every", "5")
	watch := start(t, "watch", "watch", long.ID, "--json", "--server", s.addr)
	if _, err := watch.stdout.wait(ctx, watch.exited, func(l string) bool { return strings.Contains(l, `"event":"progress"`) }); err != nil {
		t.Fatalf("no progress from the label-sharded job: %v", err)
	}
	victim.signal(t, syscall.SIGKILL)
	killed := time.Now()
	if code := watch.wait(testCtx(t, 10*time.Second), t); code != 1 {
		t.Errorf("watch of the failed job: exit %d, want 1", code)
	}
	t.Logf("label-sharded job ended %.1fs after the kill", time.Since(killed).Seconds())
	sum := parseSummary(t, watch.stdout.all())
	t.Logf("%s: %s", sum.State, sum.Message)
	if sum.State != "FAILED" || !strings.Contains(sum.Message, "shard-b") || !strings.Contains(sum.Message, "label shard 1 of 2") {
		t.Errorf("after kill -9 of shard-b: state %s, message %q; want FAILED naming shard-b and its label shard 1 of 2", sum.State, sum.Message)
	}
	s.waitWorker(ctx, t, "shard-a", "IDLE")
}

// TestKillTensorRank kills -9 the worker of tensor rank 1 of a 2-rank
// tensor-parallel job (mlp, vit-tiny): the job fails within 10 s naming
// that worker and its tensor rank. A vit-tiny job whose T does not
// divide its 4 heads is refused first, with InvalidArgument naming
// parallelism.tensor.
func TestKillTensorRank(t *testing.T) {
	skipIfShort(t)
	for _, model := range []string{"mlp", "vit-tiny"} {
		t.Run(model, func(t *testing.T) {
			ctx := testCtx(t, 90*time.Second)
			dir := t.TempDir()
			s := startServer(ctx, t, "127.0.0.1:0", filepath.Join(dir, "data"), filepath.Join(dir, "runs"))
			if model == "vit-tiny" {
				bad := start(t, "gradsync submit", append(append([]string{"submit", "--server", s.addr}, s.sec...),
					"--model", model, "--dataset", "synthetic", "--workers", "3", "--tensor-parallel", "3")...)
				code := bad.wait(ctx, t)
				if all := strings.Join(bad.stderr.all(), "\n"); code == 0 || !strings.Contains(all, "InvalidArgument") || !strings.Contains(all, "parallelism.tensor") {
					t.Errorf("vit-tiny with T = 3: exit %d, %q; want InvalidArgument naming parallelism.tensor", code, all)
				}
			}
			worker := func(id string) *proc {
				p := start(t, "worker "+id, append([]string{"worker", "--server", s.addr, "--id", id, "--runs-dir", filepath.Join(dir, "wruns")}, s.sec...)...)
				s.waitWorker(ctx, t, id, "IDLE")
				return p
			}
			worker("tp-a")
			victim := worker("tp-b")
			long := s.submit(ctx, t, "--model", model, "--dataset", "synthetic", "--workers", "2", "--tensor-parallel", "2",
				"--epochs", "1000", "--log-every", "5")
			watch := start(t, "watch", "watch", long.ID, "--json", "--server", s.addr)
			if _, err := watch.stdout.wait(ctx, watch.exited, func(l string) bool { return strings.Contains(l, `"event":"progress"`) }); err != nil {
				t.Fatalf("no progress from the tensor-parallel job: %v", err)
			}
			victim.signal(t, syscall.SIGKILL)
			killed := time.Now()
			if code := watch.wait(testCtx(t, 10*time.Second), t); code != 1 {
				t.Errorf("watch of the failed job: exit %d, want 1", code)
			}
			t.Logf("tensor-parallel %s job ended %.1fs after the kill", model, time.Since(killed).Seconds())
			sum := parseSummary(t, watch.stdout.all())
			t.Logf("%s: %s", sum.State, sum.Message)
			if sum.State != "FAILED" || !strings.Contains(sum.Message, "tp-b") || !strings.Contains(sum.Message, "tensor rank 1 of 2") {
				t.Errorf("after kill -9 of tp-b: state %s, message %q; want FAILED naming tp-b and its tensor rank 1 of 2", sum.State, sum.Message)
			}
			s.waitWorker(ctx, t, "tp-a", "IDLE")
		})
	}
}
