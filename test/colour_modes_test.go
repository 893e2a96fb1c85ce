package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gradsync/gradsync/data"
)

// TestEveryModeOnColourData runs each way of training on colour data in
// CIFAR-100's binary layout (3×32×32, the learnable colour set, 100 fine
// classes): parameter server, ring with PowerSGD, and federated rounds
// over 20 simulated clients partitioned Dirichlet(0.3) over the 100 fine
// classes.
// Each must succeed and learn (test accuracy well above chance) — the
// shapes come from the data in every mode, not from MNIST's 1×28×28×10.
func TestEveryModeOnColourData(t *testing.T) {
	skipIfShort(t)
	ctx := testCtx(t, 4*time.Minute)
	dir := t.TempDir()
	if err := data.WriteColorSet(dir, 600, 200, 1); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		min  float64 // test accuracy at least this
	}{
		// coarse: 20 classes, chance 0.05
		{"ps", []string{"--mode", "ps", "--workers", "2", "--label-granularity", "coarse", "--epochs", "3", "--batch-size", "16"}, 0.3},
		{"ring-powersgd", []string{"--mode", "ring", "--workers", "2", "--label-granularity", "coarse", "--epochs", "3", "--batch-size", "16",
			"--compress", "powersgd:rank=2,start_iter=5"}, 0.3},
		// fine: 100 classes, chance 0.01
		{"fedavg-dirichlet-100", []string{"--mode", "fedavg", "--workers", "1", "--clients", "20", "--fraction", "0.5",
			"--partition", "dirichlet", "--alpha", "0.3", "--rounds", "6", "--local-epochs", "2", "--lr", "0.1"}, 0.05},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, _ := gradsync(ctx, t, append([]string{"local", "--json", "--runs-dir", t.TempDir(), "--model", "mlp",
				"--dataset", "cifar100", "--data-dir", dir, "--log-every", "1000"}, c.args...)...)
			s := lastJSON(t, out)
			acc, _ := s["test_accuracy"].(float64)
			t.Logf("%s: %v, test accuracy %.4f (%v)", c.name, s["state"], acc, s["label_granularity"])
			if s["state"] != "SUCCEEDED" || acc < c.min {
				t.Errorf("%s: %v, test accuracy %.4f (want SUCCEEDED, ≥ %.2f): %v", c.name, s["state"], acc, c.min, s["message"])
			}
		})
	}
}

// TestElasticRecoveryOnColourData kills one of three worker processes of
// an elastic ring job on colour data in CIFAR-100's layout, streamed from
// disk through the loader with no cache: the survivors recover from the
// latest checkpoint (the loader's sampler position with it) and the job
// succeeds.
func TestElasticRecoveryOnColourData(t *testing.T) {
	skipIfShort(t)
	ctx := testCtx(t, 3*time.Minute)
	dir := t.TempDir()
	colour := filepath.Join(dir, "colour")
	if err := data.WriteColorSet(colour, 600, 100, 2); err != nil {
		t.Fatal(err)
	}
	runsDir := filepath.Join(dir, "runs")
	s := startServer(ctx, t, "127.0.0.1:0", filepath.Join(dir, "data"), runsDir)
	s.startWorker(ctx, t, "cel-0")
	victim := s.startWorker(ctx, t, "cel-1")
	s.startWorker(ctx, t, "cel-2")
	spec := filepath.Join(dir, "job.yaml")
	yaml := "model: mlp\nmode: ring\nworkers: 3\nmin_workers: 2\nepochs: 12\nbatch_size: 8\noptimizer: {lr: 0.01}\n" +
		"dataset: {name: cifar100, data_dir: " + colour + ", label_granularity: coarse, cache_mb: 0}\ncheckpoint: {every_steps: 20}\n"
	if err := os.WriteFile(spec, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	job := s.submit(ctx, t, "-f", spec)
	tk := time.NewTicker(50 * time.Millisecond)
	defer tk.Stop()
	for {
		if es, _ := os.ReadDir(filepath.Join(runsDir, job.ID, "checkpoints")); len(es) > 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("no checkpoint written")
		case <-tk.C:
		}
	}
	victim.signal(t, syscall.SIGKILL)
	out, code := gradsync(ctx, t, "watch", job.ID, "--json", "--server", s.addr)
	sum := parseSummary(t, out)
	if code != 0 || sum.State != "SUCCEEDED" {
		t.Fatalf("elastic colour job after kill -9 of cel-1: exit %d, %+v", code, sum)
	}
	b, err := os.ReadFile(filepath.Join(runsDir, job.ID, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"recovered"`) {
		t.Errorf("no recovery record in metrics.jsonl")
	}
	t.Logf("elastic colour job: %s, test accuracy %.4f after %d steps", sum.State, sum.TestAccuracy, sum.Steps)
	if sum.TestAccuracy < 0.3 { // 20 coarse classes: chance 0.05
		t.Errorf("test accuracy %.4f, want ≥ 0.3", sum.TestAccuracy)
	}
}
