package worker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"google.golang.org/grpc"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/aggregator/ringrpc"
	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/pipeline"
	"github.com/gradsync/gradsync/pipeline/peerrpc"
	"github.com/gradsync/gradsync/pipeline/stage"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// dataShard is the rank and world size a Trainer shards its data by: a
// pipeline job's replica and replica count (all stages of a replica train
// on the same batches), else the job's rank and world size.
func dataShard(a *pb.Assignment) (rank, world int, err error) {
	rank, world = int(a.Rank), int(a.WorldSize)
	if jobspec.LabelSharded(a.Spec) { // tplabel.go
		c := labelCoordOf(a)
		return c.replica, c.replicas, nil
	}
	if jobspec.TensorParallel(a.Spec) { // tptensor.go
		c := groupCoord(a, jobspec.TensorRanks(a.Spec))
		return c.replica, c.replicas, nil
	}
	if !jobspec.Pipelined(a.Spec) {
		return rank, world, nil
	}
	c, err := pipeline.Place(rank, world, jobspec.PipelineStages(a.Spec))
	if err != nil {
		return 0, 0, err
	}
	return c.Replica, c.Replicas, nil
}

// newNetwork builds what a rank holds of its job's model: the whole
// network, or, on a pipeline stage's rank, that stage alone
// (models.NewStage: its parameters, gradients and buffers, with the whole
// model's initial values of the stage).
func newNetwork(a *pb.Assignment, opt models.Options) (*models.Network, error) {
	if jobspec.LabelSharded(a.Spec) { // tplabel.go: the body alone
		return labelBody(a.Spec, opt)
	}
	if jobspec.TensorParallel(a.Spec) { // tptensor.go: the replicated part alone
		return tensorRest(a.Spec, opt)
	}
	if !jobspec.Pipelined(a.Spec) {
		return models.New(a.Spec.Model, opt)
	}
	c, err := pipeline.Place(int(a.Rank), int(a.WorldSize), jobspec.PipelineStages(a.Spec))
	if err != nil {
		return nil, err
	}
	net, _, err := models.NewStage(a.Spec.Model, opt, c.Stages, jobspec.PipelineBalance(a.Spec), c.Stage)
	return net, err
}

// imageShare is how many ranks train on each of a rank's images: the
// stages of a pipeline job's replica, the label shards or tensor ranks of
// a label-sharded or tensor-parallel job's (1 otherwise), so that the ranks'
// throughputs, which the coordinator sums, count each image once.
func imageShare(spec *pb.JobSpec) float64 {
	return float64(jobspec.PipelineStages(spec) * jobspec.LabelShards(spec) * jobspec.TensorRanks(spec))
}

// pipeTask is one rank's pipeline stage (pipeline.Place gives it its
// replica and stage from the ring job's assignment). Every step its
// stage.Executor runs the stage's plan over peerrpc links to the
// neighbouring stages of its replica, adding the stage's gradient into
// its gradient buffer, which holds that stage alone (the rank's network
// is built by models.NewStage); with D > 1 replicas the ranks of a stage
// all-reduce it over a ring of their own (one per stage) and divide by D;
// then each stage steps its own optimiser. No rank ever holds the whole
// model: evaluation runs the test split through the stages
// (stage.Executor.Infer) and the last stage's figures reach rank 0; the
// result's checksum is fed one stage at a time, each stage's parameters
// broadcast over the job's ring from replica 0 in turn (which also
// checks that the other replicas hold the same); checkpoints are
// assembled on rank 0 likewise (pipeckpt.go).
type pipeTask struct {
	a       *pb.Assignment
	env     *taskEnv
	net     *models.Network
	obj     objective
	spec    *pb.JobSpec
	coord   pipeline.Coord
	stages  []models.Stage
	st      models.Stage
	plan    pipeline.Plan
	batch   int // a replica's step batch (batch_size)
	micro   int
	total   int64
	timeout time.Duration

	world *ringrpc.Ring // every rank of the job
	group *ringrpc.Ring // this stage's replicas; nil when D = 1
	conn  *grpc.ClientConn
	prev  *peerrpc.Link
	next  *peerrpc.Link
	exec  *stage.Executor
	optim optim.Stepper
	opt   aggregator.Options
	ckpt  *checkpointer // nil: the job writes none
	snaps *jobSnapshots // this rank's, kept by the worker across generations (piperecover.go)

	x, lx  []float32 // the first stage's batch; the last stage's micro-batch (for the targets)
	padded []int
	steps  int64 // optimiser steps taken
	seq    int64 // tags the world ring's collectives
	lossv  []float32
	ps     pipeStats
	sum    uint64 // the whole model's checksum when last computed (wholeChecksum)
	pass   int64  // numbers the evaluation passes (Infer), one per test batch
}

