package paramserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/internal/metrics"
	"github.com/gradsync/gradsync/internal/rpc"
	"github.com/gradsync/gradsync/internal/security"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// ShardServerConfig configures a `gradsync aggregator` process. The zero
// value is not usable: TLS or Insecure must be set, as for the server.
type ShardServerConfig struct {
	// TLS is the server-side TLS configuration; with client certificates
	// required (mTLS), only workers may call ParameterServer.
	TLS *tls.Config
	// Insecure allows plaintext (only on a trusted network).
	Insecure bool
	Logger   *slog.Logger
	// Now is the clock (default time.Now).
	Now     func() time.Time
	Metrics *metrics.Registry // may be nil
}

// Validate fills in defaults and checks the configuration.
func (c *ShardServerConfig) Validate() error {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.TLS == nil && !c.Insecure {
		return errors.New("aggregator: no TLS configured; give certificates (gradsync certs init) or ask for plaintext explicitly (--insecure)")
	}
	return nil
}

// ShardServer is a parameter-server shard process (`gradsync aggregator`):
// it serves ParameterServer.Sync for the jobs whose spec names it in
// parameter_server.addresses, and Reduce for the entrypoint jobs among
// them (summation shards of their scripts' calls, built the same way
// from the first rank's join, without a model). It needs no set-up per job: the first
// rank's join of (job, generation, shard) carries the normalized spec,
// from which the aggregator builds the model's initial parameters (the
// seed makes them those of the coordinator and every worker), takes its
// range and the optimiser; every later join must carry the same spec.
// The job's state is dropped when its last stream ends (a rank joining
// after that is refused: FailedPrecondition), so a finished or failed
// job leaves nothing behind. Deadlines come from the spec
// (step_timeout_seconds), as in the server.
type ShardServer struct {
	cfg    ShardServerConfig
	grpc   *grpc.Server
	health *health.Server

	mu      sync.Mutex // guards jobs, scripts, ended
	jobs    map[shardKey]*hostedShard
	scripts map[shardKey]*hostedSums // entrypoint jobs' summation shards
	ended   map[shardKey]bool

	pb.UnimplementedParameterServerServer
}

type shardKey struct {
	job   string
	gen   uint64
	shard int32
}

// hostedShard is one shard of one job's generation and its open streams.
type hostedShard struct {
	p      *jobShard
	spec   *pb.JobSpec
	active int // streams being served
}

// NewShardServer builds an aggregator process's gRPC server.
func NewShardServer(cfg ShardServerConfig) (*ShardServer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.TLS == nil {
		cfg.Logger.Warn("plaintext gRPC: no TLS and no client certificates checked (asked for with --insecure)")
	}
	a := &ShardServer{cfg: cfg, jobs: map[shardKey]*hostedShard{}, scripts: map[shardKey]*hostedSums{}, ended: map[shardKey]bool{}}
	auth := &security.AuthOptions{Insecure: cfg.TLS == nil}
	opts := append(cfg.Metrics.GRPCServerOptions(), rpc.ServerOptions(cfg.Logger, cfg.TLS, auth)...)
	a.grpc = grpc.NewServer(opts...)
	a.health = health.NewServer()
	pb.RegisterParameterServerServer(a.grpc, a)
	healthpb.RegisterHealthServer(a.grpc, a.health)
	reflection.Register(a.grpc)
	cfg.Metrics.InitializeGRPC(a.grpc)
	for _, name := range []string{"", pb.ParameterServer_ServiceDesc.ServiceName} {
		a.health.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	return a, nil
}

// Serve serves on lis until ctx is cancelled, then stops: every job's
// shard is aborted (its workers get Aborted) and the streams drain.
func (a *ShardServer) Serve(ctx context.Context, lis net.Listener) error {
	errc := make(chan error, 1)
	go func() { // owned by Serve: the gRPC accept loop (errc is buffered)
		errc <- a.grpc.Serve(lis)
	}()
	var err error
	served := false // errc was read
	select {
	case <-ctx.Done():
	case err = <-errc:
		served = true
	}
	a.health.Shutdown()
	a.mu.Lock()
	for _, j := range a.jobs {
		j.p.abort(errors.New("the aggregator is shutting down"))
	}
	for _, j := range a.scripts {
		j.p.abort(errors.New("the aggregator is shutting down"))
	}
	a.mu.Unlock()
	rpc.Stop(a.grpc, 5*time.Second)
	if !served {
		err = <-errc
	}
	if errors.Is(err, grpc.ErrServerStopped) {
		err = nil
	}
	return err
}

// Jobs is the number of job shards the aggregator holds now.
func (a *ShardServer) Jobs() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.jobs) + len(a.scripts)
}

