//go:build linux

package checkpoint

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// exchange swaps the folders tmp and path in one step (renameat2 with
// RENAME_EXCHANGE), so a reader never sees path missing while a
// checkpoint of the same step is replaced: the old one is then at tmp.
// It reports false where the file system cannot exchange (the caller
// then moves the old folder aside first).
func exchange(tmp, path string) (bool, error) {
	err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, path, unix.RENAME_EXCHANGE)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EOPNOTSUPP):
		return false, nil
	default:
		return false, &os.LinkError{Op: "exchange", Old: tmp, New: path, Err: err}
	}
}
