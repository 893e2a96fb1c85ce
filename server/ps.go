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
	"github.com/gradsync/gradsync/internal/wire"
	"github.com/gradsync/gradsync/jobspec"
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

	mu         sync.Mutex // guards shard, opt, done, joined, totalSteps
	shard      *aggregator.SyncShard
	totalSteps int64         // from the first join; every rank must agree
	done       chan struct{} // closed when the current step's update is applied
	joined     []bool
	lags       arrivalLags // guarded by mu: how late each rank's gradient arrives

	abortOnce sync.Once
	aborted   chan struct{} // closed by abort
	abortErr  error         // set before aborted is closed
}

func newPSJob(jobID string, gen uint64, world int, initial []float32, spec *pb.JobSpec) *psJob {
	opt := jobspec.NewOptimizer(spec)
	params := append([]float32(nil), initial...)
	return &psJob{
		jobID: jobID, gen: gen, world: world, total: len(params), spec: spec, opt: opt,
		stepTimeout: time.Duration(spec.GetStepTimeoutSeconds() * float64(time.Second)),
		shard:       aggregator.NewSyncShard(params, world, opt, spec.GetNonfinitePolicy() == "skip"),
		done:        make(chan struct{}), joined: make([]bool, world), aborted: make(chan struct{}),
	}
}

func (p *psJob) abort(err error) {
	p.abortOnce.Do(func() {
		p.abortErr = err
		close(p.aborted)
	})
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
			if applied {
				close(p.done)
				p.done = make(chan struct{})
			}
			p.mu.Unlock()
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
