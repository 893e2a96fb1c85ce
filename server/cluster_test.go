package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
	"github.com/gradsync/gradsync/server"
	"github.com/gradsync/gradsync/worker"
)

// testLogger discards logs unless GRADSYNC_TEST_LOGS is set.
func testLogger() *slog.Logger {
	if os.Getenv("GRADSYNC_TEST_LOGS") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// cluster is an in-process coordinator on a bufconn listener plus in-process
// workers that reach it through the same in-memory dialer. The server can be
// stopped and started again on the same data directory; workers follow it.
type cluster struct {
	t   *testing.T
	cfg server.Config

	mu  sync.Mutex // guards lis
	lis *bufconn.Listener

	srv       *server.Server
	srvCancel context.CancelFunc
	srvDone   chan error

	conn    *grpc.ClientConn
	jobs    pb.JobServiceClient
	cl      pb.ClusterServiceClient
	ps      pb.ParameterServerClient
	coord   pb.CoordinatorClient
	workers []*testWorker
	// stepDelay makes the workers started with these ids slow (worker
	// Config.DebugStepDelay).
	stepDelay map[string]time.Duration
	// entrypoints: the workers started with these ids run entrypoint
	// commands (--allow-entrypoints), their output under the runs dir.
	entrypoints map[string]bool
}

type testWorker struct {
	id     string
	cancel context.CancelFunc
	done   chan struct{}
}

// newCluster starts a server with cfg (DataDir, RunsDir and Logger filled
// in when empty) and n workers named w0..w(n-1). Everything is stopped at
// the end of the test.
func newCluster(t *testing.T, cfg server.Config, n int) *cluster {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	if cfg.RunsDir == "" {
		cfg.RunsDir = t.TempDir()
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	if cfg.TLS == nil {
		cfg.Insecure = true // bufconn in one process: plaintext on purpose
	}
	if cfg.APIRate == 0 {
		cfg.APIRate = -1 // tests poll fast; TestAPIRateLimit sets its own
	}
	c := &cluster{t: t, cfg: cfg}
	c.startServer()
	conn, err := grpc.NewClient("passthrough:///bufnet", c.dialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	c.conn = conn
	c.jobs = pb.NewJobServiceClient(conn)
	c.cl = pb.NewClusterServiceClient(conn)
	c.ps = pb.NewParameterServerClient(conn)
	c.coord = pb.NewCoordinatorClient(conn)
	t.Cleanup(func() {
		c.stopWorkers()
		c.stopServer()
		conn.Close()
	})
	for i := range n {
		c.addWorker(fmt.Sprintf("w%d", i))
	}
	return c
}

func (c *cluster) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			c.mu.Lock()
			lis := c.lis
			c.mu.Unlock()
			return lis.DialContext(ctx)
		}),
	}
}

// startServer starts a server on a fresh bufconn listener.
func (c *cluster) startServer() {
	c.t.Helper()
	srv, err := server.New(c.cfg)
	if err != nil {
		c.t.Fatalf("server.New: %v", err)
	}
	lis := bufconn.Listen(1 << 20)
	c.mu.Lock()
	c.lis = lis
	c.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	c.srv, c.srvCancel, c.srvDone = srv, cancel, make(chan error, 1)
	go func() { c.srvDone <- srv.Serve(ctx, lis) }() // owned by the cluster: stopServer waits for it
}

// stopServeTimeout bounds a graceful stop in tests: generous, because
// under -race on a loaded 2-core machine a stop that writes checkpoints and
// redraws charts takes seconds; a hang still fails.
const stopServeTimeout = 60 * time.Second

// stopServer stops the server gracefully and waits until Serve returns.
func (c *cluster) stopServer() {
	if c.srvCancel == nil {
		return
	}
	c.srvCancel()
	c.srvCancel = nil
	t := time.NewTimer(stopServeTimeout)
	defer t.Stop()
	select {
	case err := <-c.srvDone:
		if err != nil {
			c.t.Errorf("Serve: %v", err)
		}
	case <-t.C:
		c.t.Fatalf("server did not stop within %v", stopServeTimeout)
	}
}

// addWorker starts an in-process worker with a stable id.
func (c *cluster) addWorker(id string) *testWorker {
	c.t.Helper()
	return c.startWorker(id, bufconn.Listen(1<<16), id+".bufconn:1")
}

// addTCPWorker starts an in-process worker whose peer endpoint listens on
// 127.0.0.1 (ring mode dials peers by address), still reaching the server
// over bufconn.
func (c *cluster) addTCPWorker(id string) *testWorker {
	c.t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	return c.startWorker(id, lis, lis.Addr().String())
}

