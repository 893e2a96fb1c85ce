//go:build linux

package shmring

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSweep: of the segments in a directory, Sweep removes those whose
// creator is gone once they are a minute old, and any once they are an
// hour old; it keeps a live creator's, young ones, and files that are
// not segments.
func TestSweep(t *testing.T) {
	dir := t.TempDir()
	// A pid that is certainly gone: a child that has been reaped.
	cmd := exec.Command("/bin/true")
	if err := cmd.Run(); err != nil {
		t.Skip(err)
	}
	dead := cmd.Process.Pid
	seg := func(name string, pid int) {
		h := segHeader{Slots: 1, SlotSize: 128, From: 0, To: 1, Size: 2, PID: pid}
		h.Total = segmentSize(h.Slots, h.SlotSize)
		b := make([]byte, h.Total)
		h.encode(b)
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const (
		deadSeg  = "gradsync-000000000000000000000001"
		liveSeg  = "gradsync-000000000000000000000002"
		garbage  = "gradsync-000000000000000000000003"
		notOurs  = "gradsync-notasegment"
		otherApp = "something-else"
	)
	seg(deadSeg, dead)
	seg(liveSeg, os.Getpid())
	// Bells: the dead segment's go with it; an orphan's (its segment was
	// attached, so unlinked) once a minute old; the live one's after an hour.
	const orphan = "gradsync-000000000000000000000004"
	for _, n := range []string{deadSeg + ".data", liveSeg + ".space", orphan + ".data"} {
		if err := unix.Mkfifo(filepath.Join(dir, n), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{garbage, notOurs, otherApp} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	check := func(at time.Time, wantRemoved ...string) {
		t.Helper()
		got, err := sweep(dir, at)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(got)
		if !slices.Equal(got, wantRemoved) {
			t.Errorf("sweep at +%v removed %v, want %v", at.Sub(now).Round(time.Minute), got, wantRemoved)
		}
	}
	check(now)                                                              // everything is young
	check(now.Add(2*time.Minute), deadSeg, deadSeg+".data", orphan+".data") // the dead creator's, and bells without a segment
	check(now.Add(2*time.Hour), liveSeg, liveSeg+".space", garbage)         // abandoned, whoever made them
	names := entries(t, dir)
	if want := []string{notOurs, otherApp}; !slices.Equal(names, want) {
		t.Errorf("left %v, want %v", names, want)
	}
}
