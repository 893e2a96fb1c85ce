package shmring

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Ages after which Sweep removes a segment nobody will attach any more.
const (
	// sweepDeadAfter: the creator process is gone (as far as this pid
	// namespace can tell) and the segment is older than any Connect in
	// progress would leave it.
	sweepDeadAfter = time.Minute
	// sweepAnyAfter: whatever its creator, a segment still named this
	// long after its creation belongs to a setup that was abandoned.
	sweepAnyAfter = time.Hour
)

// Sweep removes from dir ("" meaning DefaultDir) the segments that a
// crash left behind: a process killed between Create and its
// neighbour's attach cannot unlink its segment itself. It only touches
// this user's files named like segments, and only those whose creator
// process is gone and that are older than a minute, or that are older
// than an hour (a live ring's segments are unlinked within its Connect).
// Create calls it; it returns the names it removed.
func Sweep(dir string) ([]string, error) {
	if dir == "" {
		dir = DefaultDir
	}
	return sweep(dir, time.Now())
}

func sweep(dir string, now time.Time) ([]string, error) {
	es, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range es {
		name := e.Name()
		if !strings.HasPrefix(name, namePrefix) || (Offer{Name: name, Rank: 0, PID: 1}).validate(0) != nil {
			continue
		}
		path := filepath.Join(dir, name)
		if !stale(path, now) {
			continue
		}
		if err := os.Remove(path); err == nil {
			removed = append(removed, name)
		} else if !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}

// stale reports whether the segment at path is one to remove.
func stale(path string, now time.Time) bool {
	f, err := os.OpenFile(path, os.O_RDONLY|nofollow, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return false
	}
	if uid, ok := fileOwner(fi); !ok || uid != os.Geteuid() {
		return false
	}
	age := now.Sub(fi.ModTime())
	if age > sweepAnyAfter {
		return true
	}
	if age < sweepDeadAfter {
		return false
	}
	b := make([]byte, segHdrLen)
	if _, err := io.ReadFull(f, b); err != nil {
		return false // being written, or not ours: the hour decides
	}
	h, err := decodeSegment(b, int(fi.Size()))
	return err == nil && processGone(h.PID)
}
