// Package e2e holds gradsync's end-to-end tests: real `gradsync` processes
// (server, workers, client commands) on loopback, grpcurl against the
// server, and fault injection (kill -9 of a worker, server restart).
//
// The gradsync binary is built once in TestMain. The long tests are skipped
// under -short; grpcurl tests need bin/grpcurl (or $GRPCURL).
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// gradsyncBin is the binary under test, built by TestMain.
var gradsyncBin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "gradsync-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	gradsyncBin = filepath.Join(dir, "gradsync")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-o", gradsyncBin, "github.com/gradsync/gradsync/cmd/gradsync")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building gradsync:", err)
		return 1
	}
	return m.Run()
}

// lines collects a process's output and lets tests wait for a line.
type lines struct {
	mu     sync.Mutex // guards all fields
	buf    bytes.Buffer
	done   []string
	notify chan struct{} // closed and replaced on every complete line
}

func newLines() *lines { return &lines{notify: make(chan struct{})} }

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	added := false
	for {
		i := bytes.IndexByte(l.buf.Bytes(), '\n')
		if i < 0 {
			break
		}
		l.done = append(l.done, string(l.buf.Next(i + 1)[:i]))
		added = true
	}
	if added {
		close(l.notify)
		l.notify = make(chan struct{})
	}
	return len(p), nil
}

func (l *lines) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.done...)
}

func (l *lines) String() string { return strings.Join(l.all(), "\n") }

// wait returns the first line for which match is true, waiting for it
// until ctx ends or exited is closed.
func (l *lines) wait(ctx context.Context, exited <-chan struct{}, match func(string) bool) (string, error) {
	seen := 0
	for {
		l.mu.Lock()
		ls, notify := l.done, l.notify
		l.mu.Unlock()
		for ; seen < len(ls); seen++ {
			if match(ls[seen]) {
				return ls[seen], nil
			}
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-notify:
		case <-exited:
			l.mu.Lock()
			more := len(l.done) > seen
			l.mu.Unlock()
			if !more {
				return "", fmt.Errorf("process exited")
			}
		}
	}
}

// proc is a running gradsync process.
type proc struct {
	name   string
	cmd    *exec.Cmd
	stdout *lines
	stderr *lines
	exited chan struct{}
	err    error // set before exited is closed
}

// start runs gradsync with args. At the end of the test the process is
// killed if still running, and its output is logged if the test failed.
func start(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(gradsyncBin, withSecurity(args)...)
	p := &proc{name: name, cmd: cmd, stdout: newLines(), stderr: newLines(), exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.stdout, p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { // owned by p: reaps the process
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("--- %s (%s) stdout:\n%s\n--- %s stderr:\n%s", name, strings.Join(args, " "), p.stdout, name, p.stderr)
		}
	})
	return p
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(ctx context.Context, t *testing.T) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-ctx.Done():
		t.Fatalf("%s did not exit: %v\nstderr:\n%s", p.name, ctx.Err(), p.stderr)
	}
	if p.err == nil {
		return 0
	}
	if ee, ok := p.err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	t.Fatalf("%s: %v", p.name, p.err)
	return -1
}

// signal sends sig to the process.
func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to %s: %v", sig, p.name, err)
	}
}

// gradsync runs a client command to completion and returns its stdout
// lines and exit code.
func gradsync(ctx context.Context, t *testing.T, args ...string) ([]string, int) {
	t.Helper()
	p := start(t, "gradsync "+args[0], args...)
	code := p.wait(ctx, t)
	return p.stdout.all(), code
}

// withSecurity adds --insecure (plaintext, asked for explicitly) to a
// command that names no certificates.
func withSecurity(args []string) []string {
	if len(args) > 0 && args[0] == "certs" {
		return args
	}
	for _, a := range args {
		if a == "--certs" || a == "--insecure" {
			return args
		}
	}
	return append(args, "--insecure")
}

// server is a `gradsync server` process and where it keeps its files.
type server struct {
	*proc
	addr, dataDir, runsDir string
	// sec are the security flags its clients and workers need
	// (--certs DIR; none means plaintext).
	sec []string
}

