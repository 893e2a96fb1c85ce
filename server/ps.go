package server

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/internal/wire"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// psJob is aggregator shard 0 of one running job in ps mode: the
// synchronous shard plus what the gRPC handlers need to wait on it.
type psJob struct {
	jobID       string
	gen         uint64
	world       int
	total       int
	stepTimeout time.Duration

	spec *pb.JobSpec
	opt  jobspec.Stepper
	ckpt *psCheckpointer // nil: the job writes no checkpoints

	mu         sync.Mutex // guards shard, opt, done, joined, totalSteps, trainN, stopped
	shard      *aggregator.SyncShard
	totalSteps int64         // from the first join; every rank must agree
	trainN     int64         // training examples, from the first join; every rank must agree
	done       chan struct{} // closed when the current step's update is applied (and checkpointed, when due)
	joined     []bool
	lags       arrivalLags // guarded by mu: how late each rank's gradient arrives
	stopped    bool        // set by abort: the shard takes no more gradients

	abortOnce sync.Once
	aborted   chan struct{} // closed by abort
	abortErr  error         // set before aborted is closed
}

// psCheckpointer writes a ps job's checkpoints. The server holds the
// parameters and the optimiser state, so it writes them, in the same
// format and folder as a ring job's rank 0 (see worker/checkpoint.go):
// after a step when the spec says (jobspec.CheckpointDue), and at the last
// applied step when the job stops early. The sampler position comes from
// the step count (data.Position), as every rank trains the same number
// of steps in lockstep. Batch norm's running statistics live on each
// worker in ps mode and are not synchronised: a checkpoint holds those
// the job started with.
type psCheckpointer struct {
	dir   string
	keep  int
	hash  string
	jobID string
	seed  int64
	net   *models.Network // the parameter layout and buffers; read only

	// Where the shard started: step, epoch and consumed positions of
	// the resumed checkpoint, or zeros.
	startStep     int64
	startEpoch    int
	startConsumed int64

	mu        sync.Mutex // serialises Saves; guards lastSave, savedStep
	lastSave  time.Time
	savedStep int64 // the step of the newest checkpoint on disk
}

// newPSJob builds the parameter server of a job's generation from net's
// parameters, or, with resumeFrom, from that checkpoint (parameters,
// optimiser state and step). ckptDir "" means no checkpoints.
func newPSJob(jobID string, gen uint64, world int, net *models.Network, spec *pb.JobSpec, ckptDir, resumeFrom string, now time.Time) (*psJob, error) {
	opt := jobspec.NewOptimizer(spec)
	var start checkpoint.Meta
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
		switch o := opt.(type) {
		case *optim.SGD:
			err = st.RestoreSGD(o, net.Segments())
		case *optim.Adam:
			err = st.RestoreAdam(o, net.Segments())
		}
		if err != nil {
			return nil, fmt.Errorf("checkpoint %s: optimiser state: %w", resumeFrom, err)
		}
		start = st.Meta
	}
	params := append([]float32(nil), net.Params()...)
	p := &psJob{
		jobID: jobID, gen: gen, world: world, total: len(params), spec: spec, opt: opt,
		stepTimeout: time.Duration(spec.GetStepTimeoutSeconds() * float64(time.Second)),
		shard:       aggregator.NewSyncShard(params, world, opt, spec.GetNonfinitePolicy() == "skip"),
		done:        make(chan struct{}), joined: make([]bool, world), aborted: make(chan struct{}),
	}
	p.shard.StartAt(start.Step)
	if ckptDir != "" {
		p.ckpt = &psCheckpointer{dir: ckptDir, keep: int(spec.GetCheckpoint().GetKeep()), hash: jobspec.CheckpointHash(spec),
			jobID: jobID, seed: spec.GetSeed(), net: net, startStep: start.Step, startEpoch: start.Epoch,
			startConsumed: start.EpochConsumed, lastSave: now, savedStep: start.Step}
	}
	return p, nil
}

// abort stops the job's parameter server: the shard takes no more
// gradients (its state stays that after the last applied step, for
// saveStopped) and every stream waiting on it returns.
func (p *psJob) abort(err error) {
	p.abortOnce.Do(func() {
		p.mu.Lock()
		p.abortErr = err
		p.stopped = true
		p.mu.Unlock()
		close(p.aborted)
	})
}

