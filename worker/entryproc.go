package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// entryProcess is one run of an entrypoint command: in its own process
// group, stdout and stderr appended to logPath (stderr's last lines kept
// for the error of a crash).
type entryProcess struct {
	command []string
	dir     string
	env     []string
	logPath string
	// grace is how long the command has after SIGTERM before SIGKILL.
	grace time.Duration

	tail tailLines
}

// run starts the command and waits for it. When ctx is done first, the
// process group gets SIGTERM, then SIGKILL after grace; run returns once
// the command has exited. Its error says how the command ended when that
// was not a zero exit.
func (p *entryProcess) run(ctx context.Context) error {
	if len(p.command) == 0 || p.command[0] == "" {
		return errors.New("entrypoint: no command")
	}
	if err := os.MkdirAll(filepath.Dir(p.logPath), 0o755); err != nil {
		return fmt.Errorf("entrypoint log: %w", err)
	}
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("entrypoint log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(p.command[0], p.command[1:]...)
	cmd.Dir = p.dir
	cmd.Env = p.env
	cmd.Stdin = nil
	cmd.Stdout = logf
	cmd.Stderr = io.MultiWriter(logf, &p.tail)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	dieWithWorker(cmd.SysProcAttr)
	// The parent-death signal fires when the thread that started the
	// command exits, which the runtime does to a thread whose locked
	// goroutine ends: keep this goroutine on its thread, and the thread
	// alive, until the command has exited (run waits for it).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// A grandchild that keeps stderr open must not keep Wait waiting.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", p.command[0], err)
	}
	pgid := cmd.Process.Pid
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }() // owned by run: it always receives from done
	var werr error
	select {
	case werr = <-done:
	case <-ctx.Done():
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		t := time.NewTimer(p.grace)
		select {
		case werr = <-done:
			t.Stop()
		case <-t.C:
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			werr = <-done
		}
	}
	// Whatever the command left behind in its group goes with it.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	if werr == nil {
		return nil
	}
	var ee *exec.ExitError
	if errors.As(werr, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return fmt.Errorf("%s was killed by signal %v", p.command[0], ws.Signal())
		}
		return fmt.Errorf("%s exited with status %d", p.command[0], ee.ExitCode())
	}
	return fmt.Errorf("%s: %w", p.command[0], werr)
}

// stderrTail is the last lines the command wrote to stderr.
func (p *entryProcess) stderrTail() string { return p.tail.String() }

// tailLines keeps the last tailMaxLines lines written to it (each cut to
// tailMaxLine bytes).
type tailLines struct {
	// mu protects lines and partial.
	mu      sync.Mutex
	lines   []string
	partial []byte
}

const (
	tailMaxLines = 20
	tailMaxLine  = 500
)

func (t *tailLines) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(b)
	for len(b) > 0 {
		i := strings.IndexByte(string(b), '\n')
		if i < 0 {
			t.partial = append(t.partial, b...)
			if len(t.partial) > tailMaxLine {
				t.partial = t.partial[:tailMaxLine]
			}
			break
		}
		t.push(string(append(t.partial, b[:i]...)))
		t.partial = t.partial[:0]
		b = b[i+1:]
	}
	return n, nil
}

func (t *tailLines) push(line string) {
	if len(line) > tailMaxLine {
		line = line[:tailMaxLine] + "…"
	}
	t.lines = append(t.lines, line)
	if len(t.lines) > tailMaxLines {
		t.lines = t.lines[len(t.lines)-tailMaxLines:]
	}
}

// String is the kept lines, the unfinished last one included.
func (t *tailLines) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	ls := t.lines
	if len(t.partial) > 0 {
		ls = append(append([]string(nil), ls...), string(t.partial))
	}
	return strings.Join(ls, "\n")
}