func (c *cluster) startWorker(id string, lis net.Listener, advertise string) *testWorker {
	c.t.Helper()
	w, err := worker.New(worker.Config{
		Server: "passthrough:///bufnet", ID: id, Name: id, Logger: c.cfg.Logger,
		Listener: lis, AdvertiseAddr: advertise,
		DialOptions: c.dialOptions(), MaxBackoff: 200 * time.Millisecond, Insecure: true,
		DebugStepDelay: c.stepDelay[id], AllowEntrypoints: c.entrypoints[id], RunsDir: c.cfg.RunsDir,
	})
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tw := &testWorker{id: id, cancel: cancel, done: make(chan struct{})}
	go func() { // owned by the cluster: stop waits for it
		defer close(tw.done)
		if err := w.Run(ctx); err != nil {
			c.t.Errorf("worker %s: %v", id, err)
		}
	}()
	c.workers = append(c.workers, tw)
	return tw
}

// stop cancels the worker (as if its process died: its streams break) and
// waits for it to return.
func (w *testWorker) stop(t *testing.T) {
	w.cancel()
	tm := time.NewTimer(stopServeTimeout)
	defer tm.Stop()
	select {
	case <-w.done:
	case <-tm.C:
		t.Fatalf("worker %s did not stop within %v", w.id, stopServeTimeout)
	}
}

func (c *cluster) stopWorkers() {
	for _, w := range c.workers {
		w.stop(c.t)
	}
}

// testCtx is the test's context with a deadline.
func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitWorkers waits until ListWorkers shows every id in the given state.
// It waits on the server's registry changes (WorkersChanged), never on
// the clock: the deadline is ctx's.
func (c *cluster) waitWorkers(ctx context.Context, state pb.WorkerState, ids ...string) {
	c.t.Helper()
	for {
		changed := c.srv.WorkersChanged() // before reading: no change is missed
		resp, err := c.cl.ListWorkers(ctx, &pb.ListWorkersRequest{})
		if err != nil {
			c.t.Fatalf("ListWorkers while waiting for workers %v %v: %v", ids, state, err)
		}
		n := 0
		for _, w := range resp.Workers {
			if slices.Contains(ids, w.Id) && w.State == state {
				if state == pb.WorkerState_WORKER_STATE_IDLE && w.JobId != "" {
					c.t.Fatalf("worker %s idle with job %s", w.Id, w.JobId)
				}
				n++
			}
		}
		if n == len(ids) {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			c.t.Fatalf("timed out waiting for workers %v %v (workers: %v)", ids, state, resp.Workers)
		}
	}
}

// submit submits a spec and fails the test on error.
func (c *cluster) submit(ctx context.Context, spec *pb.JobSpec) *pb.Job {
	c.t.Helper()
	resp, err := c.jobs.SubmitJob(ctx, &pb.SubmitJobRequest{Spec: spec})
	if err != nil {
		c.t.Fatalf("SubmitJob: %v", err)
	}
	return resp.Job
}

// waitState follows the job's events until its state is one of states and
// returns that snapshot. A final state that is not wanted fails the test.
func (c *cluster) waitState(ctx context.Context, id string, states ...pb.JobState) *pb.Job {
	c.t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.jobs.WatchJob(ctx, &pb.WatchJobRequest{JobId: id})
	if err != nil {
		c.t.Fatalf("WatchJob: %v", err)
	}
	var last *pb.Job
	for {
		ev, err := stream.Recv()
		if err != nil {
			c.t.Fatalf("job %s: waiting for %v: %v (last seen: %v %q)", id, states, err, last.GetState(), last.GetMessage())
		}
		last = ev.GetJob()
		if slices.Contains(states, last.GetState()) {
			return last
		}
	}
}

// watchAll collects every event of a job until the stream ends.
func (c *cluster) watchAll(ctx context.Context, id string) []*pb.WatchJobResponse {
	c.t.Helper()
	stream, err := c.jobs.WatchJob(ctx, &pb.WatchJobRequest{JobId: id})
	if err != nil {
		c.t.Fatalf("WatchJob: %v", err)
	}
	var evs []*pb.WatchJobResponse
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return evs
		}
		if err != nil {
			c.t.Fatalf("WatchJob %s: %v after %d events", id, err, len(evs))
		}
		evs = append(evs, ev)
	}
}

// wantCode fails unless err is a gRPC status with code and a message
// containing every one of substrs.
func wantCode(t *testing.T, what string, err error, code codes.Code, substrs ...string) {
	t.Helper()
	st, _ := status.FromError(err)
	if err == nil || st.Code() != code {
		t.Errorf("%s: err = %v; want code %v", what, err, code)
		return
	}
	for _, s := range substrs {
		if !containsFold(st.Message(), s) {
			t.Errorf("%s: message %q does not mention %q", what, st.Message(), s)
		}
	}
}

