package shmring

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A bell is one direction of a link's wake-ups between processes: a FIFO
// in the segment directory, opened read-write by both ends (so that no
// open blocks and the pipe outlives its name) and unlinked with the
// segment. Its single waiter reads it through Go's network poller, so a
// rank asleep on its neighbour parks a goroutine, not a thread holding
// one of the runtime's Ps: a futex sleep is a system call that keeps its
// P until the runtime's monitor takes it back, which can be 10 ms on a
// quiet process, and meanwhile the training step's own goroutines (or, in
// `gradsync local`, the other rank's) wait for a P. The waker writes one
// byte, only when the waiter has said it sleeps; stray bytes only cost a
// waiter an extra look at its counters.
type bell struct {
	path string // the FIFO's name while it may still exist
	f    *os.File
	rc   syscall.RawConn
	buf  [64]byte // read by the single waiter only
}

// bellPaths are the FIFOs of the segment at path: the receiver waits on
// the first (frames published), the sender on the second (slots freed).
func bellPaths(path string) (data, space string) { return path + ".data", path + ".space" }

// makeBell creates the FIFO at path (mode 0600, failing if the name
// exists) and opens it.
func makeBell(path string) (*bell, error) {
	if err := unix.Mkfifo(path, 0o600); err != nil {
		return nil, &os.PathError{Op: "mkfifo", Path: path, Err: err}
	}
	if err := os.Chmod(path, 0o600); err != nil { // whatever the umask
		_ = os.Remove(path)
		return nil, err
	}
	b, err := openBell(path)
	if err != nil {
		_ = os.Remove(path)
		return nil, err
	}
	return b, nil
}

// openBell opens the FIFO at path and refuses it unless it is a FIFO of
// this user with mode 0600.
func openBell(path string) (*bell, error) {
	f, err := os.OpenFile(path, os.O_RDWR|nofollow, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil {
		uid, ok := fileOwner(fi)
		switch {
		case fi.Mode()&os.ModeNamedPipe == 0 || fi.Mode().Perm() != 0o600:
			err = fmt.Errorf("%w: %s has mode %v; want a FIFO with mode 0600", ErrRefused, path, fi.Mode())
		case ok && uid != os.Geteuid():
			err = fmt.Errorf("%w: %s belongs to uid %d, not to this process's %d", ErrRefused, path, uid, os.Geteuid())
		}
	}
	if err == nil && f.SetReadDeadline(time.Time{}) != nil {
		// Not in the poller: every wait would sleep its whole bound.
		err = fmt.Errorf("%s cannot be waited on through the poller", path)
	}
	var rc syscall.RawConn
	if err == nil {
		rc, err = f.SyscallConn()
	}
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return &bell{path: path, f: f, rc: rc}, nil
}

// wait returns when the bell rings, or after at most d.
func (b *bell) wait(d time.Duration) {
	if b == nil {
		time.Sleep(d)
		return
	}
	if err := b.f.SetReadDeadline(time.Now().Add(d)); err != nil {
		time.Sleep(d) // closed under us: the caller's checks will say why
		return
	}
	_, _ = b.f.Read(b.buf[:])
}

// ring wakes the bell's waiter. It never blocks: a full pipe already
// holds a wake-up.
func (b *bell) ring() {
	if b == nil {
		return
	}
	_ = b.rc.Write(func(fd uintptr) bool {
		for {
			_, err := unix.Write(int(fd), []byte{1})
			if !errors.Is(err, unix.EINTR) {
				return true
			}
		}
	})
}

// unlink removes the FIFO's name if it still has one.
func (b *bell) unlink() {
	if b != nil && b.path != "" {
		_ = os.Remove(b.path)
		b.path = ""
	}
}

func (b *bell) close() {
	if b != nil {
		b.unlink()
		_ = b.f.Close()
	}
}
