package worker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/aggregator/ringrpc"
	"github.com/gradsync/gradsync/internal/gpu"
	"github.com/gradsync/gradsync/internal/kernels"
	"github.com/gradsync/gradsync/internal/metrics"
	"github.com/gradsync/gradsync/internal/netem"
	"github.com/gradsync/gradsync/internal/rpc"
	"github.com/gradsync/gradsync/internal/security"
	"github.com/gradsync/gradsync/internal/trace"
	"github.com/gradsync/gradsync/pipeline/peerrpc"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Version is reported in the worker's hello.
const Version = "0.1.0"

// Config configures a worker. Server is required; the rest has defaults.
type Config struct {
	// Server is the coordinator's address (host:port).
	Server string
	// ListenAddr is where the peer Collective endpoint listens.
	// Default "127.0.0.1:0" (any free port on loopback).
	ListenAddr string
	// Listener, if set, is used instead of listening on ListenAddr.
	Listener net.Listener
	// AdvertiseAddr is the address peers use to reach this worker; default
	// the listener's address.
	AdvertiseAddr string
	// ID is a stable worker id (kept across reconnects); default: one the
	// coordinator assigns.
	ID string
	// Name is a human-readable name; default the host name and port.
	Name string
	// Logger; default slog.Default().
	Logger *slog.Logger
	// TLS is used to reach the coordinator and parameter servers (a
	// worker certificate and the CA); PeerServerTLS and PeerClientTLS
	// secure the peer endpoint, which requires a worker certificate. All
	// nil means plaintext, which must be asked for with Insecure.
	TLS, PeerServerTLS, PeerClientTLS *tls.Config
	// Insecure allows plaintext. It is logged loudly.
	Insecure bool
	// DialOptions are extra options for connections to the coordinator
	// and parameter servers (a bufconn dialer in tests).
	DialOptions []grpc.DialOption
	// Metrics, if set, receives the worker's Prometheus metrics (step
	// time, images/s, bytes per peer, collective latency).
	Metrics *metrics.Registry
	// MaxBackoff caps the wait between reconnect attempts. Default 5s.
	MaxBackoff time.Duration
	// Link, if limited, shapes this worker's connections (to the
	// coordinator, parameter servers and ring peers) to an emulated link
	// of that rate each way, for experiments on slow networks.
	Link netem.Link
	// DebugStepDelay is fault injection: every training step waits this
	// long before its forward pass, making this a slow worker (a
	// straggler). 0, the default, for real use.
	DebugStepDelay time.Duration
	// DataDir, if set, is where this worker finds the IDX files of the
	// data set a job names (mnist, fashion-mnist): it overrides the spec's
	// dataset.data_dir for this worker's tasks. A real federated client
	// (fedavg on several workers) trains on its own data this way; ps and
	// ring jobs need the same data set on every worker.
	DataDir string
	// Threads is how many goroutines run each training step of a ps or
	// ring task, each on a slice of the batch (models.SetThreads); 0
	// means 1. Results are deterministic for a given count but change
	// with it.
	Threads int
	// TracePath, if set, makes each ring task record its timeline —
	// forward and backward per layer, each gradient bucket's readiness
	// and all-reduce, the optimiser step — and write it as a Chrome trace
	// (chrome://tracing, Perfetto) to TracePath with "-rankR" (and "-gN"
	// for generations after the first) before its extension; the job
	// result then carries rank 0's compute/communication overlap.
	TracePath string
	// AllowEntrypoints lets jobs run their entrypoint command (a user's
	// script) on this worker, as the worker's user (--allow-entrypoints).
	// Off, such assignments are refused, and the coordinator does not
	// place entrypoint jobs here.
	AllowEntrypoints bool
	// RunsDir is where an entrypoint command's output goes:
	// <RunsDir>/<job-id>/rank-<r>.log. Default "runs".
	RunsDir string
	// Algorithm overrides the collective.algorithm of the ring jobs this
	// worker trains (cmd/gradsync reads it from GRADSYNC_ALGO): one of
	// aggregator.AlgorithmNames, or "" to follow the spec. Training runs
	// the ring whatever it says (see ringAlgorithm); the worker logs what
	// was asked, what runs, and why.
	Algorithm string
	// MemoryLimit caps the memory, in bytes, this worker offers to a
	// task (--memory-limit); 0: no cap. The worker offers the least of
	// it, its host's memory and its cgroup's limit (offeredMemory); the
	// coordinator places a rank here only if what it holds fits.
	MemoryLimit uint64
}

