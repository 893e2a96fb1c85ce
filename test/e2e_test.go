package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMNISTTwoWorkerProcesses trains the MLP on MNIST with a server and two
// worker processes and checks the accuracy and the run directory.
func TestMNISTTwoWorkerProcesses(t *testing.T) {
	skipIfShort(t)
	ctx := testCtx(t, 90*time.Second)
	dir := t.TempDir()
	s := startServer(ctx, t, "127.0.0.1:0", filepath.Join(dir, "data"), filepath.Join(dir, "runs"))
	s.startWorker(ctx, t, "e2e-w0")
	s.startWorker(ctx, t, "e2e-w1")

	out, code := gradsync(ctx, t, "submit", "--server", s.addr, "--watch", "--json",
		"--model", "mlp", "--dataset", "mnist", "--epochs", "1", "--workers", "2")
	if code != 0 {
		t.Fatalf("submit --watch: exit %d\n%s", code, strings.Join(out, "\n"))
	}
	sum := parseSummary(t, out)
	if sum.State != "SUCCEEDED" {
		t.Fatalf("state %s: %s", sum.State, sum.Message)
	}
	if sum.TestAccuracy < 0.97 {
		t.Errorf("test accuracy %.4f, want ≥ 0.97", sum.TestAccuracy)
	}
	// The event lines before the summary: state changes, progress, eval.
	events := map[string]int{}
	for _, l := range out[:len(out)-1] {
		var ev struct{ Event string }
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Errorf("line %q is not JSON: %v", l, err)
		}
		events[ev.Event]++
	}
	if events["state"] < 2 || events["progress"] == 0 || events["eval"] == 0 {
		t.Errorf("events %v: want state, progress and eval lines", events)
	}
	// runs/<job-id>/ under the server's --runs-dir.
	wantDir := filepath.Join(s.runsDir, sum.JobID)
	if sum.RunDir != wantDir {
		t.Errorf("run_dir %q, want %q", sum.RunDir, wantDir)
	}
	for _, f := range []string{"metrics.jsonl", "summary.json", "spec.json"} {
		if fi, err := os.Stat(filepath.Join(wantDir, f)); err != nil || fi.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	b, err := os.ReadFile(filepath.Join(wantDir, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	var fileSum summary
	if err := json.Unmarshal(b, &fileSum); err != nil || fileSum.State != "SUCCEEDED" || fileSum.TestAccuracy != sum.TestAccuracy {
		t.Errorf("summary.json %s disagrees with the printed summary %+v (%v)", b, sum, err)
	}
}

// TestKillWorkerAndRestartServer kills a worker process with SIGKILL in the
// middle of a job, then restarts the server on the same data directory.
func TestKillWorkerAndRestartServer(t *testing.T) {
	skipIfShort(t)
	ctx := testCtx(t, 90*time.Second)
	dir := t.TempDir()
	dataDir, runsDir := filepath.Join(dir, "data"), filepath.Join(dir, "runs")
	s := startServer(ctx, t, "127.0.0.1:0", dataDir, runsDir)
	s.startWorker(ctx, t, "e2e-w0")
	w1 := s.startWorker(ctx, t, "e2e-w1")

	// A quick job that succeeds.
	out, code := gradsync(ctx, t, "submit", "--server", s.addr, "--watch", "--json",
		"--model", "logreg", "--dataset", "synthetic", "--workers", "2", "--max-steps", "20")
	if sum := parseSummary(t, out); code != 0 || sum.State != "SUCCEEDED" {
		t.Fatalf("quick job: exit %d, %+v", code, sum)
	}
	quickID := parseSummary(t, out).JobID

	// A long job on both workers; watch it, and kill -9 a worker once it
	// is training.
	long := s.submit(ctx, t, "--model", "mlp", "--dataset", "synthetic", "--workers", "2", "--epochs", "1000", "--log-every", "5")
	watch := start(t, "watch", "watch", long.ID, "--json", "--server", s.addr)
	if _, err := watch.stdout.wait(ctx, watch.exited, func(l string) bool { return strings.Contains(l, `"event":"progress"`) }); err != nil {
		t.Fatalf("no progress from the long job: %v", err)
	}
	w1.signal(t, syscall.SIGKILL)
	killed := time.Now()
	dctx := testCtx(t, 10*time.Second)
	if code := watch.wait(dctx, t); code != 1 {
		t.Errorf("watch of the failed job: exit %d, want 1", code)
	}
	t.Logf("job ended %.1fs after the kill", time.Since(killed).Seconds())
	sum := parseSummary(t, watch.stdout.all())
	if sum.State != "FAILED" || !strings.Contains(sum.Message, "e2e-w1") {
		t.Errorf("after kill -9 of e2e-w1: state %s, message %q; want FAILED naming e2e-w1", sum.State, sum.Message)
	}

	// The server keeps serving; the survivor is idle and runs a job that
	// is still running when the server stops.
	jobs := s.jobs(ctx, t)
	if j := jobs[long.ID]; j.State != "FAILED" {
		t.Errorf("jobs: long job %+v", j)
	}
	s.waitWorker(ctx, t, "e2e-w0", "IDLE")
	s.waitWorker(ctx, t, "e2e-w1", "LOST")
	atStop := s.submit(ctx, t, "--model", "logreg", "--dataset", "synthetic", "--workers", "1", "--epochs", "10000")
	s.waitWorker(ctx, t, "e2e-w0", "BUSY")
	pending := s.submit(ctx, t, "--model", "logreg", "--dataset", "synthetic", "--workers", "3")

	s.signal(t, syscall.SIGTERM)
	if code := s.wait(testCtx(t, 15*time.Second), t); code != 0 {
		t.Errorf("server exit status %d after SIGTERM, want 0", code)
	}

	s2 := startServer(ctx, t, s.addr, dataDir, runsDir)
	after := s2.jobs(ctx, t)
	want := map[string]string{
		quickID:    "SUCCEEDED",
		long.ID:    "FAILED",
		atStop.ID:  "FAILED",
		pending.ID: "PENDING",
	}
	if len(after) != len(want) {
		t.Errorf("after restart: %d jobs, want %d: %v", len(after), len(want), after)
	}
	for id, st := range want {
		if j, ok := after[id]; !ok || j.State != st {
			t.Errorf("after restart: job %s = %+v, want state %s", id, j, st)
		}
	}
	if m := after[long.ID].Message; !strings.Contains(m, "e2e-w1") {
		t.Errorf("after restart: the failed job's message %q no longer names e2e-w1", m)
	}
	t.Logf("job running at shutdown: %q", after[atStop.ID].Message)
}

// TestKillRingRank kills one of three worker processes during a ring-mode
// job: the job fails within the heartbeat timeout naming the dead worker,
// and the survivors leave their ring and take the next job.
func TestKillRingRank(t *testing.T) {
	skipIfShort(t)
	ctx := testCtx(t, 90*time.Second)
	dir := t.TempDir()
	s := startServer(ctx, t, "127.0.0.1:0", filepath.Join(dir, "data"), filepath.Join(dir, "runs"))
	s.startWorker(ctx, t, "ring-0")
	victim := s.startWorker(ctx, t, "ring-1")
	s.startWorker(ctx, t, "ring-2")
	long := s.submit(ctx, t, "--mode", "ring", "--model", "mlp", "--dataset", "synthetic", "--workers", "3", "--epochs", "1000", "--log-every", "5")
	watch := start(t, "watch", "watch", long.ID, "--json", "--server", s.addr)
	if _, err := watch.stdout.wait(ctx, watch.exited, func(l string) bool { return strings.Contains(l, `"event":"progress"`) }); err != nil {
		t.Fatalf("no progress from the ring job: %v", err)
	}
	victim.signal(t, syscall.SIGKILL)
	killed := time.Now()
	if code := watch.wait(testCtx(t, 10*time.Second), t); code != 1 {
		t.Errorf("watch of the failed job: exit %d, want 1", code)
	}
	t.Logf("ring job ended %.1fs after the kill", time.Since(killed).Seconds())
	if sum := parseSummary(t, watch.stdout.all()); sum.State != "FAILED" || !strings.Contains(sum.Message, "ring-1") {
		t.Errorf("after kill -9 of ring-1: state %s, message %q; want FAILED naming ring-1", sum.State, sum.Message)
	}
	s.waitWorker(ctx, t, "ring-0", "IDLE")
	s.waitWorker(ctx, t, "ring-2", "IDLE")
	out, code := gradsync(ctx, t, "submit", "--server", s.addr, "--watch", "--json", "--mode", "ring",
		"--model", "logreg", "--dataset", "synthetic", "--workers", "2", "--max-steps", "20")
	if sum := parseSummary(t, out); code != 0 || sum.State != "SUCCEEDED" {
		t.Errorf("the survivors' next ring job: exit %d, %+v", code, sum)
	}
}

// TestServerCrashResumesFromCheckpoint kills the server with SIGKILL in the
// middle of a ring job that writes checkpoints; after a restart the job is
// queued again, the workers reconnect, and it resumes from its latest
// checkpoint and succeeds.
func TestServerCrashResumesFromCheckpoint(t *testing.T) {
	skipIfShort(t)
	ctx := testCtx(t, 120*time.Second)
	dir := t.TempDir()
	dataDir, runsDir := filepath.Join(dir, "data"), filepath.Join(dir, "runs")
	s := startServer(ctx, t, "127.0.0.1:0", dataDir, runsDir)
	s.startWorker(ctx, t, "ck-0")
	s.startWorker(ctx, t, "ck-1")
	spec := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(spec, []byte("model: mlp\nmode: ring\nworkers: 2\nepochs: 40\ndataset: {name: synthetic}\ncheckpoint: {every_steps: 50}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	job := s.submit(ctx, t, "-f", spec)
	ckpts := filepath.Join(runsDir, job.ID, "checkpoints")
	tk := time.NewTicker(50 * time.Millisecond)
	defer tk.Stop()
	for {
		if es, _ := os.ReadDir(ckpts); len(es) >= 2 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("no checkpoints written")
		case <-tk.C:
		}
	}
	s.signal(t, syscall.SIGKILL)
	s.wait(ctx, t)
	s2 := startServer(ctx, t, s.addr, dataDir, runsDir)
	out, code := gradsync(ctx, t, "watch", job.ID, "--json", "--server", s2.addr)
	sum := parseSummary(t, out)
	if code != 0 || sum.State != "SUCCEEDED" {
		t.Fatalf("after the server crash: exit %d, %+v", code, sum)
	}
	if j := s2.jobs(ctx, t)[job.ID]; j.State != "SUCCEEDED" {
		t.Errorf("job after resume: %+v", j)
	}
}

// TestElasticRingRecovers kills one of three worker processes of an
// elastic ring job (min_workers 2): the survivors recover from the latest
// checkpoint within seconds and the job succeeds.
func TestElasticRingRecovers(t *testing.T) {
	skipIfShort(t)
	ctx := testCtx(t, 120*time.Second)
	dir := t.TempDir()
	runsDir := filepath.Join(dir, "runs")
	s := startServer(ctx, t, "127.0.0.1:0", filepath.Join(dir, "data"), runsDir)
	s.startWorker(ctx, t, "el-0")
	victim := s.startWorker(ctx, t, "el-1")
	s.startWorker(ctx, t, "el-2")
	spec := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(spec, []byte("model: mlp\nmode: ring\nworkers: 3\nmin_workers: 2\nepochs: 30\ndataset: {name: synthetic}\ncheckpoint: {every_steps: 20}\n"), 0o644); err != nil {
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
	if sum := parseSummary(t, out); code != 0 || sum.State != "SUCCEEDED" {
		t.Fatalf("elastic job after kill -9 of el-1: exit %d, %+v", code, sum)
	}
	b, err := os.ReadFile(filepath.Join(runsDir, job.ID, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Kind            string  `json:"kind"`
		LostWorker      string  `json:"lost_worker"`
		RecoverySeconds float64 `json:"recovery_seconds"`
	}
	found := false
	for _, l := range strings.Split(string(b), "\n") {
		if json.Unmarshal([]byte(l), &rec) == nil && rec.Kind == "recovered" {
			found = true
			break
		}
	}
	if !found || rec.LostWorker != "el-1" || rec.RecoverySeconds > 10 {
		t.Errorf("recovery record %+v (found %v); want el-1 recovered within 10s", rec, found)
	}
	t.Logf("recovered from the loss of %s in %.2fs", rec.LostWorker, rec.RecoverySeconds)
}
