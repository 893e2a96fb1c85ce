package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// mapShared maps a region file as a script would.
func mapShared(t *testing.T, path string, n int) []float32 {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mem, err := syscall.Mmap(int(f.Fd()), 0, 4*n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(mem) })
	return unsafe.Slice((*float32)(unsafe.Pointer(&mem[0])), n)
}

// TestSharedMemoryAllReduce: buckets reduced in place in the shared
// region, two of them in flight at once, equal the sums; a range outside
// the region is refused; Close removes the file.
func TestSharedMemoryAllReduce(t *testing.T) {
	const n, size = 2, 10
	w := newWorld(t, n, time.Minute)
	ctx := ctxT(t)
	layout := []*pb.TensorInfo{{Name: "w", Shape: []int64{size}, Dtype: "float32"}}
	paths := make([]string, n)
	errs := onAll(n, func(r int) error {
		res, err := w.clients[r].RegisterLayout(ctx, &pb.RegisterLayoutRequest{Seq: 0, Tensors: layout, SharedMemory: true})
		if err == nil {
			paths[r] = res.ShmPath
		}
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		fi, err := os.Stat(paths[r])
		if err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != 4*size {
			t.Fatalf("rank %d: region %s: %v %v, want a 0600 file of %d bytes", r, paths[r], fi, err, 4*size)
		}
	}
	views := make([][]float32, n)
	for r := range n {
		views[r] = mapShared(t, paths[r], size)
		for i := range views[r] {
			views[r][i] = float32(r + 1 + i)
		}
	}
	errs = onAll(n, func(r int) error {
		// Two buckets in flight: [6, 10) as 1 and [0, 6) as 2, sent in that order.
		f2 := make(chan error, 1)
		go func() {
			_, err := w.clients[r].AllReduce(ctx, &pb.AllReduceRequest{Seq: 2, Shm: &pb.ShmRange{Offset: 0, Length: 6}, Average: true})
			f2 <- err
		}()
		_, err := w.clients[r].AllReduce(ctx, &pb.AllReduceRequest{Seq: 1, Shm: &pb.ShmRange{Offset: 6, Length: 4}})
		if err2 := <-f2; err == nil {
			err = err2
		}
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		if _, err := os.Stat(paths[r]); !os.IsNotExist(err) {
			t.Fatalf("rank %d: region file still there after the first collective: %v", r, err)
		}
	}
	for r := range n {
		for i, v := range views[r] {
			want := float32(3 + 2*i) // (1+i) + (2+i)
			if i < 6 {
				want /= n
			}
			if v != want {
				t.Fatalf("rank %d [%d] = %v, want %v", r, i, v, want)
			}
		}
	}
	_, err := w.clients[0].AllReduce(ctx, &pb.AllReduceRequest{Seq: 3, Shm: &pb.ShmRange{Offset: 8, Length: 4}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("range past the end: %v, want InvalidArgument", err)
	}
	_, err = w.clients[1].AllReduce(ctx, &pb.AllReduceRequest{Seq: 3, Shm: &pb.ShmRange{Length: 1}, Data: []byte{0, 0, 0, 0}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("data and a range: %v, want InvalidArgument", err)
	}
	for r := range n {
		w.servers[r].Close() // the file is gone already; Close unmaps
	}
}

// TestSweepRegions: region files of worker processes that no longer run
// are removed when a region is made; a running process's, a name
// without a pid and other files are left.
func TestSweepRegions(t *testing.T) {
	dir := t.TempDir()
	dead := deadPID(t)
	names := map[string]bool{ // name: removed
		regionPrefix + strconv.Itoa(dead) + "-123.shm":        true,
		regionPrefix + strconv.Itoa(os.Getpid()) + "-456.shm": false,
		regionPrefix + "789.shm":                              false, // an older name, no pid
		"gradsync-other.shm":                                  false,
	}
	for name := range names {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sweepRegions(dir)
	for name, removed := range names {
		_, err := os.Stat(filepath.Join(dir, name))
		if gone := os.IsNotExist(err); gone != removed {
			t.Errorf("%s: removed %v, want %v", name, gone, removed)
		}
	}
}

// deadPID returns the pid of a process that has exited (and was reaped).
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skipf("cannot run true: %v", err)
	}
	return cmd.Process.Pid
}

func TestSharedMemoryNeedsRegistration(t *testing.T) {
	w := newWorld(t, 1, time.Minute)
	_, err := w.clients[0].AllReduce(ctxT(t), &pb.AllReduceRequest{Seq: 0, Shm: &pb.ShmRange{Length: 1}})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("%v, want FailedPrecondition", err)
	}
}
