package agent

import (
	"context"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/compress"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// world is n agents over an in-memory ring, each served on its own socket,
// with a client for each.
type world struct {
	servers []*Server
	clients []pb.AgentClient
	sockets []*Socket
	reports chan *pb.ReportRequest
}

func newWorld(t *testing.T, n int, timeout time.Duration) *world {
	t.Helper()
	return newWorldWith(t, n, timeout, compress.Scheme{})
}

// newWorldWith is newWorld with the job's compression sc.
func newWorldWith(t *testing.T, n int, timeout time.Duration, sc compress.Scheme) *world {
	t.Helper()
	rings := aggregator.NewMemRing(n, 4)
	cfgs := make([]Config, n)
	for r := range n {
		cfgs[r] = Config{Ring: rings[r], StepTimeout: timeout, Compression: sc}
	}
	return newWorldOf(t, cfgs, func() {
		for _, r := range rings {
			r.(*aggregator.MemRing).Close()
		}
	})
}

// newWorldOf is the world of agents made from cfgs (one per rank, the
// job's settings filled in here); closeAll ends their collectives once
// the agents have stopped serving.
func newWorldOf(t *testing.T, cfgs []Config, closeAll func()) *world {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	w := &world{reports: make(chan *pb.ReportRequest, 16)}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		closeAll()
	})
	for _, cfg := range cfgs {
		cfg.JobID, cfg.Generation = "job-1", 3
		cfg.Report = func(m *pb.ReportRequest) { w.reports <- m }
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		k, err := Listen(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { // owned by the test: stopped by cancel in Cleanup
			defer wg.Done()
			if err := k.Serve(ctx, s, nil); err != nil {
				t.Error(err)
			}
		}()
		conn, err := grpc.NewClient("unix://"+k.Path, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		w.servers, w.sockets = append(w.servers, s), append(w.sockets, k)
		w.clients = append(w.clients, pb.NewAgentClient(conn))
	}
	return w
}

// onAll runs fn for every rank concurrently and returns their errors.
func onAll(n int, fn func(rank int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = fn(r)
		}()
	}
	wg.Wait()
	return errs
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestAllReduceSumsAndAverages: rank-valued inputs whose exact sum is
// known, over world sizes and lengths around them; every rank gets the
// same bytes.
func TestAllReduceSumsAndAverages(t *testing.T) { forEachMode(t, testAllReduceSumsAndAverages) }

func testAllReduceSumsAndAverages(t *testing.T, newWorld func(*testing.T, int, time.Duration) *world) {
	for _, n := range []int{1, 2, 3} {
		w := newWorld(t, n, time.Minute)
		ctx := ctxT(t)
		seq := int64(0)
		for _, length := range []int{1, n - 1, n, n + 1, 1000} {
			if length == 0 {
				continue
			}
			for _, avg := range []bool{false, true} {
				out := make([][]float32, n)
				errs := onAll(n, func(r int) error {
					in := make([]float32, length)
					for i := range in {
						in[i] = float32(r + 1 + i)
					}
					res, err := w.clients[r].AllReduce(ctx, &pb.AllReduceRequest{Seq: seq, Data: encode(in), Average: avg})
					if err != nil {
						return err
					}
					out[r], err = decode(res.Data)
					return err
				})
				for r, err := range errs {
					if err != nil {
						t.Fatalf("n=%d len=%d rank %d: %v", n, length, r, err)
					}
				}
				for i := range length {
					want := float32(n*(n+1)/2 + n*i)
					if avg {
						want /= float32(n)
					}
					for r := range n {
						if out[r][i] != want {
							t.Fatalf("n=%d len=%d avg=%v rank %d [%d] = %v, want %v", n, length, avg, r, i, out[r][i], want)
						}
					}
				}
				seq++
			}
		}
	}
}

// TestCollectivesRunInSequenceOrder: one rank sends collective 1 before
// collective 0 (as a script with buckets in flight may); the agent runs
// them in number order, so the results are those of the calls by number.
func TestCollectivesRunInSequenceOrder(t *testing.T) {
	forEachMode(t, testCollectivesRunInSequenceOrder)
}

func testCollectivesRunInSequenceOrder(t *testing.T, newWorld func(*testing.T, int, time.Duration) *world) {
	const n = 2
	w := newWorld(t, n, time.Minute)
	ctx := ctxT(t)
	results := make([][2][]float32, n)
	errs := onAll(n, func(r int) error {
		var wg sync.WaitGroup
		var errs [2]error
		call := func(seq int64) {
			defer wg.Done()
			in := []float32{float32(10*seq + int64(r))}
			res, err := w.clients[r].AllReduce(ctx, &pb.AllReduceRequest{Seq: seq, Data: encode(in)})
			if err == nil {
				results[r][seq], err = decode(res.Data)
			}
			errs[seq] = err
		}
		wg.Add(1)
		if r == 0 {
			go call(1) // seq 1 first: it must wait for seq 0
			wg.Add(1)
			call(0)
		} else {
			call(0)
			wg.Add(1)
			call(1)
		}
		wg.Wait()
		if errs[0] != nil {
			return errs[0]
		}
		return errs[1]
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r := range n {
		if results[r][0][0] != 1 || results[r][1][0] != 21 {
			t.Fatalf("rank %d: results %v, want [1] and [21]", r, results[r])
		}
	}
}

func TestBroadcastAndBarrier(t *testing.T) { forEachMode(t, testBroadcastAndBarrier) }

func testBroadcastAndBarrier(t *testing.T, newWorld func(*testing.T, int, time.Duration) *world) {
	const n = 3
	w := newWorld(t, n, time.Minute)
	ctx := ctxT(t)
	out := make([][]float32, n)
	errs := onAll(n, func(r int) error {
		in := []float32{float32(r), float32(r * 2), 7}
		res, err := w.clients[r].Broadcast(ctx, &pb.BroadcastRequest{Seq: 0, Root: 1, Data: encode(in)})
		if err != nil {
			return err
		}
		if out[r], err = decode(res.Data); err != nil {
			return err
		}
		_, err = w.clients[r].Barrier(ctx, &pb.BarrierRequest{Seq: 1})
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		if out[r][0] != 1 || out[r][1] != 2 || out[r][2] != 7 {
			t.Fatalf("rank %d got %v, want root 1's [1 2 7]", r, out[r])
		}
	}
}

func TestRegisterLayout(t *testing.T) { forEachMode(t, testRegisterLayout) }

func testRegisterLayout(t *testing.T, newWorld func(*testing.T, int, time.Duration) *world) {
	const n = 2
	w := newWorld(t, n, time.Minute)
	ctx := ctxT(t)
	layout := func(out int64) []*pb.TensorInfo {
		return []*pb.TensorInfo{{Name: "fc.weight", Shape: []int64{out, 4}, Dtype: "float32"}, {Name: "fc.bias", Shape: []int64{out}, Dtype: "float32"}}
	}
	sizes := make([]int64, n)
	errs := onAll(n, func(r int) error {
		res, err := w.clients[r].RegisterLayout(ctx, &pb.RegisterLayoutRequest{Seq: 0, Tensors: layout(3)})
		if err == nil {
			sizes[r] = res.NumElements
		}
		return err
	})
	for r, err := range errs {
		if err != nil || sizes[r] != 15 {
			t.Fatalf("rank %d: %d elements, %v; want 15", r, sizes[r], err)
		}
	}
	// A rank with another model: every rank is told.
	errs = onAll(n, func(r int) error {
		_, err := w.clients[r].RegisterLayout(ctx, &pb.RegisterLayoutRequest{Seq: 1, Tensors: layout(int64(3 + r))})
		return err
	})
	for r, err := range errs {
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("rank %d: %v, want FailedPrecondition", r, err)
		}
	}
}

// TestBadRequests: every malformed request gets an error with the right
// code, and the agent goes on serving.
func TestBadRequests(t *testing.T) {
	w := newWorld(t, 1, time.Minute)
	ctx := ctxT(t)
	c := w.clients[0]
	check := func(name string, err error, want codes.Code) {
		t.Helper()
		if status.Code(err) != want {
			t.Errorf("%s: %v, want %v", name, err, want)
		}
	}
	_, err := c.AllReduce(ctx, &pb.AllReduceRequest{Seq: 0, Data: []byte{1, 2, 3}})
	check("odd bytes", err, codes.InvalidArgument)
	_, err = c.AllReduce(ctx, &pb.AllReduceRequest{Seq: 0, Data: make([]byte, 4*(MaxElements+1))})
	check("too large", err, codes.ResourceExhausted)
	_, err = c.Broadcast(ctx, &pb.BroadcastRequest{Seq: 0, Root: 1, Data: encode([]float32{1})})
	check("root", err, codes.InvalidArgument)
	_, err = c.RegisterLayout(ctx, &pb.RegisterLayoutRequest{Seq: 0})
	check("empty layout", err, codes.InvalidArgument)
	_, err = c.RegisterLayout(ctx, &pb.RegisterLayoutRequest{Seq: 0, Tensors: []*pb.TensorInfo{{Name: "w", Shape: []int64{2}, Dtype: "float16"}}})
	check("dtype", err, codes.InvalidArgument)
	_, err = c.RegisterLayout(ctx, &pb.RegisterLayoutRequest{Seq: 0, Tensors: []*pb.TensorInfo{{Name: "w", Shape: []int64{-2}, Dtype: "float32"}}})
	check("shape", err, codes.InvalidArgument)
	_, err = c.Report(ctx, &pb.ReportRequest{TestAccuracy: 1.5})
	check("accuracy", err, codes.InvalidArgument)
	if _, err := c.Barrier(ctx, &pb.BarrierRequest{Seq: 0}); err != nil {
		t.Fatalf("the agent stopped serving after bad requests: %v", err)
	}
	_, err = c.Barrier(ctx, &pb.BarrierRequest{Seq: 0})
	check("a number used twice", err, codes.FailedPrecondition)
	if _, err := c.Report(ctx, &pb.ReportRequest{Step: 3, Loss: 0.5, Final: true, TestAccuracy: 0.9}); err != nil {
		t.Fatal(err)
	}
	if m := <-w.reports; m.Step != 3 || !m.Final {
		t.Fatalf("report %v", m)
	}
	info, err := c.Init(ctx, &pb.AgentInitRequest{})
	if err != nil || info.Rank != 0 || info.WorldSize != 1 || info.JobId != "job-1" || info.MaxElements != MaxElements {
		t.Fatalf("init: %v %v", info, err)
	}
}

// TestMissingCallTimesOut: a collective whose predecessor never comes
// fails by the step timeout instead of hanging.
func TestMissingCallTimesOut(t *testing.T) {
	w := newWorld(t, 1, 50*time.Millisecond)
	_, err := w.clients[0].Barrier(ctxT(t), &pb.BarrierRequest{Seq: 1})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("%v, want DeadlineExceeded", err)
	}
}

// TestPeerGoneBreaksTheAgent: a neighbour that leaves fails the
// collective with Unavailable, and every later one with the same error.
func TestPeerGoneBreaksTheAgent(t *testing.T) {
	w := newWorld(t, 2, time.Minute)
	ctx := ctxT(t)
	w.servers[1].cfg.Ring.(*aggregator.MemRing).Close()
	_, err := w.clients[0].AllReduce(ctx, &pb.AllReduceRequest{Seq: 0, Data: encode(make([]float32, 100))})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("%v, want Unavailable", err)
	}
	if w.servers[0].Err() == nil {
		t.Fatal("Err() is nil after a failed collective")
	}
	_, err2 := w.clients[0].Barrier(ctx, &pb.BarrierRequest{Seq: 1})
	if status.Code(err2) != codes.Unavailable {
		t.Fatalf("after the failure: %v, want the same Unavailable", err2)
	}
}

func TestSocketMode(t *testing.T) {
	k, err := Listen(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	fi, err := os.Stat(k.Path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want a socket of mode 0600", fi.Mode())
	}
	di, err := os.Stat(k.dir)
	if err != nil || di.Mode().Perm() != 0o700 {
		t.Fatalf("directory mode %v (%v), want 0700", di.Mode(), err)
	}
}

// TestAverage: a power-of-two world multiplies by 1/n and must equal the
// division bit for bit; any other divides.
func TestAverage(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 3, 4, 5, 8, 64} {
		buf := make([]float32, 1001)
		for i := range buf {
			buf[i] = float32(rng.NormFloat64()) * float32(math.Pow(10, float64(rng.IntN(60)-30)))
		}
		buf[0], buf[1] = math.Float32frombits(1), math.MaxFloat32 // a subnormal, the largest
		want := make([]float32, len(buf))
		for i, v := range buf {
			want[i] = v / float32(n)
		}
		average(buf, n)
		for i := range buf {
			if math.Float32bits(buf[i]) != math.Float32bits(want[i]) {
				t.Fatalf("n %d: element %d is %v, want %v", n, i, buf[i], want[i])
			}
		}
	}
}
