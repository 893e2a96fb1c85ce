package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Failures of entrypoint jobs (a user's command on every worker): a
// script killed with kill -9, and a worker process killed with kill -9,
// end a non-elastic job FAILED within 10 s, naming the rank; an elastic
// one restarts its commands on the workers left and succeeds.

// startEntryWorker starts a worker that runs entrypoint commands (their
// logs under the server's runs directory) and waits until the server
// lists it idle.
func (s *server) startEntryWorker(ctx context.Context, t *testing.T, id string) *proc {
	t.Helper()
	p := start(t, "worker "+id, append([]string{"worker", "--server", s.addr, "--id", id, "--allow-entrypoints", "--runs-dir", s.runsDir}, s.sec...)...)
	s.waitWorker(ctx, t, id, "IDLE")
	return p
}

// sleeperScript writes a script that says who it is on stderr, leaves its
// pid in dir/pid-RANK, and sleeps (exec: the pid stays the script's).
func sleeperScript(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "sleeper.sh")
	script := fmt.Sprintf(`echo "rank $RANK of $WORLD_SIZE: started" >&2
echo "rank $RANK: the last words of this script" >&2
echo $$ > %[1]s/pid-$RANK.tmp && mv %[1]s/pid-$RANK.tmp %[1]s/pid-$RANK
exec sleep 600
`, dir)
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// waitPid waits for dir/pid-RANK (written once the script is running) and
// returns the pid in it.
func waitPid(ctx context.Context, t *testing.T, dir string, rank int) int {
	t.Helper()
	tk := time.NewTicker(20 * time.Millisecond)
	defer tk.Stop()
	for {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("pid-%d", rank)))
		if err == nil {
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatalf("pid file of rank %d: %q", rank, b)
			}
			return pid
		}
		select {
		case <-ctx.Done():
			t.Fatalf("rank %d's script never started: %v", rank, ctx.Err())
		case <-tk.C:
		}
	}
}

// alive reports whether a process pid exists.
func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// TestEntrypointScriptKilled: kill -9 of rank 1's script (not its worker)
// fails the job within 10 s, naming rank 1 and its worker and showing the
// script's last stderr lines; rank 0's script is ended too, and both
// workers take the next job.
func TestEntrypointScriptKilled(t *testing.T) {
	skipIfShort(t)
	ctx := testCtx(t, 90*time.Second)
	dir := t.TempDir()
	s := startServer(ctx, t, "127.0.0.1:0", filepath.Join(dir, "data"), filepath.Join(dir, "runs"))
	s.startEntryWorker(ctx, t, "ep-w0")
	s.startEntryWorker(ctx, t, "ep-w1")
	script := sleeperScript(t, dir)
	job := s.submit(ctx, t, "--workers", "2", "--entrypoint", "/bin/sh "+script)
	watch := start(t, "watch", "watch", job.ID, "--json", "--server", s.addr)
	pid0, pid1 := waitPid(ctx, t, dir, 0), waitPid(ctx, t, dir, 1)
	if err := syscall.Kill(pid1, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if code := watch.wait(testCtx(t, 10*time.Second), t); code != 1 {
		t.Errorf("watch of the failed job: exit %d, want 1", code)
	}
	t.Logf("job ended %.1fs after the kill", time.Since(killed).Seconds())
	sum := parseSummary(t, watch.stdout.all())
	for _, want := range []string{"rank 1", "ep-w1", "killed", "rank 1: the last words of this script"} {
		if sum.State != "FAILED" || !strings.Contains(sum.Message, want) {
			t.Errorf("state %s, message %q: want FAILED, naming %q", sum.State, sum.Message, want)
		}
	}
	s.waitWorker(ctx, t, "ep-w0", "IDLE")
	s.waitWorker(ctx, t, "ep-w1", "IDLE")
	if alive(pid0) {
		t.Errorf("rank 0's script (pid %d) still runs after the job failed", pid0)
	}
}

// TestEntrypointWorkerKilled: kill -9 of the worker of rank 1 fails the
// job within 10 s naming the worker and rank 1; the worker's script dies
// with it (it never outlives its worker), and rank 0's is ended. (The
// script's last stderr lines died with the worker that kept them; they
// are in its rank-1.log on that host.)
func TestEntrypointWorkerKilled(t *testing.T) {
	skipIfShort(t)
	ctx := testCtx(t, 90*time.Second)
	dir := t.TempDir()
	s := startServer(ctx, t, "127.0.0.1:0", filepath.Join(dir, "data"), filepath.Join(dir, "runs"))
	procs := map[string]*proc{"ep-w0": s.startEntryWorker(ctx, t, "ep-w0"), "ep-w1": s.startEntryWorker(ctx, t, "ep-w1")}
	script := sleeperScript(t, dir)
	job := s.submit(ctx, t, "--workers", "2", "--entrypoint", "/bin/sh "+script)
	watch := start(t, "watch", "watch", job.ID, "--json", "--server", s.addr)
	pid0, pid1 := waitPid(ctx, t, dir, 0), waitPid(ctx, t, dir, 1)
	// Which worker has rank 1: the job lists its workers in rank order.
	ids := s.jobs(ctx, t)[job.ID].WorkerIDs
	if len(ids) != 2 {
		t.Fatalf("job workers %v", ids)
	}
	victim := procs[ids[1]]
	victim.signal(t, syscall.SIGKILL)
	killed := time.Now()
	if code := watch.wait(testCtx(t, 10*time.Second), t); code != 1 {
		t.Errorf("watch of the failed job: exit %d, want 1", code)
	}
	t.Logf("job ended %.1fs after the kill", time.Since(killed).Seconds())
	sum := parseSummary(t, watch.stdout.all())
	for _, want := range []string{ids[1], "rank 1"} {
		if sum.State != "FAILED" || !strings.Contains(sum.Message, want) {
			t.Errorf("state %s, message %q: want FAILED, naming %q", sum.State, sum.Message, want)
		}
	}
	s.waitWorker(ctx, t, ids[0], "IDLE")
	if alive(pid0) {
		t.Errorf("rank 0's script (pid %d) still runs after the job failed", pid0)
	}
	// The killed worker's script gets SIGKILL from the kernel as its
	// parent dies: wait for it to be gone (or a zombie until init reaps
	// it, which kill(pid, 0) would still find).
	dctx := testCtx(t, 10*time.Second)
	tk := time.NewTicker(20 * time.Millisecond)
	defer tk.Stop()
	for st := procState(pid1); st != "" && st != "Z"; st = procState(pid1) {
		select {
		case <-dctx.Done():
			t.Fatalf("rank 1's script (pid %d) outlived its worker (state %s)", pid1, st)
		case <-tk.C:
		}
	}
}

// procState is the state letter of a process (R, S, Z, …), "" if it is
// gone.
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// pid (comm) state …; comm may hold spaces: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	return s[i+2 : i+3]
}