func containsFold(s, sub string) bool {
	return strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}

// Specs used by the tests.

// quickSpec trains logreg on a small synthetic set to high accuracy in
// about a second.
func quickSpec(workers int32) *pb.JobSpec {
	return &pb.JobSpec{
		Model: "logreg", Workers: proto.Int32(workers), Epochs: proto.Int32(2), LogEverySteps: 5,
		Dataset: &pb.DatasetSpec{Name: "synthetic", SyntheticTrain: 2000, SyntheticTest: 500},
	}
}

// longSpec runs until cancelled or failed (thousands of epochs).
func longSpec(workers int32) *pb.JobSpec {
	return &pb.JobSpec{
		Model: "logreg", Workers: proto.Int32(workers), Epochs: proto.Int32(10000), LogEverySteps: 2,
		Dataset: &pb.DatasetSpec{Name: "synthetic", SyntheticTrain: 500, SyntheticTest: 100},
	}
}

// fakeWorker is a worker that speaks the Coordinator protocol by hand and
// never trains: tests use it to hold a job RUNNING with an idle parameter
// server, and to go silent without breaking its stream.
type fakeWorker struct {
	id     string
	stream pb.Coordinator_ConnectClient
	cancel context.CancelFunc
	msgs   chan *pb.ConnectResponse
	done   chan struct{}
}

// connectFake connects a fake worker with id; heartbeats says whether it
// sends heartbeats (every 100ms) until stopped.
func (c *cluster) connectFake(ctx context.Context, id string, heartbeats bool) *fakeWorker {
	c.t.Helper()
	sctx, cancel := context.WithCancel(context.Background())
	stream, err := c.coord.Connect(sctx)
	if err != nil {
		cancel()
		c.t.Fatal(err)
	}
	f := &fakeWorker{id: id, stream: stream, cancel: cancel, msgs: make(chan *pb.ConnectResponse, 64), done: make(chan struct{})}
	c.t.Cleanup(f.stop)
	if err := stream.Send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Hello{Hello: &pb.Hello{WorkerId: id, Address: id + ".fake:1"}}}); err != nil {
		c.t.Fatal(err)
	}
	// stops carries the tasks the coordinator cancelled to the sender,
	// which says they stopped as a real worker does (only a fake that
	// sends heartbeats: a silent one says nothing).
	stops := make(chan *pb.TaskDone, 64)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // owned by f: ends when the stream does
		defer wg.Done()
		defer close(f.msgs)
		gens := map[string]*pb.Assignment{}
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			if a := m.GetAssignment(); a != nil {
				gens[a.JobId] = a
			}
			if cn := m.GetCancel(); cn != nil && gens[cn.JobId] != nil {
				a := gens[cn.JobId]
				select {
				case stops <- &pb.TaskDone{JobId: a.JobId, Rank: a.Rank, Generation: a.Generation, Error: "stopped: " + cn.Reason}:
				default:
				}
			}
			select {
			case f.msgs <- m:
			case <-sctx.Done():
				return
			}
		}
	}()
	if heartbeats {
		wg.Add(1)
		go func() { // owned by f: the only sender after the hello
			defer wg.Done()
			tk := time.NewTicker(100 * time.Millisecond)
			defer tk.Stop()
			for {
				select {
				case <-sctx.Done():
					return
				case <-tk.C:
					if stream.Send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Heartbeat{Heartbeat: &pb.Heartbeat{}}}) != nil {
						return
					}
				case d := <-stops:
					if stream.Send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Done{Done: d}}) != nil {
						return
					}
				}
			}
		}()
	}
	go func() { wg.Wait(); close(f.done) }() // owned by f
	if m := f.next(ctx, c.t); m.GetWelcome().GetWorkerId() != id {
		c.t.Fatalf("fake worker %s: first message %v, want a welcome", id, m)
	}
	return f
}

// next returns the next message the coordinator sent.
func (f *fakeWorker) next(ctx context.Context, t *testing.T) *pb.ConnectResponse {
	t.Helper()
	select {
	case m, ok := <-f.msgs:
		if !ok {
			t.Fatalf("fake worker %s: stream ended", f.id)
		}
		return m
	case <-ctx.Done():
		t.Fatalf("fake worker %s: no message: %v", f.id, ctx.Err())
	}
	return nil
}

func (f *fakeWorker) stop() {
	f.cancel()
	<-f.done
}

// testCtxWithin is a child of ctx that ends after d.
func testCtxWithin(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d)
}
