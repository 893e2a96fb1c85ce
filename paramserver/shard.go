package paramserver

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/internal/metrics"
	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/internal/rpc"
	"github.com/gradsync/gradsync/internal/wire"
	"github.com/gradsync/gradsync/internal/wire/framecodec"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/paramserver/psstep"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// jobShard is one aggregator shard of one running job in ps mode: the
// synchronous or asynchronous core plus what the gRPC handlers need to
// wait on it. The coordinator hosts a job's shards (Group) unless the
// spec names `gradsync aggregator` processes, which host one each
// (ShardServer).
type jobShard struct {
	jobID       string
	gen         uint64
	world       int
	total       int // parameters of the whole model
	stepTimeout time.Duration
	env         Env

	// This shard's place: index of numShards, owning rng of the flat
	// parameters (frames on its streams cover rng only).
	index, numShards int
	rng              aggregator.Range

	spec *pb.JobSpec
	opt  optim.Stepper
	ckpt *psCheckpointer // nil: the job writes no checkpoints

	mu         sync.Mutex             // guards shard, round, async, opt, recv, gather, done, joined, totalSteps, trainN, lags, stopped
	shard      *aggregator.SyncShard  // consistency sync; nil otherwise
	round      *psstep.Shard          // consistency sync: the step's arithmetic over shard and recv
	async      *aggregator.AsyncShard // consistency async and bounded; nil for sync
	recv       *compress.PSReceiver   // decodes the compressed pushes; PowerSGD's server half
	gather     *stateGather           // a due checkpoint waiting for the ranks' compression state
	totalSteps int64                  // from the first join; every rank must agree
	trainN     int64                  // training examples, from the first join; every rank must agree
	done       chan struct{}          // sync: closed when the current step's update is applied (and checkpointed, when due); async: when any gradient is applied or a rank finishes
	joined     []bool
	lags       psstep.Lags // how late each rank's gradient arrives
	stopped    bool        // set by abort: the shard takes no more gradients

	abortOnce sync.Once
	aborted   chan struct{} // closed by abort
	abortErr  error         // set before aborted is closed
}

// stateGather is a checkpoint that is due but waits for every rank's own
// compression state (error feedback), which only the ranks hold: the
// parameters of the step after which it is due carry send_state; each
// rank answers with state frames and waits for checkpoint_written, which
// its stream handler sends once the rank that completed the set has
// written the checkpoint (saved is closed then; err says how it went).
type stateGather struct {
	st    *checkpoint.State
	own   [][]float32 // by rank
	n     int         // ranks complete
	saved chan struct{}
	err   error // set before saved is closed
}

// Env is what a shard uses of the process hosting it (the coordinator,
// or a `gradsync aggregator` process): its clock, its log and its
// metrics. A shard never reaches into its host's jobs or workers; what
// the host must learn of a job it learns from the workers' reports.
type Env struct {
	Now     func() time.Time
	Log     *slog.Logger
	Metrics *metrics.Registry // may be nil
}