// TestEntrypointElasticWorkerKilled: kill -9 of the worker of rank 1 of
// an elastic entrypoint job (3 workers, at least 2): every rank's command
// restarts on the two others as generation 2, with a world of 2, and the
// job SUCCEEDS.
func TestEntrypointElasticWorkerKilled(t *testing.T) {
	skipIfShort(t)
	ctx := testCtx(t, 120*time.Second)
	dir := t.TempDir()
	s := startServer(ctx, t, "127.0.0.1:0", filepath.Join(dir, "data"), filepath.Join(dir, "runs"))
	procs := map[string]*proc{}
	for _, id := range []string{"ep-w0", "ep-w1", "ep-w2"} {
		procs[id] = s.startEntryWorker(ctx, t, id)
	}
	script := filepath.Join(dir, "elastic.sh")
	if err := os.WriteFile(script, []byte(fmt.Sprintf(`echo "rank $RANK of $WORLD_SIZE, generation $GRADSYNC_GENERATION" >&2
if [ "$GRADSYNC_GENERATION" = 1 ]; then
  echo $$ > %[1]s/pid-$RANK.tmp && mv %[1]s/pid-$RANK.tmp %[1]s/pid-$RANK
  exec sleep 600
fi
echo "$WORLD_SIZE $TORCHELASTIC_RESTART_COUNT" > %[1]s/gen2-$RANK
`, dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	jobFile := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(jobFile, []byte("workers: 3\nmin_workers: 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	job := s.submit(ctx, t, "-f", jobFile, "--entrypoint", "/bin/sh "+script)
	watch := start(t, "watch", "watch", job.ID, "--json", "--server", s.addr)
	for r := range 3 {
		waitPid(ctx, t, dir, r)
	}
	ids := s.jobs(ctx, t)[job.ID].WorkerIDs
	if len(ids) != 3 {
		t.Fatalf("job workers %v", ids)
	}
	procs[ids[1]].signal(t, syscall.SIGKILL)
	if code := watch.wait(ctx, t); code != 0 {
		t.Errorf("watch of the job: exit %d, want 0; its output:\n%s", code, watch.stdout.all())
	}
	sum := parseSummary(t, watch.stdout.all())
	if sum.State != "SUCCEEDED" {
		t.Fatalf("state %s, message %q: want SUCCEEDED", sum.State, sum.Message)
	}
	for r := range 2 {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("gen2-%d", r)))
		if err != nil || strings.TrimSpace(string(b)) != "2 1" {
			t.Errorf("rank %d of generation 2: %q, %v; want world 2, restart count 1", r, b, err)
		}
	}
	if out := strings.Join(watch.stdout.all(), "\n"); !strings.Contains(out, "recover") {
		t.Errorf("watch output says nothing of a recovery:\n%s", out)
	}
}
