package server

import (
	"bytes"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
)

// shellLock is the server's one lock, and the executor of what must not
// happen under it. Decisions are taken while it is held; their disk work
// — job store writes, run-log records, checkpoint pins and saves — is
// queued with later and run by Unlock once the lock is released, in the
// order queued, by the goroutine that queued it (so a handler returns
// only after its own writes are done). Code that still locks s.mu
// directly (the ps host, the federated driver) flushes the queue the
// same way.
type shellLock struct {
	mu      sync.Mutex
	pending []func() // guarded by mu
	// owner is the goroutine holding mu, kept only when lockChecks is
	// on (tests): offLock checks the caller does not hold it.
	owner atomic.Int64
}

// lockChecks makes offLock verify that the lock is not held by the
// calling goroutine; the server's tests turn it on (export_test.go).
var lockChecks bool

func (l *shellLock) Lock() {
	l.mu.Lock()
	if lockChecks {
		l.owner.Store(goid())
	}
}

// Unlock releases the lock, then runs what was queued under it.
func (l *shellLock) Unlock() {
	fx := l.pending
	l.pending = nil
	if lockChecks {
		l.owner.Store(0)
	}
	l.mu.Unlock()
	for _, f := range fx {
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