// Sync serves one rank's stream to the shard this process hosts for the
// job of its join (see ps.proto).
func (a *ShardServer) Sync(stream pb.ParameterServer_SyncServer) error {
	join, err := RecvJoin(stream)
	if err != nil {
		return err
	}
	j, err := a.acquire(join)
	if err != nil {
		return err
	}
	defer a.release(join, j)
	return j.p.serve(stream, join)
}

// acquire finds or builds the shard a join names and counts the stream.
func (a *ShardServer) acquire(join *pb.SyncJoin) (*hostedShard, error) {
	spec, err := joinSpec(join.Spec, join.JobId, join.Shard, join.NumShards, join.WorldSize, false)
	if err != nil {
		return nil, err
	}
	ps := spec.GetParameterServer()
	key := shardKey{job: join.JobId, gen: join.Generation, shard: join.Shard}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ended[key] {
		return nil, status.Errorf(codes.FailedPrecondition, "shard %d of job %s (generation %d) has ended here: every stream to it closed", join.Shard, join.JobId, join.Generation)
	}
	j := a.jobs[key]
	if j == nil {
		c, h, w, classes := jobspec.InputShape(spec)
		net, err := models.New(spec.Model, models.Options{Channels: c, Height: h, Width: w, Classes: classes, Seed: spec.GetSeed()})
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "building model %s: %v", spec.Model, err)
		}
		env := Env{Now: a.cfg.Now, Log: a.cfg.Logger, Metrics: a.cfg.Metrics}
		p, err := newJobShard(env, join.JobId, join.Generation, int(join.WorldSize), net, spec, int(join.Shard), "", "")
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "%v", err)
		}
		j = &hostedShard{p: p, spec: spec}
		a.jobs[key] = j
		a.cfg.Logger.Info("shard started", "job", join.JobId, "generation", join.Generation, "shard", join.Shard, "of", ps.Shards,
			"range", fmt.Sprintf("[%d,%d)", p.rng.Lo, p.rng.Hi), "consistency", ps.Consistency, "world", join.WorldSize)
	} else if !proto.Equal(j.spec, spec) {
		return nil, status.Errorf(codes.InvalidArgument, "rank %d's spec of job %s differs from the first rank's", join.Rank, join.JobId)
	}
	j.active++
	return j, nil
}

// release counts a stream out; the last one drops the shard, for good
// once a rank had joined it.
func (a *ShardServer) release(join *pb.SyncJoin, j *hostedShard) {
	key := shardKey{job: join.JobId, gen: join.Generation, shard: join.Shard}
	a.mu.Lock()
	defer a.mu.Unlock()
	j.active--
	if j.active > 0 {
		return
	}
	delete(a.jobs, key)
	if !j.p.anyJoined() {
		return // only refused joins: a valid one builds it afresh
	}
	j.p.abort(errors.New("every stream to the shard has closed"))
	a.ended[key] = true
	a.cfg.Logger.Info("shard ended", "job", join.JobId, "generation", join.Generation, "shard", join.Shard)
}

// hostedSums is one summation shard of an entrypoint job's generation and
// its open streams.
type hostedSums struct {
	p      *sumShard
	spec   *pb.JobSpec
	active int // streams being served
}

// Reduce serves one rank's stream to the summation shard this process
// hosts for the entrypoint job of its join (see ps.proto).
func (a *ShardServer) Reduce(stream pb.ParameterServer_ReduceServer) error {
	join, err := RecvReduceJoin(stream)
	if err != nil {
		return err
	}
	j, err := a.acquireSums(join)
	if err != nil {
		return err
	}
	defer a.releaseSums(join, j)
	return j.p.serve(stream, join)
}

