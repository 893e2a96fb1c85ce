package data

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine (a loader's
// dispatcher or decoders) outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
