package worker

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/aggregator/ringrpc"
	"github.com/gradsync/gradsync/aggregator/shmring"
	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// synchronizer is how a Trainer's rank turns each step's gradient into
// the job's next parameters together with the other ranks — through the
// parameter server (psTask) or by all-reducing over a ring and stepping a
// local optimiser (ringTask) — and keeps what a restart of the job needs.
// The Trainer knows no mode: whatever differs between modes is behind
// these methods, and a mode that has nothing to do for one implements it
// as a no-op.
//
// Contract, relied on by the Trainer:
//   - start is called once, first, on every rank of the generation; it
//     may run collectives with the other ranks, so every rank calls it.
//     It brings the model (and the synchronizer's own state: optimiser,
//     compression) to where the generation starts and says where that
//     is.
//   - Then every step is beginStep, forward and backward (backward's
//     progress goes to the function beginStep returned, unless it is
//     nil), step; then, after the step's bookkeeping, completed with the
//     position the step reached. Every rank runs the same steps in the
//     same order. After step returns nil, params hold the job's
//     parameters after that step.
//   - After an error from start, beginStep, step or completed the
//     synchronizer is unusable: only stopped, stats and close follow.
//   - stopped is called at most once, when the task ends early (its
//     context is done, or a step failed) after at least one step; it
//     keeps what it can without the other ranks and never fails (it
//     logs).
//   - stats may be called at any time between start and close.
//   - close releases everything; it is called exactly once, last.
type synchronizer interface {
	// start brings this rank to the state its generation starts from —
	// the checkpoint from names, a newer state the ranks hold in memory,
	// or the job's initial parameters — and returns where that is.
	start(ctx context.Context, from resumeFrom) (origin, error)
	// beginStep starts reducing the step's gradient grads (zeroed) while
	// backward still writes it, and returns the function backward reports
	// its progress to; nil, when the reduction waits for the whole
	// gradient (step does it all).
	beginStep(ctx context.Context, grads []float32) (ready func(from int), err error)
	// step reduces grads (this rank's gradient of the current step) and
	// leaves the next parameters in params. Its error carries what the
	// coordinator needs to find a cause elsewhere (ring: the frame counts
	// of this rank's links, *ringFailure).
	step(ctx context.Context, grads, params []float32) error
	// completed records that a step of epoch brought training to at
	// (at.epoch > epoch: the step ended the epoch) — ring: an in-memory
	// snapshot, and a checkpoint when one is due.
	completed(ctx context.Context, epoch int, at position) error
	// stopped keeps the state at at when the task stops early (ring: rank
	// 0's checkpoint), so that a resume loses nothing. ctx may be done
	// already: stopped waits on nobody.
	stopped(ctx context.Context, at position)
	// lossScale is the factor the Trainer multiplies the loss gradient
	// by before backward: the loss scaler's (ring, precision fp16), else 1.
	lossScale() float32
	// gradient computes the step's gradient of batch (examples of epoch's
	// order) into the model's gradient buffer (zeroed by the Trainer) and
	// returns the batch's mean loss. Most synchronizers call local, the
	// Trainer's own forward and backward; a pipeline stage runs its part
	// of the step across the stages' workers instead.
	gradient(ctx context.Context, step int64, epoch int, batch []int, local func() (float32, error)) (float32, error)
	// evaluate runs the test split's evaluation into res, through run
	// (the objective's evaluation of a network), and reports whether this
	// rank's res now holds it (the rank that reports the figures: rank
	// 0). Every rank calls it at the same point. Most synchronizers have
	// rank 0 run it on own, the Trainer's whole network, and the others
	// skip it; a pipeline's stages run it through the pipeline together.
	evaluate(ctx context.Context, rank int32, own forwarder, res *pb.JobResult, run func(net forwarder, into *pb.JobResult) error) (bool, error)
	// checksum is the job's parameter checksum (models.Checksum of the
	// whole flat parameter buffer) after the last step; params are the
	// Trainer's. A pipeline stage, which holds its stage alone, returns
	// the one it computed with the other stages after the last step.
	checksum(params []float32) uint64
	// stats returns the synchronizer's cumulative figures.
	stats() syncStats
	close()
}

// localGradient is the gradient of the synchronizers whose step's
// gradient is the Trainer's own forward and backward (ring and ps).
type localGradient struct{}

func (localGradient) gradient(_ context.Context, _ int64, _ int, _ []int, local func() (float32, error)) (float32, error) {
	return local()
}

// wholeModel is the evaluate and checksum of the synchronizers whose
// every rank holds the whole model (ring and ps): rank 0 evaluates its
// own network, and the checksum is that of its parameters.
type wholeModel struct{}

