//go:build linux

package shmring_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them. A
// test binary started by TestKill9 as one rank of a multi-process ring
// runs that rank instead of the tests.
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain())
	}
	goleak.VerifyTestMain(m)
}