// acquireSums finds or builds the summation shard a join names and counts
// the stream.
func (a *ShardServer) acquireSums(join *pb.ReduceJoin) (*hostedSums, error) {
	spec, err := joinSpec(join.Spec, join.JobId, join.Shard, join.NumShards, join.WorldSize, true)
	if err != nil {
		return nil, err
	}
	ps := spec.GetParameterServer()
	key := shardKey{job: join.JobId, gen: join.Generation, shard: join.Shard}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ended[key] {
		return nil, status.Errorf(codes.FailedPrecondition, "shard %d of job %s (generation %d) has ended here: every stream to it closed", join.Shard, join.JobId, join.Generation)
	}
	j := a.scripts[key]
	if j == nil {
		env := Env{Now: a.cfg.Now, Log: a.cfg.Logger, Metrics: a.cfg.Metrics}
		timeout := time.Duration(spec.GetStepTimeoutSeconds() * float64(time.Second))
		j = &hostedSums{p: newSumShard(env, join.JobId, join.Generation, int(join.WorldSize), int(join.Shard), int(ps.Shards), timeout), spec: spec}
		a.scripts[key] = j
		a.cfg.Logger.Info("summation shard started", "job", join.JobId, "generation", join.Generation, "shard", join.Shard, "of", ps.Shards, "world", join.WorldSize)
	} else if !proto.Equal(j.spec, spec) {
		return nil, status.Errorf(codes.InvalidArgument, "rank %d's spec of job %s differs from the first rank's", join.Rank, join.JobId)
	}
	j.active++
	return j, nil
}

// releaseSums counts a stream out; the last one drops the shard, for good
// once a rank had joined it.
func (a *ShardServer) releaseSums(join *pb.ReduceJoin, j *hostedSums) {
	key := shardKey{job: join.JobId, gen: join.Generation, shard: join.Shard}
	a.mu.Lock()
	defer a.mu.Unlock()
	j.active--
	if j.active > 0 {
		return
	}
	delete(a.scripts, key)
	if !j.p.anyJoined() {
		return // only refused joins: a valid one builds it afresh
	}
	j.p.abort(errors.New("every stream to the shard has closed"))
	a.ended[key] = true
	a.cfg.Logger.Info("summation shard ended", "job", join.JobId, "generation", join.Generation, "shard", join.Shard)
}

// joinSpec checks the spec a rank's join carries for a shard of this
// process: a job in mode ps (an entrypoint job's summation shards when
// script, else a Go job's) whose shards are aggregators, with the join's
// shard and world; it returns the spec normalized.
func joinSpec(raw *pb.JobSpec, jobID string, shard, numShards, world int32, script bool) (*pb.JobSpec, error) {
	if raw == nil {
		return nil, status.Error(codes.InvalidArgument, "a join of a `gradsync aggregator` shard must carry the job's spec")
	}
	spec, err := jobspec.Normalize(raw, models.Names())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "the job's spec: %v", err)
	}
	ps := spec.GetParameterServer()
	switch {
	case script && (spec.Mode != "ps" || !jobspec.IsEntrypoint(spec)):
		return nil, status.Errorf(codes.InvalidArgument, "job %s is not an entrypoint job in mode ps (mode %s); its shards serve Sync", jobID, spec.Mode)
	case !script && spec.Mode != "ps":
		return nil, status.Errorf(codes.InvalidArgument, "job %s is in mode %s; aggregators serve mode ps", jobID, spec.Mode)
	case len(ps.GetAddresses()) == 0:
		return nil, status.Errorf(codes.InvalidArgument, "job %s names no aggregator addresses; its shards are in the server", jobID)
	case numShards != ps.Shards || shard < 0 || shard >= ps.Shards:
		return nil, status.Errorf(codes.InvalidArgument, "joined shard %d of %d; the job has %d shards", shard, numShards, ps.Shards)
	case world != spec.GetWorkers():
		// ps jobs are not elastic: the world is the spec's workers (and
		// a join cannot make the shard allocate for a larger one).
		return nil, status.Errorf(codes.InvalidArgument, "world size %d, the job's spec has %d workers", world, spec.GetWorkers())
	}
	return spec, nil
}
