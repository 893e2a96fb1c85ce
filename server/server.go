// Package server is the gradsync coordinator's shell: the public
// JobService and ClusterService, the worker-facing Coordinator stream, and
// aggregator shard 0 (the ParameterServer). Thin gRPC handlers validate
// input and feed package coordinator under one lock: its Core (worker
// registry, liveness, queue, gang scheduler) through stepLocked (core.go),
// whose actions the server carries out on its job table, and its rules
// (lifecycle, recovery, stragglers, cut links) on each job's record. What
// those decisions call for outside memory — sends to workers, job store
// writes, run-log records, checkpoint pins and saves — is queued as
// effects and carried out after the lock is released, by one ordered
// FIFO (lock.go): in the order the lock was held.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/coordinator"
	"github.com/gradsync/gradsync/internal/metrics"
	"github.com/gradsync/gradsync/internal/plot"
	"github.com/gradsync/gradsync/internal/rpc"
	"github.com/gradsync/gradsync/internal/runlog"
	"github.com/gradsync/gradsync/internal/security"
	"github.com/gradsync/gradsync/jobspec"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Config configures a server. The zero value is usable: every field has a
// documented default.
type Config struct {
	// DataDir holds the job store (gradsync.db). Default "gradsync-data".
	DataDir string
	// RunsDir is where runs/<job-id>/ directories go. Default "runs".
	RunsDir string
	// HeartbeatInterval is how often workers must send a heartbeat.
	// Default 1s.
	HeartbeatInterval time.Duration
	// HeartbeatTimeout is how long a silent worker is kept before it is
	// declared lost and its job fails. Default 5s.
	HeartbeatTimeout time.Duration
	// PlaceByMemory has every job submitted with what its ranks need of
	// their workers' memory, even before a worker has said what it
	// offers (which turns that on anyway): gradsync local sets it with
	// --memory-limit, whose workers may say hello after the job arrives.
	PlaceByMemory bool
	// StopTimeout bounds how long CancelJob (and a resume of a job that
	// has just ended) waits for the job's tasks to say they stopped,
	// after which a ring job's final checkpoint is on disk. Default 20s.
	StopTimeout time.Duration
	// Logger receives structured logs. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// TLS secures every endpoint of the server; nil means plaintext, which
	// must be asked for with Insecure.
	TLS *tls.Config
	// Insecure allows plaintext (TLS nil). It is logged loudly.
	Insecure bool
	// Tokens are the bearer tokens API clients may present (JobService,
	// ClusterService). With TLS at least one is required; workers prove
	// themselves by their certificate (see internal/security).
	Tokens [][]byte
	// APIRate limits each client host's calls to the public API (calls per
	// second, burst twice that). Default 50; negative: no limit.
	APIRate float64
	// Metrics, if set, receives the server's Prometheus metrics (job
	// states, throughput, heartbeats missed, gRPC handling).
	Metrics *metrics.Registry
	// ServerOptions are extra gRPC server options.
	ServerOptions []grpc.ServerOption
}

// Validate fills defaults and checks the config.
func (c *Config) Validate() error {
	if c.DataDir == "" {
		c.DataDir = "gradsync-data"
	}
	if c.RunsDir == "" {
		c.RunsDir = "runs"
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = time.Second
	}
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = 5 * time.Second
	}
	if c.StopTimeout <= 0 {
		c.StopTimeout = 20 * time.Second
	}
	if c.APIRate == 0 {
		c.APIRate = 50
	}
	if c.HeartbeatInterval < 0 || c.HeartbeatTimeout < 2*c.HeartbeatInterval {
		return fmt.Errorf("server: heartbeat timeout %v must be at least twice the interval %v", c.HeartbeatTimeout, c.HeartbeatInterval)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.TLS == nil && !c.Insecure {
		return errors.New("server: no TLS configured; give certificates (gradsync certs init) or ask for plaintext explicitly (--insecure)")
	}
	return c.auth().Validate()
}

func (c *Config) auth() *security.AuthOptions {
	return &security.AuthOptions{Tokens: c.Tokens, Insecure: c.TLS == nil}
}

