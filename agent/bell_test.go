package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/gradsync/gradsync/aggregator"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// bellReq encodes a request frame.
func bellReq(op, flags uint16, seq, off, n int64) []byte {
	b := make([]byte, bellRequestLen)
	binary.LittleEndian.PutUint32(b, bellMagic)
	binary.LittleEndian.PutUint16(b[4:], op)
	binary.LittleEndian.PutUint16(b[6:], flags)
	binary.LittleEndian.PutUint64(b[8:], uint64(seq))
	binary.LittleEndian.PutUint64(b[16:], uint64(off))
	binary.LittleEndian.PutUint64(b[24:], uint64(n))
	return b
}

type bellReply struct {
	seq  int64
	code codes.Code
	msg  string
}

// readBellReply reads one reply frame.
func readBellReply(t *testing.T, c net.Conn) (bellReply, error) {
	t.Helper()
	h := make([]byte, bellReplyLen)
	if _, err := io.ReadFull(c, h); err != nil {
		return bellReply{}, err
	}
	if binary.LittleEndian.Uint32(h) != bellMagic {
		t.Fatalf("reply magic %x", h[:4])
	}
	msg := make([]byte, binary.LittleEndian.Uint32(h[16:]))
	if _, err := io.ReadFull(c, msg); err != nil {
		return bellReply{}, err
	}
	return bellReply{seq: int64(binary.LittleEndian.Uint64(h[8:])), code: codes.Code(binary.LittleEndian.Uint32(h[4:])), msg: string(msg)}, nil
}

// dialBell connects to rank r's bell.
func (w *world) dialBell(t *testing.T, r int) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", filepath.Join(filepath.Dir(w.sockets[r].Path), BellName))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	return c
}

// sharedWorld registers a shared region of size values on every rank of
// w and returns each rank's view of it.
func sharedWorld(t *testing.T, w *world, n, size int) [][]float32 {
	t.Helper()
	ctx := ctxT(t)
	layout := []*pb.TensorInfo{{Name: "w", Shape: []int64{int64(size)}, Dtype: "float32"}}
	paths := make([]string, n)
	for r, err := range onAll(n, func(r int) error {
		res, err := w.clients[r].RegisterLayout(ctx, &pb.RegisterLayoutRequest{Seq: 0, Tensors: layout, SharedMemory: true})
		if err == nil {
			paths[r] = res.ShmPath
		}
		return err
	}) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	views := make([][]float32, n)
	for r := range n {
		views[r] = mapShared(t, paths[r], size)
	}
	return views
}

// TestBellAllReduce: buckets of the shared region reduced through the
// bell equal the serial sums (and means) on every rank, with the bell's
// requests and gRPC calls in one sequence of numbers, several in flight
// and sent out of order; the replies name their numbers.
func TestBellAllReduce(t *testing.T) {
	const n, size = 3, 11
	w := newWorld(t, n, time.Minute)
	views := sharedWorld(t, w, n, size)
	for r := range n {
		for i := range views[r] {
			views[r][i] = float32(r+1) * float32(i+1)
		}
	}
	ctx := ctxT(t)
	for r, err := range onAll(n, func(r int) error {
		c := w.dialBell(t, r)
		// 3 first (a barrier must come at 2), then 1: [0, 5) summed, [5, 11) averaged.
		if _, err := c.Write(append(bellReq(bellOpAllReduce, bellFlagAverage, 3, 5, 6), bellReq(bellOpAllReduce, 0, 1, 0, 5)...)); err != nil {
			return err
		}
		got := map[int64]bellReply{}
		rep, err := readBellReply(t, c)
		if err != nil {
			return err
		}
		got[rep.seq] = rep
		if _, err := w.clients[r].Barrier(ctx, &pb.BarrierRequest{Seq: 2}); err != nil {
			return err
		}
		if rep, err = readBellReply(t, c); err != nil {
			return err
		}
		got[rep.seq] = rep
		for _, seq := range []int64{1, 3} {
			if got[seq].code != codes.OK || got[seq].msg != "" {
				t.Errorf("rank %d: reply %d: %+v", r, seq, got[seq])
			}
		}
		return nil
	}) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r := range n {
		for i, v := range views[r] {
			want := float32(6 * (i + 1)) // 1+2+3 times i+1
			if i >= 5 {
				want /= n
			}
			if v != want {
				t.Fatalf("rank %d: value %d = %v, want %v", r, i, v, want)
			}
		}
	}
}