// startServer starts a server on addr (127.0.0.1:0 for any port) and
// returns once it is listening.
func startServer(ctx context.Context, t *testing.T, addr, dataDir, runsDir string, extra ...string) *server {
	t.Helper()
	// Every test process calls from 127.0.0.1, and the tests poll: no rate
	// limit here (server/TestAPIRateLimit checks it).
	args := append([]string{"server", "--json", "--addr", addr, "--data-dir", dataDir, "--runs-dir", runsDir, "--api-rate", "-1"}, extra...)
	p := start(t, "server", args...)
	line, err := p.stdout.wait(ctx, p.exited, func(s string) bool { return strings.Contains(s, `"listening"`) })
	if err != nil {
		t.Fatalf("server did not report listening: %v\nstderr:\n%s", err, p.stderr)
	}
	var ev struct{ Event, Address string }
	if err := json.Unmarshal([]byte(line), &ev); err != nil || ev.Event != "listening" || ev.Address == "" {
		t.Fatalf("listening line %q: %v", line, err)
	}
	srv := &server{proc: p, addr: ev.Address, dataDir: dataDir, runsDir: runsDir}
	for i, a := range extra {
		if a == "--certs" && i+1 < len(extra) {
			srv.sec = []string{"--certs", extra[i+1]}
		}
	}
	return srv
}

// startWorker starts a worker with a stable id and waits until the server
// lists it idle.
func (s *server) startWorker(ctx context.Context, t *testing.T, id string) *proc {
	t.Helper()
	p := start(t, "worker "+id, append([]string{"worker", "--server", s.addr, "--id", id}, s.sec...)...)
	s.waitWorker(ctx, t, id, "IDLE")
	return p
}

// waitWorker polls `gradsync workers --json` until worker id is in state.
func (s *server) waitWorker(ctx context.Context, t *testing.T, id, state string) {
	t.Helper()
	tk := time.NewTicker(50 * time.Millisecond)
	defer tk.Stop()
	for {
		out, code := gradsync(ctx, t, append([]string{"workers", "--json", "--server", s.addr}, s.sec...)...)
		if code == 0 {
			for _, l := range out {
				var w struct {
					ID    string `json:"worker_id"`
					State string
				}
				if json.Unmarshal([]byte(l), &w) == nil && w.ID == id && w.State == state {
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("worker %s never %s; last listing: %v", id, state, out)
		case <-tk.C:
		}
	}
}

// jobJSON is a job as `gradsync jobs --json` and `submit --json` print it
// (the README's output vocabulary).
type jobJSON struct {
	ID        string   `json:"job_id"`
	State     string   `json:"state"`
	Message   string   `json:"message"`
	WorkerIDs []string `json:"worker_ids"`
	RunDir    string   `json:"run_dir"`
}

// jobs lists the server's jobs by id.
func (s *server) jobs(ctx context.Context, t *testing.T) map[string]jobJSON {
	t.Helper()
	out, code := gradsync(ctx, t, append([]string{"jobs", "--json", "--server", s.addr}, s.sec...)...)
	if code != 0 {
		t.Fatalf("gradsync jobs: exit %d", code)
	}
	m := map[string]jobJSON{}
	for _, l := range out {
		var j jobJSON
		if err := json.Unmarshal([]byte(l), &j); err != nil {
			t.Fatalf("gradsync jobs: line %q: %v", l, err)
		}
		m[j.ID] = j
	}
	return m
}

// submit submits a job without waiting and returns it.
func (s *server) submit(ctx context.Context, t *testing.T, flags ...string) jobJSON {
	t.Helper()
	out, code := gradsync(ctx, t, append(append([]string{"submit", "--json", "--server", s.addr}, s.sec...), flags...)...)
	if code != 0 || len(out) == 0 {
		t.Fatalf("gradsync submit %v: exit %d, output %v", flags, code, out)
	}
	var j jobJSON
	if err := json.Unmarshal([]byte(out[len(out)-1]), &j); err != nil || j.ID == "" {
		t.Fatalf("gradsync submit: %q: %v", out[len(out)-1], err)
	}
	return j
}

// summary is the last line of `submit --watch --json` and `watch --json`.
type summary struct {
	JobID        string  `json:"job_id"`
	State        string  `json:"state"`
	Message      string  `json:"message"`
	TestAccuracy float64 `json:"test_accuracy"`
	Steps        int64   `json:"steps"`
	RunDir       string  `json:"run_dir"`
}

func parseSummary(t *testing.T, out []string) summary {
	t.Helper()
	if len(out) == 0 {
		t.Fatal("no output")
	}
	var s summary
	if err := json.Unmarshal([]byte(out[len(out)-1]), &s); err != nil || s.JobID == "" {
		t.Fatalf("last line %q is not a summary: %v", out[len(out)-1], err)
	}
	return s
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func skipIfShort(t *testing.T) {
	if testing.Short() {
		t.Skip("long end-to-end test; skipped under -short")
	}
}
