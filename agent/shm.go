package agent

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

// shmDir is where shared-memory regions are made (tmpfs); os.TempDir()
// where it does not exist.
const shmDir = "/dev/shm"

// region is a shared-memory file mapped into this process: the script
// maps the same file, and an all-reduce names a range of it.
type region struct {
	path string
	mem  []byte    // the mapping
	f32  []float32 // mem as float32 values (host byte order)
}

// newRegion makes a 0600 file of n float32 values and maps it shared.
func newRegion(n int64) (*region, error) {
	dir := shmDir
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		dir = os.TempDir()
	}
	f, err := os.CreateTemp(dir, "gradsync-agent-*.shm") // mode 0600
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

// close unmaps the region and removes its file.
func (r *region) close() {
	if r == nil {
		return
	}
	_ = syscall.Munmap(r.mem)
	os.Remove(r.path)
	r.mem, r.f32 = nil, nil
}
