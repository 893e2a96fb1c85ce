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