// TestBellErrors: a range outside the region is answered under its
// number with InvalidArgument; a malformed frame gets InvalidArgument
// under −1 and the connection is closed; a request with no region is
// FailedPrecondition.
func TestBellErrors(t *testing.T) {
	w := newWorld(t, 1, time.Minute)
	c := w.dialBell(t, 0)
	if _, err := c.Write(bellReq(bellOpAllReduce, 0, 0, 0, 4)); err != nil {
		t.Fatal(err)
	}
	if rep, err := readBellReply(t, c); err != nil || rep.seq != 0 || rep.code != codes.FailedPrecondition {
		t.Fatalf("no region: %+v %v, want FailedPrecondition for 0", rep, err)
	}

	w = newWorld(t, 1, time.Minute)
	sharedWorld(t, w, 1, 4)
	c = w.dialBell(t, 0)
	if _, err := c.Write(bellReq(bellOpAllReduce, 0, 1, 2, 3)); err != nil {
		t.Fatal(err)
	}
	if rep, err := readBellReply(t, c); err != nil || rep.seq != 1 || rep.code != codes.InvalidArgument || !bytes.Contains([]byte(rep.msg), []byte("outside the shared region")) {
		t.Fatalf("range outside: %+v %v", rep, err)
	}
	for _, bad := range [][]byte{
		bellReq(7, 0, 2, 0, 1),               // unknown op
		bellReq(bellOpAllReduce, 2, 2, 0, 1), // unknown flag
		bellReq(bellOpAllReduce, 0, -4, 0, 1),
		append([]byte("GSB2"), make([]byte, bellRequestLen-4)...),
	} {
		c := w.dialBell(t, 0)
		if _, err := c.Write(bad); err != nil {
			t.Fatal(err)
		}
		if rep, err := readBellReply(t, c); err != nil || rep.seq != -1 || rep.code != codes.InvalidArgument {
			t.Fatalf("frame %x: %+v %v, want InvalidArgument for -1", bad, rep, err)
		}
		if _, err := readBellReply(t, c); !errors.Is(err, io.EOF) {
			t.Fatalf("frame %x: after the reply %v, want the connection closed", bad, err)
		}
	}
}

// TestBellCloseCancels: a connection closed with a request waiting for
// its turn cancels it, as a script's exit cancels its gRPC calls: the
// connection's server returns once it has ended, without taking the
// number (goleak checks that nothing is left).
func TestBellCloseCancels(t *testing.T) {
	w := newWorld(t, 1, time.Hour)
	sharedWorld(t, w, 1, 4)
	a, z := net.Pipe()
	done := make(chan struct{})
	go func() { // owned by the test: the connection's server
		defer close(done)
		w.servers[0].serveBell(context.Background(), z, slog.New(slog.DiscardHandler))
	}()
	// Number 2 waits for 1, which never comes.
	if _, err := a.Write(bellReq(bellOpAllReduce, 0, 2, 0, 4)); err != nil {
		t.Fatal(err)
	}
	a.Close()
	ctx := ctxT(t)
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the bell's connection server still waits: its request was not cancelled when the connection closed")
	}
	// 1 and then 2 through gRPC: 2 is free (the bell's was cancelled
	// before it ran).
	if _, err := w.clients[0].Barrier(ctx, &pb.BarrierRequest{Seq: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.clients[0].Barrier(ctx, &pb.BarrierRequest{Seq: 2}); err != nil {
		t.Fatalf("number 2 after the bell's was cancelled: %v", err)
	}
}

// TestBellSocketMode: the bell is a 0600 socket beside the agent's.
func TestBellSocketMode(t *testing.T) {
	k, err := Listen(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	fi, err := os.Stat(filepath.Join(k.dir, BellName))
	if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("bell %v %v, want a socket of mode 0600", fi, err)
	}
}

// FuzzBell feeds arbitrary bytes to a bell connection (world size 1, a
// shared region of 8 values): every well-formed request is answered,
// a malformed one ends the connection with an answer; never a panic or
// a hang.
func FuzzBell(f *testing.F) {
	f.Add(bellReq(bellOpAllReduce, 1, 0, 0, 8))
	f.Add(append(bellReq(bellOpAllReduce, 0, 0, 2, 3), bellReq(bellOpAllReduce, 1, 1, 0, 1)...))
	f.Add([]byte("GSB1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ring := aggregator.NewMemRing(1, 0)[0]
		defer ring.(*aggregator.MemRing).Close()
		s, err := New(Config{Ring: ring, StepTimeout: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		reg, err := newRegion(8)
		if err != nil {
			t.Fatal(err)
		}
		s.shm = reg
		a, z := net.Pipe()
		done := make(chan struct{})
		go func() { // owned by the fuzz case: the server side
			defer close(done)
			s.serveBell(context.Background(), z, slog.New(slog.DiscardHandler))
		}()
		go func() { // owned by the fuzz case: drains the replies until the server closes
			_, _ = io.Copy(io.Discard, a)
		}()
		_ = a.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_, _ = a.Write(b)
		a.Close()
		<-done
	})
}
