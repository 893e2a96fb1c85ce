package train

import (
	"testing"

	"go.uber.org/goleak"
)

// Run with Threads > 1 starts the network's goroutines: it must stop them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