// captureLocked copies the shard's state into a checkpoint: the
// parameters after Step() steps, the optimiser's state and the workers'
// sampler position then. p.ckpt must be set and a rank must have joined.
func (p *psJob) captureLocked() *checkpoint.State {
	c := p.ckpt
	step := p.shard.Step()
	epoch, consumed, _ := data.Position(int(p.trainN), p.world, jobspec.StepBatch(p.spec), c.startEpoch, c.startConsumed, step-c.startStep)
	st := &checkpoint.State{
		Meta: checkpoint.Meta{JobID: c.jobID, SpecHash: c.hash, Step: step, Epoch: epoch, EpochConsumed: consumed,
			WorldSize: p.world, Seed: c.seed},
		Tensors: map[string]checkpoint.Tensor{},
	}
	checkpoint.PutFlat(st.Tensors, "", c.net.Segments(), p.shard.Params())
	checkpoint.PutFlat(st.Tensors, "", c.net.BufferSegments(), c.net.Buffers())
	switch o := p.opt.(type) {
	case *optim.SGD:
		st.CaptureSGD(o, c.net.Segments())
	case *optim.Adam:
		st.CaptureAdam(o, c.net.Segments())
	}
	return st
}

// dueLocked returns the checkpoint to write after the step the shard just
// applied, or nil when none is due.
func (p *psJob) dueLocked(now time.Time) *checkpoint.State {
	c := p.ckpt
	if c == nil {
		return nil
	}
	step := p.shard.Step()
	epoch, _, end := data.Position(int(p.trainN), p.world, jobspec.StepBatch(p.spec), c.startEpoch, c.startConsumed, step-c.startStep)
	if end {
		epoch-- // the epoch that ended
	}
	c.mu.Lock()
	since := now.Sub(c.lastSave)
	c.mu.Unlock()
	if !jobspec.CheckpointDue(p.spec, step, end, epoch, since) {
		return nil
	}
	return p.captureLocked()
}

// save writes st unless a checkpoint of its step is already on disk (the
// stop checkpoint and a due one can capture the same step); it returns
// the new folder, or "" when it wrote nothing.
func (c *psCheckpointer) save(st *checkpoint.State, now time.Time) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.Meta.Step == c.savedStep {
		return "", nil
	}
	path, err := checkpoint.Save(c.dir, st, c.keep)
	if path != "" { // written, even if pruning older ones failed
		c.savedStep, c.lastSave = st.Meta.Step, now
	}
	return path, err
}

// saveStopped writes a checkpoint of the state after the last applied step
// of a job that stops early (after abort), so that a resume loses nothing.
// It writes nothing ("", nil) for a job without checkpoints or that took
// no step since it started.
func (p *psJob) saveStopped(now time.Time) (string, error) {
	if p.ckpt == nil {
		return "", nil
	}
	p.mu.Lock()
	if !p.stopped || p.trainN == 0 || p.shard.Step() == p.ckpt.startStep {
		p.mu.Unlock()
		return "", nil
	}
	st := p.captureLocked()
	p.mu.Unlock()
	return p.ckpt.save(st, now)
}

