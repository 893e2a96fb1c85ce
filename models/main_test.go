package models

import (
	"testing"

	"go.uber.org/goleak"
)

// SetThreads starts goroutines: every test must have stopped them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
