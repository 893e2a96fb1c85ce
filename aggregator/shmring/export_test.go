//go:build linux

package shmring

import (
	"os"
	"testing"

	"github.com/gradsync/gradsync/internal/logbuf"
)

// Test helpers shared by the package's internal and external tests.

// LogBuffer is a log destination shared by goroutines.
type LogBuffer = logbuf.Buffer

// Entries lists the names in dir.
func Entries(t testing.TB, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

var entries = Entries

// SetHostID replaces HostID in Negotiate until the test ends.
func SetHostID(t testing.TB, f func(dir string) (string, error)) {
	old := hostID
	hostID = f
	t.Cleanup(func() { hostID = old })
}