// newJobShard builds shard index of the parameter server of a job's
// generation from net's parameters, or, with resumeFrom, from that
// checkpoint (parameters, optimiser state and step; one shard only).
// ckptDir "" means no checkpoints (jobspec allows them with one shard in
// the server only).
func newJobShard(env Env, jobID string, gen uint64, world int, net *models.Network, spec *pb.JobSpec, index int, ckptDir, resumeFrom string) (*jobShard, error) {
	numShards := int(max(spec.GetParameterServer().GetShards(), 1))
	if index < 0 || index >= numShards {
		panic(fmt.Sprintf("server: shard %d of %d", index, numShards))
	}
	if net.NumParams() < numShards {
		return nil, fmt.Errorf("%d parameter-server shards for a model of %d parameters; use at most %d", numShards, net.NumParams(), net.NumParams())
	}
	if numShards > 1 && (ckptDir != "" || resumeFrom != "") {
		return nil, errors.New("checkpoints with more than one parameter-server shard are not implemented")
	}
	rng := aggregator.Partition(net.NumParams(), numShards)[index]
	segs := net.Segments()
	if numShards > 1 {
		// Compression is refused with shards (jobspec): the plan only
		// needs the range's length.
		segs = []models.Segment{{Name: fmt.Sprintf("shard%d", index), Shape: []int{rng.Len()}, Len: rng.Len()}}
	}
	opt := optim.FromSpec(spec)
	var start struct {
		checkpoint.Meta
		Extra map[string]checkpoint.Tensor
	}
	if resumeFrom != "" {
		st, err := checkpoint.Load(resumeFrom)
		if err != nil {
			return nil, err
		}
		if st.Meta.SpecHash != jobspec.CheckpointHash(spec) {
			return nil, fmt.Errorf("checkpoint %s was written for another spec", resumeFrom)
		}
		if err := net.LoadState(st.Tensors); err != nil {
			return nil, fmt.Errorf("checkpoint %s: %w", resumeFrom, err)
		}
		if err := st.RestoreOptimizer(opt, net.Segments()); err != nil {
			return nil, fmt.Errorf("checkpoint %s: optimiser state: %w", resumeFrom, err)
		}
		start.Meta, start.Extra = st.Meta, st.Extra
	}
	sc, err := jobspec.CompressionScheme(spec.GetCompression(), spec.GetSeed())
	if err != nil {
		return nil, fmt.Errorf("compression: %w", err)
	}
	recv, err := compress.NewPSReceiver(sc, segs, world)
	if err != nil {
		return nil, fmt.Errorf("compression: %w", err)
	}
	if st := start.Extra; st != nil {
		if t, ok := st[compress.CheckpointShared]; ok {
			v, err := t.Float32s()
			if err == nil {
				err = recv.SetShared(v)
			}
			if err != nil {
				return nil, fmt.Errorf("checkpoint %s: %s: %w", resumeFrom, compress.CheckpointShared, err)
			}
		}
	}
	params := append([]float32(nil), net.Params()[rng.Lo:rng.Hi]...)
	p := &jobShard{
		recv: recv, env: env,
		jobID: jobID, gen: gen, world: world, total: net.NumParams(), spec: spec, opt: opt,
		index: index, numShards: numShards, rng: rng,
		stepTimeout: time.Duration(spec.GetStepTimeoutSeconds() * float64(time.Second)),
		done:        make(chan struct{}), joined: make([]bool, world), aborted: make(chan struct{}),
	}
	skip := spec.GetNonfinitePolicy() == "skip"
	switch ps := spec.GetParameterServer(); ps.GetConsistency() {
	case jobspec.PSAsync:
		p.async = aggregator.NewAsyncShard(params, world, opt, aggregator.Unbounded, skip)
	case jobspec.PSBounded:
		p.async = aggregator.NewAsyncShard(params, world, opt, int(ps.GetStaleness()), skip)
	default:
		p.shard = aggregator.NewSyncShard(params, world, opt, skip)
		p.shard.StartAt(start.Step)
		p.round = psstep.NewShard(p.shard, recv)
	}
	if p.async != nil && (ckptDir != "" || resumeFrom != "") {
		return nil, errors.New("checkpoints need consistency sync")
	}
	if ckptDir != "" {
		due := func(step int64, epochEnd bool, epoch int, since time.Duration) bool {
			return jobspec.CheckpointDue(spec, step, epochEnd, epoch, since)
		}
		p.ckpt = &psCheckpointer{dir: ckptDir, keep: int(spec.GetCheckpoint().GetKeep()), hash: jobspec.CheckpointHash(spec),
			jobID: jobID, seed: spec.GetSeed(), net: net, lastSave: env.Now(), savedStep: start.Step,
			meta: jobspec.ModelMetadata(spec, nil, nil), // mean/std only when the spec gives them: the data is the workers'

			sched: psstep.Checkpoints{Policy: due, World: world, Batch: jobspec.StepBatch(spec),
				StartStep: start.Step, StartEpoch: start.Epoch, StartConsumed: start.EpochConsumed}}
	}
	return p, nil
}

// abort stops the job's parameter server: the shard takes no more
// gradients (its state stays that after the last applied step, for
// saveStopped) and every stream waiting on it returns.
func (p *jobShard) abort(err error) {
	p.abortOnce.Do(func() {
		p.mu.Lock()
		p.abortErr = err
		p.stopped = true
		p.mu.Unlock()
		close(p.aborted)
	})
}

// missingLocked lists the ranks whose gradient for the current step is not in.
func (p *jobShard) missingLocked(have []bool) []int {
	var out []int
	for r, ok := range have {
		if !ok {
			out = append(out, r)
		}
	}
	return out
}

func abortedStatus(err error) error {
	return status.Errorf(codes.Aborted, "job aborted: %v", err)
}

// RecvJoin reads the join that opens a Sync stream.
func RecvJoin(stream pb.ParameterServer_SyncServer) (*pb.SyncJoin, error) {
	_, join, err := rpc.First(stream.Recv, (*pb.SyncRequest).GetJoin, "Sync", "join")
	return join, err
}

