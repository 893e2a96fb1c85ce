package server

import (
	"slices"
	"testing"
)

// TestShellLock: work queued under the lock runs once it is released, in
// order; offLock refuses to run on the goroutine holding the lock (the
// check every other test of the package runs under), and not on others.
func TestShellLock(t *testing.T) {
	if !lockChecks {
		t.Fatal("lock checks are off in the server's tests")
	}
	var l shellLock
	l.init()
	var order []int
	l.Lock()
	l.later(func() { l.offLock("first"); order = append(order, 1) })
	l.later(func() { l.offLock("second"); order = append(order, 2) })
	if len(order) != 0 {
		t.Fatal("queued work ran under the lock")
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("offLock under the lock did not panic")
			}
		}()
		l.offLock("a job store write")
	}()
	other := make(chan any)
	go func() { // owned by the test: it waits for the result
		defer func() { other <- recover() }()
		l.offLock("a write on another goroutine")
	}()
	if p := <-other; p != nil {
		t.Errorf("offLock on a goroutine not holding the lock panicked: %v", p)
	}
	l.Unlock()
	if !slices.Equal(order, []int{1, 2}) {
		t.Fatalf("queued work ran %v; want [1 2]", order)
	}
}

// TestShellLockOrder: effects run in the order the lock was held, across
// goroutines; an effect that takes the lock again (within) queues its own
// behind what is already waiting; and Unlock from an effect panics (it
// would wait for itself).
func TestShellLockOrder(t *testing.T) {
	var l shellLock
	l.init()
	var order []string // appended by effects only: they run one at a time
	l.Lock()
	l.later(func() {
		l.offLock("first")
		order = append(order, "first")
		l.within(func() { l.later(func() { order = append(order, "from first") }) })
		func() {
			defer func() {
				if recover() == nil {
					t.Error("Unlock from an effect did not panic")
				}
			}()
			l.Lock()
			l.later(func() { order = append(order, "never") })
			l.Unlock()
		}()
	})
	// Another goroutine takes the lock after this one: its effect runs
	// after "first" even though this goroutine has not unlocked yet when
	// it queues.
	queued := make(chan struct{})
	done := make(chan struct{})
	go func() { // owned by the test: it waits on done
		defer close(done)
		l.Lock()
		close(queued)
		l.later(func() { order = append(order, "second") })
		l.Unlock()
	}()
	l.Unlock()
	<-queued
	<-done
	// "never" was handed over by the refused Unlock: it runs in turn too.
	order = slices.DeleteFunc(order, func(s string) bool { return s == "never" })
	if want := []string{"first", "from first", "second"}; !slices.Equal(order, want) && !slices.Equal(order, []string{"first", "second", "from first"}) {
		t.Fatalf("effects ran %v; want %v", order, want)
	}
}

// TestShellLockExecutor: with the executor goroutine running, Unlock
// returns once its effects ran; unlockAsync returns at once and its
// effects still run in order, before those queued after them.
func TestShellLockExecutor(t *testing.T) {
	var l shellLock
	l.init()
	started, done := make(chan struct{}), make(chan struct{})
	go func() { // owned by the test: stopped below
		defer close(done)
		l.execute(started)
	}()
	<-started
	var order []string // appended by effects only
	release := make(chan struct{})
	l.Lock()
	l.later(func() { <-release; order = append(order, "async") })
	l.unlockAsync() // returns although its effect is blocked
	l.Lock()
	l.later(func() { order = append(order, "waited") })
	unlocked := make(chan struct{})
	go func() { // owned by the test: it waits on unlocked
		defer close(unlocked)
		l.Unlock()
	}()
	close(release)
	<-unlocked
	if !slices.Equal(order, []string{"async", "waited"}) {
		t.Fatalf("effects ran %v; want [async waited]", order)
	}
	l.stop()
	<-done
}
