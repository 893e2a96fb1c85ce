package server

import (
	"bytes"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
)

// shellLock is the server's one lock, and the ordered executor of what
// must not happen under it (as raft's Ready is carried out by the
// caller). Decisions are taken while it is held; their effects — sends
// to workers, job store writes, run-log records, checkpoint pins and
// saves, summaries — are queued with later. Unlock hands them, in the
// order queued, to one FIFO shared by every goroutine (so the order of
// the effects is the order in which the lock was held: a Cancel and an
// Assign for one worker are never reordered), releases the lock, and
// carries the FIFO out until it has run everything it handed over (so a
// handler returns only after its own effects are done). An effect that
// must take the lock again does so with within, never Lock/Unlock.
type shellLock struct {
	mu      sync.Mutex
	pending []func() // guarded by mu: what the holder queued
	// owner is the goroutine holding mu, kept only when lockChecks is
	// on (tests): offLock checks the caller does not hold it.
	owner atomic.Int64

	qmu   sync.Mutex
	queue []func() // guarded by qmu: handed over, not yet run
	// run is held by the goroutine carrying out the queue, one at a
	// time, in order; runner is that goroutine (lockChecks only).
	run    sync.Mutex
	runner atomic.Int64
}

// lockChecks makes offLock verify that the lock is not held by the
// calling goroutine (and Unlock that it is not called by an effect);
// the server's tests turn it on (export_test.go).
var lockChecks bool

func (l *shellLock) Lock() {
	l.mu.Lock()
	if lockChecks {
		l.owner.Store(goid())
	}
}

// Unlock releases the lock, then carries out what was queued under it
// (and what other goroutines handed over before).
func (l *shellLock) Unlock() {
	handed := l.handOver()
	if lockChecks {
		l.owner.Store(0)
	}
	l.mu.Unlock()
	if lockChecks && l.runner.Load() == goid() {
		// Draining here would wait for this very effect to end.
		panic("server: Unlock called by an effect of the server's lock (use within)")
	}
	if handed {
		l.drain()
	}
}

// within runs f under the lock from an effect being carried out: what f
// queues joins the FIFO being run, after what is already in it.
func (l *shellLock) within(f func()) {
	l.Lock()
	f()
	l.handOver()
	if lockChecks {
		l.owner.Store(0)
	}
	l.mu.Unlock()
}

// handOver moves the holder's queued effects to the FIFO; mu is held.
func (l *shellLock) handOver() bool {
	if len(l.pending) == 0 {
		return false
	}
	l.qmu.Lock()
	l.queue = append(l.queue, l.pending...)
	l.qmu.Unlock()
	l.pending = nil
	return true
}

// drain runs the FIFO until it is empty; one goroutine at a time.
func (l *shellLock) drain() {
	l.run.Lock()
	defer l.run.Unlock()
	if lockChecks {
		l.runner.Store(goid())
		defer l.runner.Store(0)
	}
	for {
		l.qmu.Lock()
		if len(l.queue) == 0 {
			l.qmu.Unlock()
			return
		}
		f := l.queue[0]
		l.queue[0] = nil
		l.queue = l.queue[1:]
		l.qmu.Unlock()
		f()
	}
}

// later queues f to run once the lock is released; the lock must be held.
func (l *shellLock) later(f func()) { l.pending = append(l.pending, f) }

// offLock panics (with lockChecks on) when the calling goroutine holds
// the lock: what is about to happen — naming it — must not.
func (l *shellLock) offLock(what string) {
	if lockChecks && l.owner.Load() == goid() {
		panic(fmt.Sprintf("server: %s while holding the server's lock", what))
	}
}

// goid is the calling goroutine's id, for the lock checks only (it reads
// the stack header "goroutine N [...").
func goid() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	var id int64
	for _, c := range b {
		if c < '0' || c > '9' {
			break
		}
		id = id*10 + int64(c-'0')
	}
	return id
}