func (wholeModel) evaluate(_ context.Context, rank int32, own forwarder, res *pb.JobResult, run func(forwarder, *pb.JobResult) error) (bool, error) {
	if rank != 0 {
		return false, nil
	}
	return true, run(own, res)
}

func (wholeModel) checksum(params []float32) uint64 { return models.Checksum(params) }

// unscaled is the lossScale of the synchronizers without a loss scaler.
type unscaled struct{}

func (unscaled) lossScale() float32 { return 1 }

// gradient implements synchronizer for a pipeline stage: its part of the
// step runs across the stages' workers (forwardBackward), not locally.
func (p *pipeTask) gradient(ctx context.Context, step int64, epoch int, batch []int, _ func() (float32, error)) (float32, error) {
	return p.forwardBackward(ctx, step, epoch, batch)
}

// lossScale implements synchronizer: a pipeline stage scales no loss.
func (*pipeTask) lossScale() float32 { return 1 }

// resumeFrom is what a task is told to start from.
type resumeFrom struct {
	ckpt *checkpoint.State // the checkpoint the assignment names; nil: none
	at   position          // where it stopped (zero without one)
	plan stepPlan          // counts the steps from wherever training starts
}

// Where a generation's starting state comes from (origin.source).
const (
	fromMemory     = "memory"
	fromCheckpoint = "checkpoint"
	fromScratch    = "scratch"
)

// origin is where a task's training starts, and from what state.
type origin struct {
	at     position
	source string // fromMemory, fromCheckpoint or fromScratch
}

// syncStats are a synchronizer's cumulative figures, for progress
// reports and the result; those a mode does not have are zero.
type syncStats struct {
	compress  compress.Stats // bytes before and after compression, and its time
	staleness psStats        // ps: the receipts of async and bounded shards
	leftWait  time.Duration  // ring: time waited for the left neighbour
	// ring: in-memory snapshots taken since the worker got the job, and
	// the time spent copying them.
	snapshots       int64
	snapshotCopying time.Duration
	// ring with precision fp16: steps the loss scaler skipped, and its
	// scale now (0: no scaler)
	skipped   int64
	lossScale float32
	// stage is a pipeline stage's figures (nil on other ranks).
	stage *stageFigures
}

// psStart is what a ps rank tells the parameter server as it joins: the
// step it starts at (a resumed checkpoint's, else 0) and the size of the
// training split (from which the server, which writes ps checkpoints,
// knows the sampler position after each step).
type psStart struct {
	step          int64
	trainExamples int
}

// startSync joins the job's synchroniser: the parameter-server shards
// (which send the initial parameters), or the ring (start then brings
// every rank to the same state).
func startSync(ctx context.Context, a *pb.Assignment, env *taskEnv, net *models.Network, totalSteps int64, ps psStart) (synchronizer, error) {
	switch mode := a.Spec.GetMode(); mode {
	case "ps":
		c, err := joinPS(ctx, env, a, net, totalSteps, ps)
		if err != nil {
			return nil, err
		}
		return &psTask{psClient: c, log: env.log}, nil
	case "ring":
		jr, err := joinRing(ctx, a, env)
		if err != nil {
			return nil, err
		}
		algo, why := ringAlgorithm(a.Spec.GetCollective().GetAlgorithm(), env.algo)
		lvl := slog.LevelInfo
		if asked, _ := aggregator.ParseAlgorithm(cmp.Or(env.algo, a.Spec.GetCollective().GetAlgorithm())); asked != aggregator.AlgoAuto && asked != algo {
			lvl = slog.LevelWarn // a forced algorithm that does not run is said loudly (nccl#1304)
		}
		env.log.Log(ctx, lvl, "collective algorithm", "job", a.JobId, "rank", a.Rank, "world", len(a.Peers),
			"spec", a.Spec.GetCollective().GetAlgorithm(), "GRADSYNC_ALGO", env.algo, "runs", algo, "why", why)
		leave := jr.leave
		rs, err := newRingSync(ctx, jr.data, leave, a, net, totalSteps, env.metrics)
		if err != nil {
			leave()
			return nil, err
		}
		if env.trace != nil {
			rs.setTrace(env.trace)
		}
		return newRingTask(rs, a, env, net), nil
	default:
		return nil, fmt.Errorf("mode %q is not supported by this worker", mode)
	}
}

// joinedRing is a ring rank's collectives: the gRPC ring it joined and,
// where the job asks for shared memory and every rank could move there,
// the shared-memory ring the collectives then run over.
type joinedRing struct {
	grpc *ringrpc.Ring
	shm  *shmring.Ring   // nil: the collectives stay on gRPC
	data aggregator.Ring // shm if set, else grpc
	log  *slog.Logger
}

