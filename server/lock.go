package server

import (
	"bytes"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
)

// shellLock is the server's one lock, and the ordered executor of what
// must not happen under it (as raft's Ready is carried out outside the
// state machine). Decisions are taken while it is held; their effects —
// sends to workers, job store writes, run-log records, checkpoint pins
// and saves, summaries, the preparation of a job's start — are queued
// with later. Unlock hands them, in the order queued, to one FIFO shared
// by every goroutine, so effects run in the order in which the lock was
// held (a Cancel and an Assign for one worker are never reordered), one
// at a time, by the executor goroutine that Serve runs (before Serve
// starts it and once it has stopped, by the unlocking goroutine). Unlock
// then waits until its own effects are done, so a handler returns only
// after its writes; unlockAsync does not wait (a worker's stream must
// keep reading its heartbeats). An effect that must take the lock again
// does so with within, never Lock/Unlock.
type shellLock struct {
	mu      sync.Mutex
	pending []func() // guarded by mu: what the holder queued
	// owner is the goroutine holding mu, kept only when lockChecks is
	// on (tests): offLock checks the caller does not hold it.
	owner atomic.Int64

	qmu sync.Mutex
	// qcond is signalled (on qmu) when effects are handed over or done.
	qcond *sync.Cond
	// queue holds effects handed over and not yet run; handed counts
	// every effect handed over, done every effect run; running says the
	// executor goroutine runs them, stopping asks it to end once the
	// queue is empty. All guarded by qmu.
	queue             []func()
	handed, done      uint64
	running, stopping bool
	// inline says a goroutine is running an effect itself (no executor
	// runs): the others wait for it rather than run the next one beside
	// it.
	inline bool
	// runner is the goroutine running effects (lockChecks only).
	runner atomic.Int64
}

// init prepares the lock for use (before anything else).
func (l *shellLock) init() { l.qcond = sync.NewCond(&l.qmu) }

// lockChecks makes offLock verify that the lock is not held by the
// calling goroutine (and Unlock that no effect calls it); the server's
// tests turn it on (export_test.go).
var lockChecks bool

func (l *shellLock) Lock() {
	l.mu.Lock()
	if lockChecks {
		l.owner.Store(goid())
	}
}

// Unlock releases the lock, then waits until the effects queued under it
// have been carried out.
func (l *shellLock) Unlock() {
	ticket, handed := l.release()
	if lockChecks && l.runner.Load() == goid() {
		// Waiting here would wait for this very effect to end.
		panic("server: Unlock called by an effect of the server's lock (use within)")
	}
	if handed {
		l.wait(ticket)
	}
}

// unlockAsync releases the lock without waiting for its effects (they
// still run in order).
func (l *shellLock) unlockAsync() {
	ticket, handed := l.release()
	if handed && !l.executing() {
		l.wait(ticket)
	}
}

// within runs f under the lock from an effect being carried out: what f
// queues joins the FIFO behind what is already in it.
func (l *shellLock) within(f func()) {
	l.Lock()
	f()
	l.release()
}

// release hands the holder's effects to the FIFO and unlocks mu; it
// returns the count the FIFO's done must reach for them to be done.
func (l *shellLock) release() (ticket uint64, handed bool) {
	fx := l.pending
	l.pending = nil
	if len(fx) > 0 {
		l.qmu.Lock()
		l.queue = append(l.queue, fx...)
		l.handed += uint64(len(fx))
		ticket, handed = l.handed, true
		l.qcond.Broadcast() // the executor, among waiters for their effects
		l.qmu.Unlock()
	}
	if lockChecks {
		l.owner.Store(0)
	}
	l.mu.Unlock()
	return ticket, handed
}

// executing reports whether the executor goroutine is running.
func (l *shellLock) executing() bool {
	l.qmu.Lock()
	defer l.qmu.Unlock()
	return l.running
}

// wait returns once done has reached ticket: the executor ran the
// effects, or, when it is not running, the caller ran them itself.
func (l *shellLock) wait(ticket uint64) {
	l.qmu.Lock()
	defer l.qmu.Unlock()
	// Inline, everything queued runs (an effect's within queues more).
	for l.done < ticket || (!l.running && len(l.queue) > 0) {
		if l.running || l.inline {
			l.qcond.Wait()
			continue
		}
		l.inline = true
		l.runOneLocked()
		l.inline = false
	}
}

// runOneLocked runs the FIFO's first effect; qmu is held, and released
// while the effect runs. One goroutine at a time does (inline runs
// happen only while no executor runs, and wait lets one goroutine at a
// time run inline).
func (l *shellLock) runOneLocked() {
	f := l.queue[0]
	l.queue[0] = nil
	l.queue = l.queue[1:]
	l.qmu.Unlock()
	if lockChecks {
		l.runner.Store(goid())
	}
	f()
	if lockChecks {
		l.runner.Store(0)
	}
	l.qmu.Lock()
	l.done++
	l.qcond.Broadcast()
}

// execute is the executor goroutine's loop (owned by Serve): it runs the
// FIFO's effects in order until stop is called and the FIFO is empty.
func (l *shellLock) execute(started chan<- struct{}) {
	l.qmu.Lock()
	defer l.qmu.Unlock()
	l.running = true
	close(started)
	for {
		for len(l.queue) == 0 && !l.stopping {
			l.qcond.Wait()
		}
		if len(l.queue) == 0 {
			l.running, l.stopping = false, false
			l.qcond.Broadcast()
			return
		}
		l.runOneLocked()
	}
}

// stop asks execute to return once the FIFO is empty.
func (l *shellLock) stop() {
	l.qmu.Lock()
	l.stopping = true
	l.qcond.Broadcast()
	l.qmu.Unlock()
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
