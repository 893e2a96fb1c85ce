package shmring

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// nofollow refuses a segment name that is a symbolic link.
const nofollow = syscall.O_NOFOLLOW

// Futex operations (linux/futex.h). The words live in memory shared
// between processes, so the shared (not the _PRIVATE) forms are used.
const (
	futexWaitOp = 0
	futexWakeOp = 1
)

// futexWait sleeps while *w == v, at most d. Early returns (a wake, a
// signal, *w != v) are all fine: callers re-check their condition.
func futexWait(w *atomic.Uint32, v uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWaitOp, uintptr(v), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes every sleeper on w.
func futexWake(w *atomic.Uint32) {
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWakeOp, 1<<30, 0, 0, 0)
}

// mapFile maps size bytes of f shared and read-write.
func mapFile(f *os.File, size int) ([]byte, error) {
	return unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
}

func unmap(b []byte) error { return unix.Munmap(b) }

// fileOwner reports the owner of a file's stat result.
func fileOwner(fi os.FileInfo) (uid int, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}

// A process is a peer process, watched through a pidfd, which (unlike a
// pid) cannot come to name another process once the peer has exited.
// Where pidfds are not available (kernels before 5.3, some sandboxes) it
// falls back to kill(pid, 0), which notices an exit only once the
// process has been reaped by its parent, and which a reused pid could
// fool after that.
type process struct {
	pid, fd int // fd < 0: no pidfd
}

// watchProcess watches pid; a nil *process is this process.
func watchProcess(pid int) (*process, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("shmring: %d is not a process id", pid)
	}
	if pid == os.Getpid() {
		return nil, nil
	}
	fd, err := unix.PidfdOpen(pid, 0)
	switch {
	case err == nil:
		return &process{pid: pid, fd: fd}, nil
	case errors.Is(err, unix.ESRCH):
		return nil, fmt.Errorf("shmring: process %d has exited", pid)
	}
	if err := unix.Kill(pid, 0); err != nil && !errors.Is(err, unix.EPERM) {
		return nil, fmt.Errorf("shmring: watching process %d: %w", pid, err)
	}
	return &process{pid: pid, fd: -1}, nil
}

// exited reports whether the process has ended: its pidfd is readable.
func (p *process) exited() bool {
	if p == nil {
		return false
	}
	if p.fd < 0 {
		return errors.Is(unix.Kill(p.pid, 0), unix.ESRCH)
	}
	fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err == nil && n > 0
	}
}

func (p *process) close() {
	if p != nil && p.fd >= 0 {
		_ = unix.Close(p.fd)
	}
}

// processGone reports whether no process pid exists in this pid namespace.
func processGone(pid int) bool { return pid > 0 && errors.Is(unix.Kill(pid, 0), unix.ESRCH) }