// joinRing joins rank a.Rank's ring and, for collective.transport shm or
// auto, negotiates its shared-memory data plane. Ring-mode Trainers and
// entrypoint jobs' agents both start their collectives here.
func joinRing(ctx context.Context, a *pb.Assignment, env *taskEnv) (*joinedRing, error) {
	r, err := env.ring.Join(ctx, ringrpc.RingConfig{JobID: a.JobId, Generation: a.Generation, Rank: int(a.Rank),
		Peers: a.Peers, DialOptions: env.peerDial})
	if err != nil {
		return nil, err
	}
	jr := &joinedRing{grpc: r, data: r, log: env.log.With("job", a.JobId, "rank", a.Rank)}
	if jobspec.SharedMemory(a.Spec) {
		shm, err := moveToSharedMemory(ctx, r, a, env)
		if err != nil {
			r.Close()
			return nil, err
		}
		if shm != nil {
			jr.shm, jr.data = shm, shm
		}
	}
	return jr, nil
}

// brokenErr is why the gRPC ring broke out of order (a neighbour left
// it), nil while it is whole.
func (j *joinedRing) brokenErr() error { return j.grpc.BrokenErr() }

// leave leaves the ring gracefully: the neighbours may still need the
// last frames; the gRPC ring's Shutdown waits for them (bounded), then
// closes.
func (j *joinedRing) leave() {
	if j.shm != nil {
		j.shm.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := j.grpc.Shutdown(ctx); err != nil {
		j.log.Debug("leaving the ring", "err", err)
	}
}

// abort breaks the ring at once: the rank failed, its peers need nothing
// more from it, and an orderly shutdown would wait for them.
func (j *joinedRing) abort() {
	if j.shm != nil {
		j.shm.Close()
	}
	j.grpc.Close()
}

// ringAlgorithm returns the all-reduce algorithm a ring task's training
// runs, given the spec's collective.algorithm and the worker's override
// (GRADSYNC_ALGO; "" follows the spec), and why. It is always the ring:
// the training ring (ringrpc, or shmring after negotiation) links each
// rank to its neighbours only, and the halving-doubling and tree
// algorithms need an aggregator.Peers between every pair that talks,
// which the worker does not set up yet. jobspec refuses those two values
// in the spec; the override can still ask for them, and is then told no.
func ringAlgorithm(spec, override string) (aggregator.Algorithm, string) {
	asked, from := spec, "collective.algorithm"
	if override != "" {
		asked, from = override, "GRADSYNC_ALGO"
	}
	a, err := aggregator.ParseAlgorithm(asked)
	switch {
	case err != nil:
		return aggregator.AlgoRing, fmt.Sprintf("%s: %v; the ring runs", from, err)
	case a == aggregator.AlgoRing:
		return aggregator.AlgoRing, from + " asks for the ring"
	case a == aggregator.AlgoAuto:
		return aggregator.AlgoRing, "auto: the training ring links neighbours only, so the ring is the one algorithm it carries"
	}
	return aggregator.AlgoRing, fmt.Sprintf("%s asks for %v, which needs peer-to-peer links the training ring does not have yet; the ring runs", from, a)
}

// moveToSharedMemory negotiates the ring's shared-memory data plane
// (collective.transport shm or auto) over the gRPC ring ctl that has
// just formed: the ring to train over, or nil where the ranks stay on
// gRPC (every rank then logs the same reason). Only a failure of ctl
// itself is an error.
func moveToSharedMemory(ctx context.Context, ctl aggregator.Ring, a *pb.Assignment, env *taskEnv) (*shmring.Ring, error) {
	nctx, cancel := context.WithTimeout(ctx, time.Duration(a.Spec.GetStepTimeoutSeconds()*float64(time.Second)))
	defer cancel()
	shm, why, err := shmring.Negotiate(nctx, ctl, shmring.Config{JobID: a.JobId, Generation: a.Generation, Log: env.log},
		aggregator.Options{Generation: a.Generation})
	if err != nil {
		return nil, fmt.Errorf("negotiating the shared-memory transport: %w", err)
	}
	if shm == nil {
		env.log.Warn("collectives stay on gRPC", "job", a.JobId, "rank", a.Rank, "transport", a.Spec.GetCollective().GetTransport(), "why", why)
		return nil, nil
	}
	env.log.Info("collectives over shared memory", "job", a.JobId, "rank", a.Rank, "ranks", shm.Size(),
		"transport", a.Spec.GetCollective().GetTransport(), "why", "every rank is on this host and linked its segments")
	return shm, nil
}
