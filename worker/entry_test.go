package worker

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gradsync/gradsync/agent"
	"github.com/gradsync/gradsync/aggregator"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

func shProcess(t *testing.T, script string) *entryProcess {
	t.Helper()
	return &entryProcess{command: []string{"/bin/sh", "-c", script}, env: []string{"PATH=/usr/bin:/bin"},
		logPath: filepath.Join(t.TempDir(), "job", "rank-0.log"), grace: time.Minute}
}

func TestEntryProcessExitAndLog(t *testing.T) {
	p := shProcess(t, `echo out-line; echo err-1 >&2; echo err-2 >&2; exit 3`)
	err := p.run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "exited with status 3") {
		t.Fatalf("err %v, want exit status 3", err)
	}
	if got := p.stderrTail(); got != "err-1\nerr-2" {
		t.Fatalf("stderr tail %q", got)
	}
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"out-line", "err-1", "err-2"} {
		if !strings.Contains(string(b), want) {
			t.Fatalf("log %q lacks %q", b, want)
		}
	}
	if err := shProcess(t, "exit 0").run(context.Background()); err != nil {
		t.Fatalf("a zero exit: %v", err)
	}
}

// TestEntryProcessCancelTerm: on cancel the process group gets SIGTERM;
// a command that handles it exits, and its grandchild goes too.
func TestEntryProcessCancelTerm(t *testing.T) {
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	p := shProcess(t, `trap 'echo got-term >&2; exit 7' TERM; sleep 300 & echo $! > `+dir+`/child; touch `+ready+`; wait`)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.run(ctx) }()
	waitFile(t, ready)
	cancel()
	err := <-done
	if err == nil || !strings.Contains(err.Error(), "status 7") {
		t.Fatalf("err %v, want the trap's exit status 7", err)
	}
	if !strings.Contains(p.stderrTail(), "got-term") {
		t.Fatalf("stderr %q: no SIGTERM seen", p.stderrTail())
	}
	b, _ := os.ReadFile(filepath.Join(dir, "child"))
	pid := strings.TrimSpace(string(b))
	// SIGKILL is delivered asynchronously, and the grandchild is not ours
	// to wait for: watch /proc until it is gone or a zombie.
	deadline := time.Now().Add(time.Minute)
	for {
		st, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil || strings.Contains(string(st), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("grandchild %s still alive a minute after the command ended: %s", pid, st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestEntryProcessCancelKill: a command that ignores SIGTERM is killed
// after the grace period.
func TestEntryProcessCancelKill(t *testing.T) {
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	p := shProcess(t, `trap '' TERM; touch `+ready+`; while :; do sleep 1; done`)
	p.grace = 10 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.run(ctx) }()
	waitFile(t, ready)
	cancel()
	if err := <-done; err == nil || !strings.Contains(err.Error(), "killed by signal killed") {
		t.Fatalf("err %v, want killed by SIGKILL", err)
	}
}

// waitFile waits for a file the command creates when it is ready (a
// command cannot signal a channel).
func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", path)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestEntryProcessMissingCommand(t *testing.T) {
	p := &entryProcess{command: []string{"/nonexistent/python3"}, logPath: filepath.Join(t.TempDir(), "r.log")}
	if err := p.run(context.Background()); err == nil || !strings.Contains(err.Error(), "starting /nonexistent/python3") {
		t.Fatalf("err %v", err)
	}
	if err := (&entryProcess{logPath: filepath.Join(t.TempDir(), "r.log")}).run(context.Background()); err == nil {
		t.Fatal("an empty command ran")
	}
}

// TestEntryEnvDropsCredentials: the worker's GRADSYNC_ variables (its
// token) never reach the command; the job's env and the rank variables do.
func TestEntryEnvDropsCredentials(t *testing.T) {
	base := []string{"PATH=/bin", "GRADSYNC_TOKEN=secret", "GRADSYNC_CERTS=/etc/certs", "HOME=/root", "RANK=9", "FOO=old"}
	got := entryEnv(base, map[string]string{"FOO": "new"}, map[string]string{"RANK": "1", "GRADSYNC_AGENT": "/tmp/a.sock"})
	want := []string{"PATH=/bin", "HOME=/root", "FOO=new", "GRADSYNC_AGENT=/tmp/a.sock", "RANK=1"}
	if !slices.Equal(got, want) {
		t.Fatalf("env %q, want %q", got, want)
	}
}

func TestLocalRanks(t *testing.T) {
	peers := []string{"10.0.0.1:7071", "10.0.0.2:7071", "10.0.0.1:7072", "10.0.0.1:7073"}
	for _, c := range []struct{ rank, local, world int }{{0, 0, 3}, {1, 0, 1}, {2, 1, 3}, {3, 2, 3}} {
		if l, w := localRanks(peers, c.rank); l != c.local || w != c.world {
			t.Errorf("rank %d: LOCAL_RANK %d LOCAL_WORLD_SIZE %d, want %d %d", c.rank, l, w, c.local, c.world)
		}
	}
}

// TestEntrypointRefusedWithoutFlag: a worker not started with
// --allow-entrypoints refuses the assignment, before starting anything.
func TestEntrypointRefusedWithoutFlag(t *testing.T) {
	a := &pb.Assignment{JobId: "j", Spec: &pb.JobSpec{Mode: "ring", Entrypoint: &pb.EntrypointSpec{Command: []string{"/bin/true"}}}}
	_, err := runAssignment(context.Background(), a, &taskEnv{})
	if !errors.Is(err, errEntrypointsOff) || !strings.Contains(err.Error(), "--allow-entrypoints") {
		t.Fatalf("err %v, want the --allow-entrypoints refusal", err)
	}
}

func TestTailLines(t *testing.T) {
	var tl tailLines
	for i := range 30 {
		tl.Write([]byte(strings.Repeat("x", i) + "\n"))
	}
	tl.Write([]byte("part"))
	ls := strings.Split(tl.String(), "\n")
	if len(ls) != tailMaxLines+1 || ls[0] != strings.Repeat("x", 10) || ls[len(ls)-1] != "part" {
		t.Fatalf("tail %q", ls)
	}
}

// TestEntryReports: progress, evaluations and the final report of a
// script make the rank's result; progress and evaluations go up.
func TestEntryReports(t *testing.T) {
	out := make(chan *pb.ConnectRequest, 8)
	e := newEntryReports(&pb.Assignment{JobId: "j", Rank: 1}, &reporter{ctx: context.Background(), out: out})
	e.report(&pb.ReportRequest{Epoch: 1, Step: 10, TotalSteps: 20, Loss: 0.5, ImagesPerSecond: 100})
	e.report(&pb.ReportRequest{Eval: true, Epoch: 1, Step: 20, TestAccuracy: 0.97, TestLoss: 0.1, TrainLoss: 0.2})
	e.report(&pb.ReportRequest{Final: true, Epoch: 2, Step: 40, TestAccuracy: 0.985, TestLoss: 0.05})
	if p := (<-out).GetProgress(); p.GetProgress().GetStep() != 10 || p.GetRank() != 1 {
		t.Fatalf("progress %v", p)
	}
	if ev := (<-out).GetEval(); ev.GetTestAccuracy() != 0.97 || ev.GetStep() != 20 {
		t.Fatalf("eval %v", ev)
	}
	r := e.result()
	if r.TestAccuracy != 0.985 || r.Epochs != 2 || r.Steps != 40 || r.ImagesPerSecond != 100 || r.TrainLoss != 0.2 {
		t.Fatalf("result %v", r)
	}
	if len(out) != 0 {
		t.Fatalf("the final report went up as %v; it is the task's result", <-out)
	}
}

// brokenAt is a ring's Broken side, closed by the test.
type brokenAt struct {
	ch  chan struct{}
	err error
}

func (b *brokenAt) Broken() <-chan struct{} { return b.ch }
func (b *brokenAt) BrokenErr() error        { return b.err }

// TestWatchHung: a ring broken while the script has made no call for
// most of the step timeout names the script as hung; one broken while a
// call is under way, or soon after one, is left to the script's own
// error; the watcher returns when its context ends.
func TestWatchHung(t *testing.T) {
	const timeout = time.Minute
	srv, err := agent.New(agent.Config{Ring: aggregator.NewMemRing(1, 1)[0], StepTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	ring := &brokenAt{ch: make(chan struct{}), err: errors.New("rank 0 is gone")}
	close(ring.ch)
	// Just made: idle for far less than the timeout.
	if h := watchHung(t.Context(), ring, srv, timeout, time.Now); h != nil {
		t.Errorf("a fresh agent's script called hung: %v", h)
	}
	// Half the timeout later: a script computing without collectives
	// (an evaluation) while a peer crashed; not hung.
	half := func() time.Time { return time.Now().Add(timeout / 2) }
	if h := watchHung(t.Context(), ring, srv, timeout, half); h != nil {
		t.Errorf("idle for half the timeout: called hung: %v", h)
	}
	// Most of the timeout later, with no call made.
	later := func() time.Time { return time.Now().Add(timeout * 8 / 10) }
	h := watchHung(t.Context(), ring, srv, timeout, later)
	if h == nil || !strings.Contains(h.Error(), "rank 0 is gone") || !strings.Contains(h.Error(), "the last: none") {
		t.Errorf("an idle script: %v, want it named hung with the ring's cause", h)
	}
	// Not broken: returns when the context ends.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if h := watchHung(ctx, &brokenAt{ch: make(chan struct{})}, srv, timeout, later); h != nil {
		t.Errorf("an unbroken ring: %v", h)
	}
}
