//go:build linux

package shmring

import (
	"os/exec"
	"testing"
)

// TestProcessExited: a watched process is alive until it exits, through
// a pidfd and through the kill(pid, 0) fallback.
func TestProcessExited(t *testing.T) {
	cmd := exec.Command("/bin/sh", "-c", "read x")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	pid := cmd.Process.Pid
	p, err := watchProcess(pid)
	if err != nil {
		stdin.Close()
		cmd.Wait()
		t.Fatal(err)
	}
	defer p.close()
	fallback := &process{pid: pid, fd: -1}
	if p.exited() || fallback.exited() {
		t.Error("a running process counts as exited")
	}
	stdin.Close()
	_ = cmd.Wait() // reaped: both ways must see it now
	if !p.exited() {
		t.Error("pidfd: the process exited, but it counts as running")
	}
	if !fallback.exited() {
		t.Error("kill(pid, 0): the process exited, but it counts as running")
	}
	if _, err := watchProcess(pid); err == nil {
		t.Error("watchProcess of an exited process succeeded")
	}
	if q, err := watchProcess(0); q != nil || err == nil {
		// pid 0 is not a process of ours to watch.
		t.Errorf("watchProcess(0) = %v, %v", q, err)
	}
}