// pipeStats are a stage's cumulative figures.
type pipeStats struct {
	steps                     int64
	busy, wall                time.Duration
	peakInFlight              int
	bytesToPrev, bytesToNext  int64
	bytesFromPrev, bytesFromN int64
}

// bubble is the stage's idle share of its steps' time.
func (p pipeStats) bubble() float64 {
	if p.wall <= 0 {
		return 0
	}
	return 1 - p.busy.Seconds()/p.wall.Seconds()
}

// newPipeTask joins the job's ring and this stage's replica ring, opens
// the links to the neighbouring stages and readies the stage's executor.
func newPipeTask(ctx context.Context, a *pb.Assignment, env *taskEnv, net *models.Network, obj objective, totalSteps int64) (_ *pipeTask, err error) {
	spec := a.Spec
	c, err := pipeline.Place(int(a.Rank), int(a.WorldSize), jobspec.PipelineStages(spec))
	if err != nil {
		return nil, err
	}
	if len(a.Peers) != int(a.WorldSize) {
		return nil, fmt.Errorf("pipeline: %d peer addresses for %d ranks", len(a.Peers), a.WorldSize)
	}
	plan, err := jobspec.PipelinePlan(spec)
	if err != nil {
		return nil, err
	}
	stages, err := jobspec.PipelinePartition(spec, net)
	if err != nil {
		return nil, err
	}
	if held, _, ok := net.HeldStage(); !ok || held != c.Stage {
		return nil, fmt.Errorf("pipeline: rank %d runs stage %d but its network holds stage %d (whole: %v)", c.Rank, c.Stage, held, !ok)
	}
	p := &pipeTask{a: a, env: env, net: net, obj: obj, spec: spec, coord: c, stages: stages, st: stages[c.Stage], plan: plan,
		batch: int(spec.GetBatchSize()), total: totalSteps, optim: optim.FromSpec(spec), opt: aggregator.Options{Generation: a.Generation},
		timeout: time.Duration(spec.GetStepTimeoutSeconds() * float64(time.Second)), seq: -1, lossv: make([]float32, 1)}
	p.micro = p.batch / plan.MicroBatches
	p.snaps = &jobSnapshots{}
	if env.snaps != nil {
		p.snaps = env.snaps.forJob(a.JobId)
	}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	jctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	if p.world, err = env.ring.Join(jctx, ringrpc.RingConfig{JobID: a.JobId, Generation: a.Generation, Rank: c.Rank,
		Peers: a.Peers, DialOptions: env.peerDial}); err != nil {
		return nil, err
	}
	if c.Replicas > 1 {
		var peers []string
		for _, r := range c.StageGroup() {
			peers = append(peers, a.Peers[r])
		}
		if p.group, err = env.ring.Join(jctx, ringrpc.RingConfig{JobID: fmt.Sprintf("%s/stage-%d", a.JobId, c.Stage),
			Generation: a.Generation, Rank: c.Replica, Peers: peers, DialOptions: env.peerDial}); err != nil {
			return nil, err
		}
	}
	// Stage s accepts s−1's link, then opens its own to s+1: stage 0
	// accepts nothing, so by induction every Accept finds its Dial.
	job := p.linkJob()
	if c.Prev() >= 0 {
		if env.pipe == nil {
			return nil, errors.New("pipeline: this worker serves no Pipeline endpoint")
		}
		if p.prev, err = env.pipe.Accept(jctx, job, a.Generation, c.Stage); err != nil {
			return nil, fmt.Errorf("pipeline: stage %d waiting for stage %d (rank %d at %s): %w", c.Stage, c.Stage-1, c.Prev(), a.Peers[c.Prev()], err)
		}
	}
	if c.Next() >= 0 {
		opts := append(ringrpc.DialOptions(), env.peerDial...)
		if p.conn, err = grpc.NewClient(a.Peers[c.Next()], opts...); err != nil {
			return nil, fmt.Errorf("pipeline: stage %d's next stage address %q: %w", c.Stage, a.Peers[c.Next()], err)
		}
		if p.next, err = peerrpc.Dial(jctx, p.conn, job, a.Generation, c.Stage); err != nil {
			return nil, err
		}
	}
	fwd, bwd, err := jobspec.StageCost(spec.GetParallelism().GetPipeline().GetDebugStageCost())
	if err != nil {
		return nil, err
	}
	cfg := stage.Config{Net: net, Stages: stages, Stage: c.Stage, Plan: plan, Batch: p.batch, Cost: stage.Cost{Forward: fwd, Backward: bwd}}
	if p.prev != nil {
		cfg.Prev = p.prev
	}
	if p.next != nil {
		cfg.Next = p.next
	}
	if p.exec, err = stage.New(cfg); err != nil {
		return nil, err
	}
	if c.Stage == 0 {
		p.x = make([]float32, p.batch*net.InputSize())
	}
	if c.Stage == c.Stages-1 {
		p.lx = make([]float32, p.micro*net.InputSize())
	}
	env.log.Debug("pipeline stage ready", "job", a.JobId, "rank", c.Rank, "replica", c.Replica, "stage", c.Stage,
		"stages", c.Stages, "replicas", c.Replicas, "schedule", plan.Schedule, "micro_batches", plan.MicroBatches,
		"first_block", p.st.Blocks[0].Name, "params", p.st.ParamLen)
	return p, nil
}

