package checkpoint

import (
	"errors"
	"path/filepath"
	"runtime"
	"testing"
)

// TestReplaceKeepsStepVisible: while a checkpoint replaces one of the
// same step, a reader (the coordinator pinning the latest for a
// recovery) still finds ckpt-<step>, whole. It was missing between
// moving the old one aside and renaming the new one in, and a recovery
// pinning it then failed the job ("pin: open …/ckpt-20: no such file").
func TestReplaceKeepsStepVisible(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the folders are exchanged in one step on Linux only")
	}
	dir := t.TempDir()
	for _, step := range []int64{10, 20} {
		if _, err := Save(dir, small(step), 5); err != nil {
			t.Fatal(err)
		}
	}
	calls := 0
	testHookReplaced = func() {
		calls++
		s, path, skipped, err := Latest(dir)
		if err != nil || len(skipped) != 0 || filepath.Base(path) != "ckpt-20" {
			t.Errorf("during the replacement: Latest = %s, skipped %v, %v; want ckpt-20", path, skipped, err)
		} else if s.Meta.JobID != "replaced" {
			t.Errorf("during the replacement: Latest holds job %q, want the new checkpoint", s.Meta.JobID)
		}
	}
	defer func() { testHookReplaced = nil }()
	s := small(20)
	s.Meta.JobID = "replaced"
	if _, err := Save(dir, s, 5); err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Fatalf("the replacement hook ran %d times, want 1", calls)
	}
	if got, want := names(t, dir), []string{"ckpt-10", "ckpt-20"}; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("left %v, want %v (the replaced one removed)", got, want)
	}
}

// TestPinLatest: the latest checkpoint that verifies is pinned; where a
// writer prunes it while its files are being linked, the checkpoint that
// is latest then is pinned instead; no checkpoint is ErrNoCheckpoint.
func TestPinLatest(t *testing.T) {
	dir := t.TempDir()
	if _, err := PinLatest(dir, "g2", 4); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("PinLatest of an empty folder: %v, want ErrNoCheckpoint", err)
	}
	for _, step := range []int64{10, 20} {
		if _, err := Save(dir, small(step), 5); err != nil {
			t.Fatal(err)
		}
	}
	listed := 0
	testHookPinListed = func() {
		listed++
		if listed == 1 { // a rank saves step 30 and prunes 20 as the pin lists 20's files
			if _, err := Save(dir, small(30), 1); err != nil {
				t.Error(err)
			}
		}
	}
	defer func() { testHookPinListed = nil }()
	path, err := PinLatest(dir, "g2", 4)
	if err != nil {
		t.Fatalf("PinLatest: %v", err)
	}
	if listed < 2 {
		t.Errorf("Pin ran %d times, want a second try after the rewrite", listed)
	}
	s, err := Load(path)
	if err != nil || s.Meta.Step != 30 {
		t.Fatalf("pinned %s: %+v, %v; want step 30", path, s, err)
	}
}