// missing lists the ranks whose gradient for the current step is not in.
func (p *psJob) missingLocked(have []bool) []int {
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

// Sync serves one worker's push/pull stream for one job (see ps.proto).
func (s *Server) Sync(stream pb.ParameterServer_SyncServer) error {
	ctx := stream.Context()
	m, err := stream.Recv()
	if err != nil {
		return err
	}
	join := m.GetJoin()
	if join == nil {
		return status.Error(codes.InvalidArgument, "the first message on Sync must be a join")
	}
	s.mu.Lock()
	e := s.jobs[join.JobId]
	var p *psJob
	var state pb.JobState
	if e != nil {
		p, state = e.ps, e.job.State
	}
	s.mu.Unlock()
	switch {
	case e == nil:
		return status.Errorf(codes.NotFound, "job %q not found", join.JobId)
	case state != pb.JobState_JOB_STATE_RUNNING || p == nil:
		return status.Errorf(codes.FailedPrecondition, "job %s is not running on this parameter server", join.JobId)
	case join.Generation != p.gen:
		return status.Errorf(codes.Aborted, "generation %d is stale; the job is at generation %d", join.Generation, p.gen)
	case join.Rank < 0 || int(join.Rank) >= p.world:
		return status.Errorf(codes.InvalidArgument, "rank %d out of range [0,%d)", join.Rank, p.world)
	case int(join.WorldSize) != p.world:
		return status.Errorf(codes.InvalidArgument, "world size %d, the job has %d", join.WorldSize, p.world)
	case join.NumParams != int64(p.total):
		return status.Errorf(codes.InvalidArgument, "model has %d parameters, the server's has %d", join.NumParams, p.total)
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
	}
	if join.TrainExamples != p.trainN {
		p.mu.Unlock()
		return status.Errorf(codes.InvalidArgument, "rank %d has %d training examples but another rank has %d (different data?)", rank, join.TrainExamples, p.trainN)
	}
	p.joined[rank] = true
	step := p.shard.Step()
	params := p.shard.Params()
	p.mu.Unlock()

	var sp wire.Splitter
	sendParams := func(step int64) error {
		return sp.Frames(&pb.TensorFrame{JobId: p.jobID, Generation: p.gen, Op: pb.Op_OP_PULL_PARAMETERS, Step: step},
			params, func(f *pb.TensorFrame) error { return stream.Send(&pb.SyncResponse{Parameters: f}) })
	}
	if err := sendParams(step); err != nil {
		return err
	}
	want := wire.Expect{JobID: p.jobID, Generation: p.gen, Op: pb.Op_OP_PUSH_GRADIENT, Total: uint64(p.total)}
	timer := time.NewTimer(p.stepTimeout)
	defer timer.Stop()
	for {
		want.Step = step
		var done chan struct{}
		for {
			m, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return nil // the worker is done with this job
			}
			if err != nil {
				return err
			}
			f := m.GetGradient()
			if f == nil {
				return status.Error(codes.InvalidArgument, "expected a gradient frame")
			}
			off, n, err := wire.Check(f, want)
			if err != nil {
				var mm *wire.Mismatch
				if errors.As(err, &mm) && mm.Stale {
					return status.Errorf(codes.Aborted, "rank %d: %v", rank, err)
				}
				return status.Errorf(codes.InvalidArgument, "rank %d: %v", rank, err)
			}
			if f.Last && off+n != p.total {
				return status.Errorf(codes.InvalidArgument, "rank %d: last frame ends at %d of %d elements", rank, off+n, p.total)
			}
			select {
			case <-p.aborted:
				return abortedStatus(p.abortErr)
			default:
			}
			p.mu.Lock()
			if p.stopped {
				p.mu.Unlock()
				return abortedStatus(p.abortErr)
			}
			done = p.done
			p.opt.SetLR(float32(jobspec.LearningRate(p.spec, step, p.totalSteps)))
			skipped := p.shard.Skipped()
			applied, err := p.shard.Add(rank, step, off, n, func(dst []float32) error { return wire.AddF32(dst, f.Data) })
			if f.Last && err == nil {
				p.lags.arrived(rank, p.world, s.cfg.Now(), applied)
			}
			if p.shard.Skipped() > skipped {
				s.cfg.Metrics.NonFiniteStepSkipped()
				s.log.Warn("step skipped: gradient holds NaN or Inf (nonfinite_policy skip)", "job", p.jobID, "step", step)
			}
			var due *checkpoint.State
			if applied && err == nil {
				due = p.dueLocked(s.cfg.Now())
			}
			if applied && due == nil {
				close(p.done)
				p.done = make(chan struct{})
			}
			p.mu.Unlock()
			if due != nil {
				// Every rank waits for the next parameters until the
				// checkpoint is on disk, so the shard cannot move past
				// it meanwhile (as ring ranks wait for their rank 0).
				path, err := p.ckpt.save(due, s.cfg.Now())
				switch {
				case err != nil && path == "":
					// As in ring mode, a checkpoint the spec asks for
					// that cannot be written fails the job.
					err = fmt.Errorf("step %d: writing a checkpoint: %w", due.Meta.Step, err)
					p.abort(err)
					return status.Error(codes.Internal, err.Error())
				case err != nil:
					s.log.Warn("checkpoint written, but removing older ones failed", "job", p.jobID, "err", err)
				default:
					s.log.Debug("checkpoint written", "job", p.jobID, "path", path)
				}
				p.mu.Lock()
				close(p.done)
				p.done = make(chan struct{})
				p.mu.Unlock()
			}
			if err != nil {
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
			if f.Last {
				break
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(p.stepTimeout)
		select {
		case <-done:
		case <-p.aborted:
			return abortedStatus(p.abortErr)
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-timer.C:
			p.mu.Lock()
			var missing []int
			if p.shard.Step() == step {
				missing = p.missingLocked(p.shard.Complete())
			}
			p.mu.Unlock()
			err := fmt.Errorf("step %d: rank(s) %v sent no gradient within the step timeout of %v", step, missing, p.stepTimeout)
			p.abort(err)
			return status.Error(codes.DeadlineExceeded, err.Error())
		}
		step++
		if err := sendParams(step); err != nil {
			return err
		}
	}
}

// Pull streams a snapshot of a running ps job's parameters.
func (s *Server) Pull(req *pb.PullRequest, stream pb.ParameterServer_PullServer) error {
	s.mu.Lock()
	e := s.jobs[req.JobId]
	var p *psJob
	if e != nil && e.job.State == pb.JobState_JOB_STATE_RUNNING {
		p = e.ps
	}
	s.mu.Unlock()
	if e == nil {
		return status.Errorf(codes.NotFound, "job %q not found", req.JobId)
	}
	if p == nil {
		return status.Errorf(codes.FailedPrecondition, "job %s is not running on this parameter server", req.JobId)
	}
	p.mu.Lock()
	snap := append([]float32(nil), p.shard.Params()...)
	step := p.shard.Step()
	p.mu.Unlock()
	var sp wire.Splitter
	return sp.Frames(&pb.TensorFrame{JobId: p.jobID, Generation: p.gen, Op: pb.Op_OP_PULL_PARAMETERS, Step: step},
		snap, func(f *pb.TensorFrame) error { return stream.Send(&pb.PullResponse{Parameters: f}) })
}