// linkJob names the links of this rank's replica (each replica is a
// pipeline of its own).
func (p *pipeTask) linkJob() string { return fmt.Sprintf("%s/replica-%d", p.a.JobId, p.coord.Replica) }

func (p *pipeTask) start(ctx context.Context, from resumeFrom) (origin, error) {
	if p.a.CheckpointDir != "" {
		p.ckpt = &checkpointer{dir: p.a.CheckpointDir, spec: p.spec, jobID: p.a.JobId, world: int(p.a.WorldSize), lastSave: time.Now(), meta: p.env.modelMeta}
	}
	ckptStep := int64(-1)
	if from.ckpt != nil {
		ckptStep = from.at.step
	}
	sp, err := p.agree(ctx, ckptStep, p.a.TrainedSteps)
	if err != nil {
		return origin{}, err
	}
	at := from.at
	switch sp.source {
	case fromMemory:
		at = position{step: sp.step, epoch: sp.epoch, consumed: sp.consumed}
		p.steps = at.step
		p.env.log.Info("resumed from an in-memory snapshot", "job", p.a.JobId, "generation", p.a.Generation, "stage", p.coord.Stage,
			"step", at.step, "newest_step", sp.newest, "epoch", at.epoch, "consumed", at.consumed, "seconds", sp.took.Seconds())
	case fromCheckpoint:
		// Every rank reads the whole model and keeps its stage's part of
		// the optimiser state: a checkpoint does not depend on the cut.
		if err := p.restoreStage(from.ckpt); err != nil {
			return origin{}, err
		}
		p.steps = at.step
	}
	p.total = from.plan.total(at)
	p.reportStart(sp, at)
	// The state this generation starts from is its first snapshot.
	p.snaps.reset()
	p.snapshot(at)
	// Every replica of a stage built (or loaded) the same part of the
	// model: check they agree (and know the checksum, should training
	// already be over).
	if err := p.wholeChecksum(ctx); err != nil {
		return origin{}, err
	}
	return origin{at: at, source: sp.source}, nil
}

func (p *pipeTask) beginStep(context.Context, []float32) (func(int), error) { return nil, nil }

// forwardBackward is the stage's part of one
// pipeline step over batch (padded cyclically to the step batch when the
// epoch's last batch is short: the executor's micro-batches are equal).
func (p *pipeTask) forwardBackward(ctx context.Context, step int64, epoch int, batch []int) (float32, error) {
	if len(batch) == 0 {
		return 0, errors.New("pipeline: an empty batch (this replica has no examples left)")
	}
	if len(batch) < p.batch {
		p.padded = p.padded[:0]
		for i := range p.batch {
			p.padded = append(p.padded, batch[i%len(batch)])
		}
		batch = p.padded
	}
	in := stage.Input{}
	if p.x != nil {
		if err := p.obj.batch(batch, p.x, epoch); err != nil {
			return 0, err
		}
		in.X = p.x
	}
	var lossErr error
	if p.lx != nil {
		in.Loss = func(mb int, logits, dlogits []float32) float32 {
			if err := p.obj.batch(batch[mb*p.micro:(mb+1)*p.micro], p.lx, epoch); err != nil && lossErr == nil {
				lossErr = err
			}
			return p.obj.loss(logits, p.micro, dlogits)
		}
	}
	sctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	start := time.Now()
	st, err := p.exec.Step(sctx, step, in)
	if err != nil {
		return 0, err
	}
	if lossErr != nil {
		return 0, lossErr
	}
	p.ps.steps++
	p.ps.busy += st.Busy
	p.ps.peakInFlight = max(p.ps.peakInFlight, st.PeakInFlight)
	p.ps.bytesToPrev += st.BytesToPrev
	p.ps.bytesToNext += st.BytesToNext
	p.ps.bytesFromPrev += st.BytesFromPrev
	p.ps.bytesFromN += st.BytesFromNext
	// The loss is the last stage's: every rank hears the replicas' mean.
	p.lossv[0] = 0
	if p.lx != nil {
		p.lossv[0] = st.Loss / float32(p.coord.Replicas)
	}
	if err := p.worldCollective(sctx, func(ctx context.Context, seq int64) error {
		return aggregator.AllReduce(ctx, p.world, p.lossv, seq, p.opt)
	}); err != nil {
		return 0, fmt.Errorf("sharing the step's loss: %w", err)
	}
	// The step's time on this stage's timeline runs to the step's end on
	// every stage (the loss all-reduce): a stage that finished its plan
	// early waits out the flush, which is bubble too.
	p.ps.wall += time.Since(start)
	return p.lossv[0], nil
}

