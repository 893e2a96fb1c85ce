package coordinator_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them (the
// core starts none: this keeps it so).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
