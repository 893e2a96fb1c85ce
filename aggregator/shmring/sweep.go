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
// than an hour (a live ring's segments are unlinked within its Connect);
// and the segments' bells (FIFOs named after them) once the segment is
// gone and they are a minute old, or once they are an hour old.
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
	var removed, bells []string
	var errs []error
	remove := func(name string) {
		if err := os.Remove(filepath.Join(dir, name)); err == nil {
			removed = append(removed, name)
		} else if !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	for _, e := range es {
		name := e.Name()
		if base, ok := bellOf(name); ok {
			bells = append(bells, base, name)
			continue
		}
		if !isSegmentName(name) || !stale(filepath.Join(dir, name), now) {
			continue
		}
		remove(name)
	}
	// A segment's bells go with it: once the segment is gone (removed
	// above, or attached and unlinked by a neighbour that then crashed
	// before removing them), or when they are abandoned.
	for i := 0; i < len(bells); i += 2 {
		base, name := bells[i], bells[i+1]
		if staleBell(filepath.Join(dir, name), filepath.Join(dir, base), now) {
			remove(name)
		}
	}
	return removed, errors.Join(errs...)
}

func isSegmentName(name string) bool {
	return strings.HasPrefix(name, namePrefix) && (Offer{Name: name, Rank: 0, PID: 1}).validate(0) == nil
}

// bellOf reports whether name is one of a segment's bells, and names the
// segment.
func bellOf(name string) (segment string, ok bool) {
	for _, suffix := range []string{".data", ".space"} {
		if base, found := strings.CutSuffix(name, suffix); found && isSegmentName(base) {
			return base, true
		}
	}
	return "", false
}

// staleBell reports whether the bell at path, of the segment at segment,
// is one to remove: this user's FIFO, a minute old with no segment, or
// an hour old.
func staleBell(path, segment string, now time.Time) bool {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		return false
	}
	if remove, decided := byAge(fi, now); decided {
		return remove
	}
	_, err = os.Lstat(segment)
	return errors.Is(err, os.ErrNotExist)
}

// byAge decides what it can from a file's owner and age alone: keep it
// (another user's, or under sweepDeadAfter old), remove it (over
// sweepAnyAfter old), or look closer (decided false).
func byAge(fi os.FileInfo, now time.Time) (remove, decided bool) {
	if uid, ok := fileOwner(fi); !ok || uid != os.Geteuid() {
		return false, true
	}
	switch age := now.Sub(fi.ModTime()); {
	case age > sweepAnyAfter:
		return true, true
	case age < sweepDeadAfter:
		return false, true
	}
	return false, false
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
	if remove, decided := byAge(fi, now); decided {
		return remove
	}
	b := make([]byte, segHdrLen)
	if _, err := io.ReadFull(f, b); err != nil {
		return false // being written, or not ours: the hour decides
	}
	h, err := decodeSegment(b, int(fi.Size()))
	return err == nil && processGone(h.PID)
}