// step averages the stage's gradient over its replicas and steps the
// stage's optimiser on the stage's parameters (grads and params hold the
// stage alone).
func (p *pipeTask) step(ctx context.Context, grads, params []float32) error {
	g := grads
	if p.group != nil {
		sctx, cancel := context.WithTimeout(ctx, p.timeout)
		defer cancel()
		if err := aggregator.AllReduce(sctx, p.group, g, p.steps, p.opt); err != nil {
			return fmt.Errorf("all-reducing stage %d's gradients over its %d replicas: %w", p.coord.Stage, p.coord.Replicas, err)
		}
		inv := 1 / float32(p.coord.Replicas)
		for i := range g {
			g[i] *= inv
		}
	}
	for _, v := range g {
		if v-v != 0 {
			return fmt.Errorf("%w at step %d in stage %d", aggregator.ErrNonFinite, p.steps, p.coord.Stage)
		}
	}
	p.optim.SetLR(float32(optim.LearningRate(p.spec, p.steps, p.total)))
	p.optim.Step(params, g)
	p.steps++
	return nil
}

// completed writes a checkpoint when one is due, and after an epoch and
// after the last step computes the whole model's checksum with the other
// stages (every rank's result holds it).
func (p *pipeTask) completed(ctx context.Context, epoch int, at position) error {
	p.snapshot(at)
	if err := p.checkpoint(ctx, epoch, at); err != nil {
		return err
	}
	if at.epoch > epoch || at.step >= p.total {
		return p.wholeChecksum(ctx)
	}
	return nil
}

// checksum implements synchronizer: the whole model's checksum, computed
// with the other stages after the last step (params hold this stage
// alone).
func (p *pipeTask) checksum([]float32) uint64 { return p.sum }

func (p *pipeTask) stopped(context.Context, position) {}

func (p *pipeTask) stats() syncStats {
	st := syncStats{snapshots: p.snaps.taken, snapshotCopying: p.snaps.copying}
	if p.world != nil {
		_, st.leftWait = p.world.WaitStats()
	}
	if p.exec != nil {
		st.stage = p.figures()
	}
	return st
}

func (p *pipeTask) close() {
	p.report()
	for _, l := range []*peerrpc.Link{p.prev, p.next} {
		if l != nil {
			l.Close()
		}
	}
	if p.conn != nil {
		p.conn.Close()
	}
	for _, r := range []*ringrpc.Ring{p.group, p.world} {
		if r == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := r.Shutdown(ctx); err != nil {
			p.env.log.Debug("leaving a pipeline ring", "job", p.a.JobId, "err", err)
		}
		cancel()
	}
}

// worldCollective runs one collective on the job's ring under the step
// timeout, tagged with the next of this task's own sequence numbers.
func (p *pipeTask) worldCollective(ctx context.Context, f func(ctx context.Context, seq int64) error) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	err := f(ctx, p.seq)
	p.seq--
	return err
}

// wholeChecksum computes the whole model's parameter checksum
// (models.Checksum of the whole flat buffer) into p.sum without any rank
// holding the whole model: stage after stage, replica 0's rank of the
// stage broadcasts its parameters over the job's ring and every rank
// feeds them to its Checksummer (a broadcast copies: the bits arrive
// unchanged). The stage's other replicas check that they hold the same.
func (p *pipeTask) wholeChecksum(ctx context.Context) error {
	c := models.NewChecksummer()
	longest := 0
	for _, st := range p.stages {
		longest = max(longest, st.ParamLen)
	}
	buf := make([]float32, longest)
	own := p.net.Params()
	for s, st := range p.stages {
		b := buf[:st.ParamLen]
		root := p.coord.RankOf(0, s)
		if root == p.coord.Rank {
			copy(b, own)
		}
		if err := p.worldCollective(ctx, func(ctx context.Context, seq int64) error {
			return aggregator.Broadcast(ctx, p.world, b, root, seq, p.opt)
		}); err != nil {
			return fmt.Errorf("sharing stage %d's parameters for the checksum: %w", s, err)
		}
		if s == p.coord.Stage && root != p.coord.Rank {
			for i := range b {
				if math.Float32bits(b[i]) != math.Float32bits(own[i]) {
					return fmt.Errorf("pipeline: stage %d's parameters differ between replicas 0 and %d after step %d", s, p.coord.Replica, p.steps)
				}
			}
		}
		c.Add(b)
	}
	p.sum = c.Sum()
	return nil
}