// Server is a coordinator. Create it with New, run it with Serve, stop it by
// cancelling Serve's context.
type Server struct {
	cfg    Config
	log    *slog.Logger
	store  *store
	grpc   *grpc.Server
	health *health.Server
	// memoryOffered is set once a worker has said how much memory it
	// offers (--memory-limit): from then on jobs are submitted with what
	// their ranks need (jobspec.MemoryNeeds, which runs a small training
	// step of the model, so it is not paid where no worker is limited).
	memoryOffered atomic.Bool

	// mu guards everything below; the effects decided under it (sends,
	// disk work) are carried out, in order, once it is released
	// (lock.go).
	mu shellLock
	// core is the worker registry, the queue of pending jobs, the gang
	// scheduler and the job table (coordinator.Core), fed by stepLocked
	// (core.go); actions holds what it returned that is not yet carried
	// out, and applying says stepLocked is carrying them out.
	core     *coordinator.Core
	actions  []coordinator.Action
	applying bool
	// workersChanged is closed (and replaced) once a step has changed
	// the registry (registryChanged: one did, in the steps being
	// carried out): what tests wait on instead of polling.
	workersChanged  chan struct{}
	registryChanged bool
	// jobs by id.
	jobs map[string]*jobEntry
	// conns is each worker's latest connection, by id.
	conns map[string]*conn
	// closed is set once Serve has returned; no new work is started.
	closed bool

	// streams counts goroutines that outlive a handler by the moment it
	// takes gRPC to end the stream; Serve waits for them.
	streams sync.WaitGroup

	// plots receives run directories whose charts should be redrawn; the
	// plotter goroutine owned by Serve draws them off the lock.
	plots chan string

	pb.UnimplementedJobServiceServer
	pb.UnimplementedClusterServiceServer
	pb.UnimplementedCoordinatorServer
	pb.UnimplementedParameterServerServer
	pb.UnimplementedFederationServer
}

// New opens the store and loads every job it holds. Jobs that were PENDING
// are queued again; jobs that were RUNNING when the previous server stopped
// are queued again to resume from their latest checkpoint, or marked FAILED
// when they have none.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.TLS == nil {
		cfg.Logger.Warn("plaintext gRPC: no TLS and no client certificates checked (asked for with --insecure)")
	}
	st, err := openStore(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg: cfg, log: cfg.Logger, store: st,
		core: coordinator.NewCore(cfg.HeartbeatTimeout),
		jobs: map[string]*jobEntry{}, conns: map[string]*conn{}, workersChanged: make(chan struct{}),
		plots: make(chan string, 256),
	}
	s.mu.init()
	stored, err := st.jobs()
	if err != nil {
		st.close()
		return nil, err
	}
	sortJobs(stored)
	var queue []*pb.Job
	for i := len(stored) - 1; i >= 0; i-- { // oldest first, so the queue keeps submission order
		j := stored[i]
		e := newJobEntry(j)
		s.jobs[j.Id] = e
		switch j.State {
		case pb.JobState_JOB_STATE_PENDING:
			queue = append(queue, j)
		case pb.JobState_JOB_STATE_RUNNING:
			path, perr := pinLatest(j, "restart-"+cfg.Now().UTC().Format("20060102T150405.000000000"))
			if path != "" {
				// Run it again from its latest checkpoint once workers are back.
				j.State, j.ResumeFrom = pb.JobState_JOB_STATE_PENDING, path
				j.Message = "the server restarted while the job was running; it resumes from " + path
				j.WorkerIds, j.StartedAt = nil, nil
				queue = append(queue, j)
			} else {
				j.State = pb.JobState_JOB_STATE_FAILED
				j.Message = "the server stopped while the job was running, and the job has no checkpoint to resume from"
				if perr != nil {
					j.Message = fmt.Sprintf("the server stopped while the job was running, and pinning its latest checkpoint to resume from failed: %v", perr)
				}
				j.FinishedAt = tsNow(cfg.Now())
			}
			if err := st.putJob(j, 0); err != nil {
				st.close()
				return nil, err
			}
		}
		// One event with the stored state, so the job can still be watched
		// (no other goroutine exists yet: no lock needed).
		s.emitLocked(e, pb.EventKind_EVENT_KIND_STATE, j.Message, nil)
	}
	// Queued again in submission order (no worker is connected yet:
	// nothing is placed).
	s.mu.Lock()
	for _, j := range queue {
		s.mustStepLocked(submitInput(j, cfg.Now(), nil)) // no worker has said hello yet
	}
	for _, e := range s.jobs {
		if e.final() { // the core refuses to cancel them
			s.mustStepLocked(coordinator.Loaded{At: cfg.Now(), Job: e.job.Id, State: e.job.State})
		}
	}
	s.mu.Unlock()
	s.grpc = grpc.NewServer(s.serverOptions()...)
	s.health = health.NewServer()
	pb.RegisterJobServiceServer(s.grpc, s)
	pb.RegisterClusterServiceServer(s.grpc, s)
	pb.RegisterCoordinatorServer(s.grpc, s)
	pb.RegisterParameterServerServer(s.grpc, s)
	pb.RegisterFederationServer(s.grpc, s)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	cfg.Metrics.InitializeGRPC(s.grpc)
	s.countJobsLocked()
	for _, name := range []string{"", pb.JobService_ServiceDesc.ServiceName, pb.ClusterService_ServiceDesc.ServiceName,
		pb.Coordinator_ServiceDesc.ServiceName, pb.ParameterServer_ServiceDesc.ServiceName, pb.Federation_ServiceDesc.ServiceName} {
		s.health.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	return s, nil
}

func (s *Server) serverOptions() []grpc.ServerOption {
	// Metrics first: its handling time then covers the other interceptors.
	var extra []rpc.Option
	if s.cfg.APIRate > 0 {
		extra = append(extra, rpc.WithRateLimit(rpc.NewClientLimiter(s.cfg.APIRate, int(2*s.cfg.APIRate)+1)))
	}
	opts := append(s.cfg.Metrics.GRPCServerOptions(), rpc.ServerOptions(s.log, s.cfg.TLS, s.cfg.auth(), extra...)...)
	return append(opts, s.cfg.ServerOptions...)
}