// Validate fills defaults and checks the config.
func (c *Config) Validate() error {
	if c.Server == "" {
		return errors.New("worker: the coordinator address (--server) is required")
	}
	if c.ListenAddr == "" {
		c.ListenAddr = "127.0.0.1:0"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.RunsDir == "" {
		c.RunsDir = "runs"
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 5 * time.Second
	}
	if c.Threads < 0 {
		return fmt.Errorf("worker: Threads %d is negative; want 0 (one thread) or a thread count", c.Threads)
	}
	if _, err := aggregator.ParseAlgorithm(c.Algorithm); err != nil {
		return fmt.Errorf("worker: Algorithm (GRADSYNC_ALGO): %w", err)
	}
	if c.DebugStepDelay < 0 {
		return fmt.Errorf("worker: DebugStepDelay %v is negative; want 0 (off) or a delay per step", c.DebugStepDelay)
	}
	if !c.Insecure && (c.TLS == nil || c.PeerServerTLS == nil || c.PeerClientTLS == nil) {
		return errors.New("worker: no TLS configured; give certificates (gradsync certs init) or ask for plaintext explicitly (--insecure)")
	}
	return nil
}

// Worker is one worker process's state.
type Worker struct {
	cfg  Config
	log  *slog.Logger
	addr string
	res  *pb.Resources
	mem  uint64            // the memory offered to a task (0: unknown)
	ring *ringrpc.Endpoint // the peer endpoint's rings (ring mode)
	pipe *peerrpc.Endpoint // the peer endpoint's pipeline links
	// snaps are the in-memory snapshots of the ring job this worker ran
	// last; they outlive its task for the job's next generation.
	snaps snapshotStore
}

// New checks the config and discovers the host's resources.
func New(cfg Config) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	gpus, err := gpu.Discover()
	if err != nil {
		cfg.Logger.Warn("GPU discovery incomplete", "err", err)
	}
	return &Worker{cfg: cfg, log: cfg.Logger, res: &pb.Resources{
		CpuCores: int32(runtime.NumCPU()), Gpus: gpus, GemmBackend: kernels.Backend(), AllowsEntrypoints: cfg.AllowEntrypoints,
	}, mem: offeredMemory(cfg.MemoryLimit)}, nil
}

func (w *Worker) dialOptions() []grpc.DialOption {
	return append(w.aggregatorDialOptions(), w.cfg.DialOptions...)
}

// aggregatorDialOptions are the options for connections to `gradsync
// aggregator` processes: the coordinator's, less Config.DialOptions
// (which are for the coordinator only).
func (w *Worker) aggregatorDialOptions() []grpc.DialOption {
	creds := insecure.NewCredentials()
	if w.cfg.TLS != nil {
		creds = credentials.NewTLS(w.cfg.TLS)
	}
	opts := append(rpc.DialOptions(), grpc.WithTransportCredentials(creds))
	if !w.cfg.Link.Unlimited() {
		opts = append(opts, grpc.WithContextDialer(w.cfg.Link.Dial))
	}
	return opts
}

// peerDialOptions are the options for connections to other workers (added
// to ringrpc's own).
func (w *Worker) peerDialOptions() []grpc.DialOption {
	var opts []grpc.DialOption // none: ringrpc's default, plaintext
	if w.cfg.PeerClientTLS != nil {
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(w.cfg.PeerClientTLS)))
	}
	if !w.cfg.Link.Unlimited() {
		opts = append(opts, grpc.WithContextDialer(w.cfg.Link.Dial))
	}
	return opts
}

