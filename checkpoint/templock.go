package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// A checkpoint's temporary folder is claimed by a lock file beside it,
// <tmp>.lock, created and locked (flock, where the system has it) before
// the folder and released after the folder is renamed or removed. A
// writer cleaning up what crashed writers left (removeLeftovers) removes
// a temporary folder only when it can take that lock, so two writers of
// one directory — the old generation's rank 0 writing its checkpoint at
// stop while the new generation's rank 0, in this process or another,
// writes the next — never remove each other's folder.

const lockSuffix = ".lock"

// held maps this process's temporary folders to their lock files.
var held struct {
	sync.Mutex
	files map[string]*os.File
}

// makeTemp creates dir (durably) if needed, removes what a crashed
// writer left there, and makes and claims the temporary folder of
// step's checkpoint. Give it back with releaseTemp.
func makeTemp(dir string, step int64) (string, error) {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", err
		}
		if err := syncDir(filepath.Dir(filepath.Clean(dir))); err != nil {
			return "", err
		}
	}
	removeLeftovers(dir)
	lf, err := os.CreateTemp(dir, tmpPrefix+Prefix+strconv.FormatInt(step, 10)+"-*"+lockSuffix)
	if err != nil {
		return "", err
	}
	if err := claim(lf); err != nil {
		os.Remove(lf.Name())
		lf.Close()
		return "", err
	}
	tmp := strings.TrimSuffix(lf.Name(), lockSuffix)
	err = os.Mkdir(tmp, 0o755)
	if err == nil {
		err = os.Chmod(tmp, 0o755) // whatever the umask, as a finished checkpoint's
	}
	if err != nil {
		os.Remove(tmp)
		os.Remove(lf.Name())
		lf.Close()
		return "", err
	}
	held.Lock()
	if held.files == nil {
		held.files = map[string]*os.File{}
	}
	held.files[tmp] = lf
	held.Unlock()
	return tmp, nil
}

// releaseTemp gives back the claim on tmp (made by makeTemp) once tmp is
// renamed or removed; it removes tmp if it is still there.
func releaseTemp(tmp string) {
	held.Lock()
	lf := held.files[tmp]
	delete(held.files, tmp)
	held.Unlock()
	os.RemoveAll(tmp)
	if lf != nil {
		os.Remove(lf.Name())
		lf.Close()
	}
}

// removeLeftovers removes the temporary and trash folders of earlier,
// crashed Saves; errors are ignored (the next Save retries). A
// temporary folder whose lock is held is another writer's, at work: it
// is left alone.
func removeLeftovers(dir string) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	names := map[string]bool{}
	for _, de := range des {
		names[de.Name()] = true
	}
	for _, de := range des {
		n := de.Name()
		switch {
		case strings.HasPrefix(n, trashPrefix+Prefix):
			os.RemoveAll(filepath.Join(dir, n))
		case !strings.HasPrefix(n, tmpPrefix+Prefix):
		case strings.HasSuffix(n, lockSuffix):
			removeUnlocked(filepath.Join(dir, n))
		case !names[n+lockSuffix]:
			// No lock file: its writer had released it (it removes the
			// folder first) or predates the locks.
			os.RemoveAll(filepath.Join(dir, n))
		}
	}
}

// removeUnlocked removes the temporary folder of lock file path and the
// lock file when nobody holds the lock.
func removeUnlocked(path string) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return // released meanwhile
	}
	defer f.Close()
	if ok, err := tryLock(f); err != nil || !ok {
		return
	}
	os.RemoveAll(strings.TrimSuffix(path, lockSuffix))
	os.Remove(path)
}