// Serve serves on lis until ctx is cancelled, then stops gracefully: running
// jobs are failed (their workers are told), streams are closed, the store is
// flushed and closed.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The effects executor first (lock.go): it runs what every handler
	// queues under the lock, until every other goroutine is gone.
	execStarted, execDone := make(chan struct{}), make(chan struct{})
	go func() { // owned by Serve: stopped after the streams end
		defer close(execDone)
		s.mu.execute(execStarted)
	}()
	<-execStarted
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // owned by Serve: the heartbeat monitor
		defer wg.Done()
		s.monitor(ctx)
	}()
	plotterDone := make(chan struct{})
	go func() { // owned by Serve: draws run charts off the lock
		defer close(plotterDone)
		s.plotter()
	}()
	defer func() {
		close(s.plots) // shutdown has set closed: nothing sends any more
		<-plotterDone
	}()
	errc := make(chan error, 1)
	wg.Add(1)
	go func() { // owned by Serve: the gRPC accept loop
		defer wg.Done()
		errc <- s.grpc.Serve(lis)
	}()
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		cancel()
	}
	s.shutdown()
	wg.Wait()
	s.streams.Wait()
	s.mu.stop()
	<-execDone
	if cerr := s.store.close(); err == nil {
		err = cerr
	}
	if errors.Is(err, grpc.ErrServerStopped) {
		err = nil
	}
	return err
}

// shutdown stops accepting work, fails running jobs, and stops the gRPC
// server (giving streams a moment to drain).
func (s *Server) shutdown() {
	s.health.Shutdown()
	s.mu.Lock()
	s.closed = true
	s.mustStepLocked(coordinator.Shutdown{At: s.cfg.Now()})
	for _, e := range s.jobs {
		if e.job.State == pb.JobState_JOB_STATE_RUNNING {
			// Keep RUNNING in the store: the next server start resumes
			// it from its latest checkpoint (a ps job's is written now),
			// or marks it FAILED.
			e.abort(errors.New("server shutting down"))
			s.checkpointStoppedLocked(e)
		}
	}
	for _, c := range s.conns {
		c.close()
	}
	for _, e := range s.jobs {
		close(e.notify) // wake watchers: they see closed and leave
		e.notify = make(chan struct{})
	}
	s.mu.Unlock()
	rpc.Stop(s.grpc, 2*time.Second)
}

// monitor declares silent workers lost.
func (s *Server) monitor(ctx context.Context) {
	t := time.NewTicker(s.cfg.HeartbeatInterval / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := s.cfg.Now()
		s.mu.Lock()
		// Lost workers, and rank failures past their deadline.
		s.mustStepLocked(coordinator.Tick{At: now})
		s.mu.Unlock()
	}
}

// runDir is where a job's files go.
func (s *Server) runDir(id string) string {
	d := filepath.Join(s.cfg.RunsDir, id)
	if abs, err := filepath.Abs(d); err == nil {
		return abs
	}
	return d
}

// plotter redraws the charts of the run directories sent on s.plots until
// the channel is closed, coalescing repeated requests for one directory.
func (s *Server) plotter() {
	for dir := range s.plots {
		pending := map[string]bool{dir: true}
		for more := true; more; {
			select {
			case d, ok := <-s.plots:
				if !ok {
					more = false
					break
				}
				pending[d] = true
			default:
				more = false
			}
		}
		for d := range pending {
			if err := plot.RenderRun(d); err != nil && !errors.Is(err, plot.ErrNoData) {
				s.log.Warn("drawing run charts failed", "dir", d, "err", err)
			}
		}
	}
}

// replotLocked asks the plotter to redraw a job's charts (never blocks).
func (s *Server) replotLocked(dir string) {
	if s.closed || dir == "" {
		return
	}
	select {
	case s.plots <- dir:
	default:
	}
}

// countJobsLocked publishes how many jobs are in each state.
func (s *Server) countJobsLocked() {
	if s.cfg.Metrics == nil {
		return
	}
	counts := map[string]int{}
	for _, e := range s.jobs {
		counts[runlog.StateName(e.job.State)]++
	}
	s.cfg.Metrics.SetJobCounts(counts)
}

// pinLatest pins the job's latest checkpoint (checkpoint.PinLatest)
// for a job that is about to be resumed while its old tasks may still
// write. It returns "" and no error where the job keeps no checkpoints
// or has none yet.
func pinLatest(j *pb.Job, tag string) (string, error) {
	if !jobspec.CheckpointsOn(j.GetSpec()) {
		return "", nil
	}
	path, err := checkpoint.PinLatest(checkpointDir(j.RunDir), tag, 4)
	if errors.Is(err, checkpoint.ErrNoCheckpoint) {
		return "", nil
	}
	return path, err
}