// Run serves until ctx is cancelled: the peer endpoint, and the coordinator
// session, reconnected with exponential backoff whenever it breaks.
func (w *Worker) Run(ctx context.Context) error {
	lis := w.cfg.Listener
	if lis == nil {
		var err error
		if lis, err = net.Listen("tcp", w.cfg.ListenAddr); err != nil {
			return fmt.Errorf("worker: listen on %s: %w", w.cfg.ListenAddr, err)
		}
	}
	w.addr = w.cfg.AdvertiseAddr
	if w.addr == "" {
		w.addr = lis.Addr().String()
	}
	if w.cfg.Name == "" {
		h, _ := os.Hostname()
		w.cfg.Name = fmt.Sprintf("%s/%s", h, w.addr)
	}
	if w.cfg.PeerServerTLS == nil {
		w.log.Warn("plaintext peer endpoint: no TLS, peers unauthenticated (asked for with --insecure)", "addr", w.addr)
	}
	// The peer endpoint serves workers only: Collective needs a worker
	// certificate, health and reflection are open, nothing is public.
	opts := append(w.cfg.Metrics.GRPCServerOptions(), rpc.ServerOptions(w.log, w.cfg.PeerServerTLS,
		&security.AuthOptions{PublicServices: []string{}, Insecure: w.cfg.PeerServerTLS == nil})...)
	gs := grpc.NewServer(append(opts, ringrpc.ServerOptions()...)...)
	w.ring = ringrpc.NewEndpoint(w.log)
	defer w.ring.Close()
	pb.RegisterCollectiveServer(gs, w.ring)
	w.pipe = peerrpc.NewEndpoint()
	defer w.pipe.Close()
	pb.RegisterPipelineServer(gs, w.pipe)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	w.cfg.Metrics.InitializeGRPC(gs)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // owned by Run: the peer endpoint
		defer wg.Done()
		if err := gs.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			w.log.Error("peer endpoint stopped", "err", err)
		}
	}()
	defer func() {
		gs.Stop()
		wg.Wait()
	}()

	conn, err := grpc.NewClient(w.cfg.Server, w.dialOptions()...)
	if err != nil {
		return fmt.Errorf("worker: coordinator address %q: %w", w.cfg.Server, err)
	}
	defer conn.Close()
	w.log.Info("worker started", "server", w.cfg.Server, "peer_address", w.addr, "cpu_cores", w.res.CpuCores,
		"gpus", len(w.res.Gpus), "gemm", w.res.GemmBackend)
	backoff := 100 * time.Millisecond
	for {
		start := time.Now()
		err := w.session(ctx, conn)
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(start) > 10*time.Second {
			backoff = 100 * time.Millisecond
		}
		w.log.Warn("coordinator session ended; reconnecting", "err", err, "in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		backoff = min(2*backoff, w.cfg.MaxBackoff)
	}
}

// task is the one training task a worker runs at a time.
type task struct {
	jobID  string
	cancel context.CancelFunc
	done   chan struct{}
}

