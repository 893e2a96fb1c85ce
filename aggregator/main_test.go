package aggregator_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them. It is
// the only TestMain of the aggregator test binary.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
