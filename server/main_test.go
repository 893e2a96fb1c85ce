package server_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine (server, worker,
// stream) outlives them. It is the only TestMain of the server test binary.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
