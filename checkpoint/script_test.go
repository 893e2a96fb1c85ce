package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestLatestScript: the highest step wins (numerically, not by name);
// temporaries, other names, non-canonical steps and folders are passed
// over; an empty or missing folder is ErrNoCheckpoint.
func TestLatestScript(t *testing.T) {
	dir := t.TempDir()
	if _, err := LatestScript(filepath.Join(dir, "none")); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("missing folder: %v", err)
	}
	if _, err := LatestScript(dir); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("empty folder: %v", err)
	}
	for _, f := range []string{"script-step-9.pt", "script-step-10.pt", "script-step-010.pt", "script-step-11.pt.tmp-42",
		"script-step--1.pt", "script-step-x.pt", "ckpt-99", "other.pt"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "script-step-12.pt"), 0o700); err != nil {
		t.Fatal(err)
	}
	got, err := LatestScript(dir)
	if err != nil || got != filepath.Join(dir, "script-step-10.pt") {
		t.Fatalf("LatestScript = %q, %v; want script-step-10.pt", got, err)
	}
}
