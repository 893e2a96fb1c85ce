package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"
)

// shmDir is where shared-memory regions are made (tmpfs); os.TempDir()
// where it does not exist.
const shmDir = "/dev/shm"

// region is a shared-memory file mapped into this process: the script
// maps the same file, and an all-reduce names a range of it.
//
// The file is unlinked at the first collective on it (the script has
// mapped it by then: it wrote the range it asks to reduce), so a kill -9
// of the worker or the script after that leaves nothing in /dev/shm. The
// file's name carries the worker's pid, and newRegion removes the files
// of workers that died before their first collective.
type region struct {
	path   string
	mem    []byte    // the mapping
	f32    []float32 // mem as float32 values (host byte order)
	unlink sync.Once // removes path (unlinked or close)
}

// regionPrefix starts every region file's name; the worker's pid follows.
const regionPrefix = "gradsync-agent-"

// newRegion makes a 0600 file of n float32 values and maps it shared.
func newRegion(n int64) (*region, error) {
	dir := shmDir
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		dir = os.TempDir()
	}
	sweepRegions(dir)
	f, err := os.CreateTemp(dir, regionPrefix+strconv.Itoa(os.Getpid())+"-*.shm") // mode 0600
	if err != nil {
		return nil, fmt.Errorf("shared memory: %w", err)
	}
	defer f.Close() // the mapping outlives the descriptor
	size := 4 * n
	if err := f.Truncate(size); err != nil {
		os.Remove(f.Name())
		return nil, fmt.Errorf("shared memory of %d bytes: %w", size, err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		os.Remove(f.Name())
		return nil, fmt.Errorf("mapping %d bytes of shared memory: %w", size, err)
	}
	return &region{path: f.Name(), mem: mem, f32: unsafe.Slice((*float32)(unsafe.Pointer(&mem[0])), n)}, nil
}

// slice is the range [off, off+n) of the region, or an error naming it.
func (r *region) slice(off, n int64) ([]float32, error) {
	if off < 0 || n < 0 || off > int64(len(r.f32)) || n > int64(len(r.f32))-off {
		return nil, fmt.Errorf("range [%d, %d) outside the shared region of %d values", off, off+n, len(r.f32))
	}
	return r.f32[off : off+n], nil
}

// unlinked removes the region's file (once): the script has mapped it.
func (r *region) unlinked() { r.unlink.Do(func() { os.Remove(r.path) }) }

// close unmaps the region and removes its file.
func (r *region) close() {
	if r == nil {
		return
	}
	_ = syscall.Munmap(r.mem)
	r.unlinked()
	r.mem, r.f32 = nil, nil
}

// sweepRegions removes the region files in dir of worker processes that
// no longer run (killed before their script's first collective). A file
// whose name carries no pid, or the pid of a running process, is left.
func sweepRegions(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		name := e.Name()
		rest, ok := strings.CutPrefix(name, regionPrefix)
		if !ok || !strings.HasSuffix(name, ".shm") {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); err == nil || err == syscall.EPERM {
			continue // alive (or another user's, whose files are not ours)
		}
		os.Remove(filepath.Join(dir, name))
	}
}