// serve checks a rank's join of this shard and serves its stream until
// the rank closes it (its last step done) or the job stops.
func (p *jobShard) serve(stream pb.ParameterServer_SyncServer, join *pb.SyncJoin) error {
	ctx := stream.Context()
	switch {
	case join.Generation != p.gen:
		return status.Errorf(codes.Aborted, "generation %d is stale; the job is at generation %d", join.Generation, p.gen)
	case join.Rank < 0 || int(join.Rank) >= p.world:
		return status.Errorf(codes.InvalidArgument, "rank %d out of range [0,%d)", join.Rank, p.world)
	case int(join.WorldSize) != p.world:
		return status.Errorf(codes.InvalidArgument, "world size %d, the job has %d", join.WorldSize, p.world)
	case join.NumParams != int64(p.total):
		return status.Errorf(codes.InvalidArgument, "model has %d parameters, the server's has %d", join.NumParams, p.total)
	case int(max(join.NumShards, 1)) != p.numShards || int(join.Shard) != p.index:
		return status.Errorf(codes.InvalidArgument, "joined shard %d of %d; this is shard %d of the job's %d", join.Shard, max(join.NumShards, 1), p.index, p.numShards)
	}
	rank := int(join.Rank)
	p.mu.Lock()
	if p.joined[rank] {
		p.mu.Unlock()
		return status.Errorf(codes.AlreadyExists, "rank %d of job %s has already joined", rank, p.jobID)
	}
	if join.TotalSteps < 1 {
		p.mu.Unlock()
		return status.Errorf(codes.InvalidArgument, "total_steps %d: must be at least 1", join.TotalSteps)
	}
	if p.totalSteps == 0 {
		p.totalSteps = join.TotalSteps
	}
	if join.TotalSteps != p.totalSteps {
		p.mu.Unlock()
		return status.Errorf(codes.InvalidArgument, "rank %d plans %d steps but another rank plans %d (different data?)", rank, join.TotalSteps, p.totalSteps)
	}
	if p.ckpt != nil && join.TrainExamples < 1 {
		p.mu.Unlock()
		return status.Errorf(codes.InvalidArgument, "train_examples %d: a job that writes checkpoints needs the size of the training split (at least 1)", join.TrainExamples)
	}
	if p.trainN == 0 {
		p.trainN = join.TrainExamples
		if p.ckpt != nil {
			p.ckpt.sched.TrainN = int(p.trainN)
		}
	}
	if join.TrainExamples != p.trainN {
		p.mu.Unlock()
		return status.Errorf(codes.InvalidArgument, "rank %d has %d training examples but another rank has %d (different data?)", rank, join.TrainExamples, p.trainN)
	}
	p.joined[rank] = true
	h := &psStream{p: p, rank: rank, stream: stream, fast: framecodec.InUse(ctx), timer: time.NewTimer(p.stepTimeout)}
	defer h.timer.Stop()
	defer h.in.Release()
	if p.async != nil {
		p.mu.Unlock()
		return h.serveAsync(ctx)
	}
	step := p.shard.Step()
	p.mu.Unlock()

	if err := h.sendAnswer(psstep.Exchange{Kind: psstep.Params, Step: step}, p.shard.Params(), false); err != nil {
		return err
	}
	for ; ; step++ {
		// The shard's side of the step's exchanges (psstep.Plan): the
		// ranks' pushes in, and what psstep.Shard answers them out.
		var g *stateGather // a checkpoint that asks for the rank's state
		for _, ex := range psstep.Plan(step, p.recv.Phases(step)) {
			var err error
			if ex.Kind == psstep.Push {
				var done chan struct{}
				done, err = h.recvPhase(ctx, step, ex.Push)
				if err != nil || done == nil {
					return err // done == nil: the worker closed the stream
				}
				err = h.wait(ctx, step, done)
			} else {
				p.mu.Lock()
				v := p.round.Answer(ex)
				if ex.Kind == psstep.Params && p.gather != nil && p.gather.st.Meta.Step == ex.Step {
					g = p.gather
				}
				p.mu.Unlock()
				err = h.sendAnswer(ex, v, g != nil)
			}
			if err != nil {
				return err
			}
		}
		if g == nil {
			continue
		}
		for _, ex := range psstep.AskState(step) {
			var err error
			switch ex.Kind {
			case psstep.State:
				err = h.recvState(ctx, ex.Step, g)
			case psstep.Written:
				err = h.sendWritten(ctx, ex.Step, g)
			default:
				panic(fmt.Sprintf("paramserver: a ps state plan holds %v", ex))
			}
			if err != nil {
				return err
			}
		}
	}
}

// paramsLocked are the shard's current parameters.
func (p *jobShard) paramsLocked() []float32 {
	if p.async != nil {
		return p.async.Params()
	}
	return p.shard.Params()
}

// stepLocked is the shard's step: sync, the step it collects; async, its
// clock (the slowest rank's next step).
func (p *jobShard) stepLocked() int64 {
	if p.async != nil {
		return p.async.Clock()
	}
	return p.shard.Step()
}

// frameErr is the status of a gradient frame of rank's that does not
// fit: Aborted for a stale one (an earlier generation or step), else
// InvalidArgument.
func frameErr(rank int, err error) error {
	var mm *wire.Mismatch
	if errors.As(err, &mm) && mm.Stale {
		return status.Errorf(codes.Aborted, "rank %d: %v", rank, err)
	}
	return status.Errorf(codes.InvalidArgument, "rank %d: %v", rank, err)
}

// addErr is the status of an error the shard's core returned for rank's
// gradient: a non-finite gradient under nonfinite_policy fail stops the
// job; a stale step is Aborted; anything else is a bad push.
func (p *jobShard) addErr(rank int, err error) error {
	var stale *aggregator.StaleError
	switch {
	case errors.Is(err, aggregator.ErrNonFinite):
		p.abort(err)
		return status.Errorf(codes.InvalidArgument, "%v (nonfinite_policy fail)", err)
	case errors.As(err, &stale):
		return status.Errorf(codes.Aborted, "rank %d: %v", rank, err)
	}
	return status.Errorf(codes.InvalidArgument, "rank %d: %v", rank, err)
}
