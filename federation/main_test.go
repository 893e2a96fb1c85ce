package federation

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine (a driver's Run, a
// stream's receive loop) outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