// session is one Connect stream: hello, welcome, then heartbeats and task
// reports up, assignments and cancellations down. Every goroutine it starts
// ends before it returns.
func (w *Worker) session(ctx context.Context, conn *grpc.ClientConn) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := pb.NewCoordinatorClient(conn).Connect(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Hello{Hello: &pb.Hello{
		WorkerId: w.cfg.ID, Name: w.cfg.Name, Address: w.addr, Resources: w.res, Version: Version, MemoryBytes: w.mem}}}); err != nil {
		return err
	}
	// No welcome within 10s: give up on this stream.
	welcomeTimer := time.AfterFunc(10*time.Second, cancel)
	first, err := stream.Recv()
	welcomeTimer.Stop()
	if err != nil {
		return err
	}
	welcome := first.GetWelcome()
	if welcome == nil {
		return errors.New("worker: coordinator did not answer with a welcome")
	}
	if w.cfg.ID == "" {
		w.cfg.ID = welcome.WorkerId // keep it across reconnects
	}
	interval := time.Duration(welcome.HeartbeatIntervalSeconds * float64(time.Second))
	if interval <= 0 {
		interval = time.Second
	}
	w.log.Info("connected to coordinator", "worker", welcome.WorkerId, "heartbeat", interval)

	out := make(chan *pb.ConnectRequest, 256)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // owned by session: the only sender on the stream
		defer wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			var m *pb.ConnectRequest
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				m = &pb.ConnectRequest{Msg: &pb.ConnectRequest_Heartbeat{Heartbeat: &pb.Heartbeat{}}}
			case m = <-out:
			}
			if err := stream.Send(m); err != nil {
				cancel()
				return
			}
		}
	}()
	rep := &reporter{ctx: ctx, out: out}
	var cur *task
	stopTask := func() {
		if cur != nil {
			cur.cancel()
			<-cur.done
			cur = nil
		}
	}
	defer func() {
		cancel()
		stopTask()
		wg.Wait()
	}()
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		switch m := m.Msg.(type) {
		case *pb.ConnectResponse_Assignment:
			stopTask()
			a := m.Assignment
			tctx, tcancel := context.WithCancel(ctx)
			cur = &task{jobID: a.JobId, cancel: tcancel, done: make(chan struct{})}
			wg.Add(1)
			go func(t *task) { // owned by session via cur/stopTask and wg
				defer wg.Done()
				defer close(t.done)
				w.log.Info("task assigned", "job", a.JobId, "rank", a.Rank, "world", a.WorldSize, "model", a.Spec.GetModel())
				env := &taskEnv{conn: conn, rep: rep, log: w.log, metrics: w.cfg.Metrics,
					ring: w.ring, pipe: w.pipe, peerDial: w.peerDialOptions(), psDial: w.aggregatorDialOptions(), stepDelay: w.cfg.DebugStepDelay, snaps: &w.snaps,
					dataDir: w.cfg.DataDir, threads: w.cfg.Threads, algo: w.cfg.Algorithm,
					allowEntrypoints: w.cfg.AllowEntrypoints, runsDir: w.cfg.RunsDir, worker: w.cfg.ID + " (" + w.cfg.Name + ")"}
				if w.cfg.TracePath != "" && a.Spec.GetMode() == "ring" {
					env.trace = trace.New(time.Now(), 0)
				}
				res, err := safeRun(tctx, a, env)
				if env.trace != nil {
					w.writeTrace(env.trace, a, res)
				}
				done := &pb.TaskDone{JobId: a.JobId, Rank: a.Rank, Result: res, Generation: a.Generation}
				if rf := (*ringFailure)(nil); errors.As(err, &rf) {
					done.RingLinks = rf.links
				}
				if cf := (*commandFailed)(nil); errors.As(err, &cf) {
					done.CommandFailed = true
				}
				if err != nil {
					if tctx.Err() != nil {
						// Cancelled: say so once the task has let go of
						// everything (rank 0's checkpoint at cancellation
						// is on disk by now), so a cancel can return only
						// when the job has stopped. The coordinator
						// ignores it as a report on the job otherwise.
						w.log.Info("task stopped", "job", a.JobId, "rank", a.Rank, "err", err)
						done.Error, done.RingLinks, done.CommandFailed = "stopped: "+err.Error(), nil, false
						rep.send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Done{Done: done}})
						return
					}
					done.Error = err.Error()
					w.log.Warn("task failed", "job", a.JobId, "rank", a.Rank, "err", err)
				} else {
					w.log.Info("task done", "job", a.JobId, "rank", a.Rank, "test_accuracy", res.GetTestAccuracy())
					w.snaps.drop(a.JobId) // the job is over
				}
				rep.send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Done{Done: done}})
			}(cur)
		case *pb.ConnectResponse_Cancel:
			if cur != nil && cur.jobID == m.Cancel.JobId {
				w.log.Info("task cancelled by coordinator", "job", m.Cancel.JobId, "reason", m.Cancel.Reason)
				stopTask()
			}
			if !m.Cancel.KeepState {
				w.snaps.drop(m.Cancel.JobId)
			}
		case *pb.ConnectResponse_Welcome:
			return errors.New("worker: unexpected second welcome")
		}
	}
}

// safeRun runs a task and turns a panic (a bug) into the task's error,
// so one bad job cannot take the worker down.
func safeRun(ctx context.Context, a *pb.Assignment, env *taskEnv) (res *pb.JobResult, err error) {
	defer func() {
		if p := recover(); p != nil {
			env.log.Error("task panicked", "job", a.GetJobId(), "panic", p, "stack", string(debug.Stack()))
			res, err = nil, fmt.Errorf("internal error in the worker: %v", p)
		}
	}()
	return runAssignment(ctx, a, env)
}

// reporter sends a task's reports up the session's stream.
type reporter struct {
	ctx context.Context
	out chan<- *pb.ConnectRequest
}

// send queues a message, waiting for room unless the session has ended.
func (r *reporter) send(m *pb.ConnectRequest) {
	select {
	case r.out <- m:
	case <-r.ctx.Done():
	}
}

// trySend queues a message if there is room (progress can be dropped).
func (r *reporter) trySend(m *pb.ConnectRequest) {
	select {
	case r.out <- m:
	default:
	}
}
