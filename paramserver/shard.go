package paramserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/data"
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

	mu         sync.Mutex             // guards shard, async, opt, recv, grad, pFactor, qFactor, gather, done, joined, totalSteps, trainN, stopped
	shard      *aggregator.SyncShard  // consistency sync; nil otherwise
	async      *aggregator.AsyncShard // consistency async and bounded; nil for sync
	recv       *compress.PSReceiver   // decodes the compressed pushes; PowerSGD's server half
	grad       []float32              // PowerSGD: the averaged gradient CombineQ forms
	pFactor    []float32              // PowerSGD: the current step's P, once its phase 1 is summed
	qFactor    []float32              // PowerSGD: the last step's averaged Q, once applied
	gather     *stateGather           // a due checkpoint waiting for the ranks' compression state
	totalSteps int64                  // from the first join; every rank must agree
	trainN     int64                  // training examples, from the first join; every rank must agree
	done       chan struct{}          // sync: closed when the current step's update is applied (and checkpointed, when due); async: when any gradient is applied or a rank finishes
	joined     []bool
	lags       arrivalLags // guarded by mu: how late each rank's gradient arrives
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
	recv, err := compress.NewPSReceiver(spec.GetCompression(), segs, world)
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
		recv: recv, grad: make([]float32, len(params)), env: env,
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
	}
	if p.async != nil && (ckptDir != "" || resumeFrom != "") {
		return nil, errors.New("checkpoints need consistency sync")
	}
	if ckptDir != "" {
		p.ckpt = &psCheckpointer{dir: ckptDir, keep: int(spec.GetCheckpoint().GetKeep()), hash: jobspec.CheckpointHash(spec),
			jobID: jobID, seed: spec.GetSeed(), net: net, startStep: start.Step, startEpoch: start.Epoch,
			startConsumed: start.EpochConsumed, lastSave: env.Now(), savedStep: start.Step}
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

// captureLocked copies the shard's state into a checkpoint: the
// parameters after Step() steps, the optimiser's state and the workers'
// sampler position then. p.ckpt must be set and a rank must have joined.
func (p *jobShard) captureLocked() *checkpoint.State {
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
	// Compression state: the shared part is the server's (PowerSGD's Q
	// it last sent); the ranks' own (error feedback) is gathered by
	// dueLocked's caller, and a checkpoint of a stopped job has none (a
	// resume starts those residuals at zero, logged by the workers).
	st.Extra = map[string]checkpoint.Tensor{}
	if q := p.recv.Shared(); q != nil {
		st.Extra[compress.CheckpointShared] = models.F32Tensor([]int{len(q)}, q)
	}
	st.CaptureOptimizer(p.opt, c.net.Segments())
	return st
}

// dueLocked returns the checkpoint to write after the step the shard just
// applied, or nil when none is due.
func (p *jobShard) dueLocked(now time.Time) *checkpoint.State {
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

// save writes st unless a checkpoint of its step or a later one is
// already on disk (the stop checkpoint and a due one can capture the same
// step); it returns the new folder, or "" when it wrote nothing.
func (c *psCheckpointer) save(st *checkpoint.State, now time.Time) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.Meta.Step <= c.savedStep {
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
func (p *jobShard) saveStopped(now time.Time) (string, error) {
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

	if err := h.sendParams(step, false); err != nil {
		return err
	}
	for ; ; step++ {
		// The shard's side of the step's exchanges (psstep.Plan).
		var g *stateGather // a checkpoint that asks for the rank's state
		for _, ex := range psstep.Plan(step, p.recv.Phases(step)) {
			var err error
			switch ex.Kind {
			case psstep.Push:
				var done chan struct{}
				done, err = h.recvPhase(step, ex.Push)
				if err != nil || done == nil {
					return err // done == nil: the worker closed the stream
				}
				err = h.wait(ctx, step, done)
			case psstep.Factors:
				p.mu.Lock()
				pm := p.pFactor
				p.mu.Unlock()
				err = h.sendFactors(ex.Step, ex.Phase, pm)
			case psstep.Params:
				p.mu.Lock()
				if p.gather != nil && p.gather.st.Meta.Step == ex.Step {
					g = p.gather
				}
				p.mu.Unlock()
				err = h.sendParams(ex.Step, g != nil)
			case psstep.SharedQ:
				p.mu.Lock()
				q := p.qFactor
				p.mu.Unlock()
				err = h.sendFactors(ex.Step, ex.Phase, q)
			default:
				panic(fmt.Sprintf("paramserver: a ps step plan holds %v", ex))
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
				err = h.recvState(ex.Step, g)
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

// psStream is the server's side of one rank's Sync stream to one shard.
//
// A rank that opens its stream with internal/wire/framecodec's content
// subtype (fast; gradsync's workers do) gets its parameters written
// straight from the shard's buffer, and its gradient frames are summed
// straight from gRPC's receive buffers; any other client (grpcurl,
// workers in other languages) speaks ordinary protobuf, read and written
// with the proto codec. The bytes on the wire are valid protobuf either
// way.
type psStream struct {
	p      *jobShard
	rank   int
	stream pb.ParameterServer_SyncServer
	fast   bool
	in     framecodec.SyncRequest // the message last received; reused
	out    framecodec.Sender      // fast: sends float32 frames without copying them
	sp     wire.Splitter
	prefix []byte      // fast: a response's fields before its frame
	data   []byte      // compressed frames' data, copied out for their decoders
	timer  *time.Timer // the step timeout
}

// recv reads the rank's next message into h.in (with the codec the rank
// chose), after releasing the previous one's buffers.
func (h *psStream) recv() error {
	h.in.Release()
	if h.fast {
		return h.stream.RecvMsg(&h.in)
	}
	m, err := h.stream.Recv()
	if err != nil {
		return err
	}
	h.in.SetProto(m)
	return nil
}

// decodeAdd adds the values of frame f, which covers dst, given ph's
// encoding: float32 straight from gRPC's receive buffers, compressed
// encodings through the job's compress.PSReceiver.
func (h *psStream) decodeAdd(dst []float32, f *framecodec.Frame, ph compress.PSPhase) error {
	if ph.Encoding == compress.PSF32 {
		if f.NBytes != 4*len(dst) {
			return fmt.Errorf("%d data bytes for %d float32 values", f.NBytes, len(dst))
		}
		f.CombineInto(dst, true)
		return nil
	}
	h.data = f.AppendData(h.data[:0])
	return h.p.recv.DecodeAdd(dst, h.data, f.Scales, int(f.ScaleChunk), ph)
}

// sendFrames sends v as float32 frames tagged like tag, each in field
// num of a SyncResponse (framecodec.FieldParameters or FieldFactors), the
// first with sendState and rc. On a fast stream the values go from v
// itself, and sendFrames returns once gRPC has written them (within the
// step timeout), so v may change afterwards.
func (h *psStream) sendFrames(tag *pb.TensorFrame, num protowire.Number, v []float32, sendState bool, rc *pb.PushReceipt) error {
	first := true
	if !h.fast {
		return h.sp.Frames(tag, v, func(f *pb.TensorFrame) error {
			m := &pb.SyncResponse{}
			if num == framecodec.FieldFactors {
				m.Factors = f
			} else {
				m.Parameters = f
			}
			if first {
				m.SendState, m.Receipt, first = sendState, rc, false
			}
			return h.stream.Send(m)
		})
	}
	ctx := h.stream.Context()
	if h.p.stepTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, h.p.stepTimeout)
		defer cancel()
	}
	err := h.sp.Pieces(tag, v, func(f *pb.TensorFrame, vals []float32) error {
		h.prefix = h.prefix[:0]
		if first {
			var err error
			if h.prefix, err = framecodec.AppendSyncResponse(h.prefix, sendState, false, rc); err != nil {
				return status.Errorf(codes.Internal, "encoding a receipt: %v", err)
			}
			first = false
		}
		return h.out.Send(ctx, h.stream, h.prefix, num, f, vals)
	})
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		err = status.FromContextError(err).Err()
	}
	return err
}

// sendParams sends the parameters after step-1 steps, tagged step;
// askState asks for the rank's compression state.
func (h *psStream) sendParams(step int64, askState bool) error {
	p := h.p
	return h.sendFrames(&pb.TensorFrame{JobId: p.jobID, Generation: p.gen, Op: pb.Op_OP_PULL_PARAMETERS, Step: step},
		framecodec.FieldParameters, p.shard.Params(), askState, nil)
}

// sendFactors sends PowerSGD's factors after phase of step: P (phase 1)
// or Q (phase 2, tagged with the next step, as the parameters).
func (h *psStream) sendFactors(step int64, phase uint32, v []float32) error {
	p := h.p
	return h.sendFrames(&pb.TensorFrame{JobId: p.jobID, Generation: p.gen, Op: pb.Op_OP_PULL_PARAMETERS, Step: step, Phase: phase},
		framecodec.FieldFactors, v, false, nil)
}

// recvPhase receives the rank's push of phase ph of step and adds it to
// the shard. It returns the channel that is closed once every rank's push
// of the phase is in and combined (for the last phase: the update applied
// and checkpointed when due), or nil when the worker closed the stream.
func (h *psStream) recvPhase(step int64, ph compress.PSPhase) (chan struct{}, error) {
	p, env, rank := h.p, h.p.env, h.rank
	var asm wire.Assembler
	asm.Start(wire.Expect{JobID: p.jobID, Generation: p.gen, Op: pb.Op_OP_PUSH_GRADIENT, Step: step, Total: uint64(ph.Total), DType: psstep.DType(ph.Encoding)}, ph.Phase)
	for {
		f, off, n, err := h.recvGradient(&asm)
		if errors.Is(err, io.EOF) {
			return nil, nil // the worker is done with this job
		}
		if err != nil {
			return nil, err
		}
		select {
		case <-p.aborted:
			return nil, abortedStatus(p.abortErr)
		default:
		}
		p.mu.Lock()
		if p.stopped {
			p.mu.Unlock()
			return nil, abortedStatus(p.abortErr)
		}
		done := p.done
		p.opt.SetLR(float32(optim.LearningRate(p.spec, step, p.totalSteps)))
		skipped := p.shard.Skipped()
		decode := func(dst []float32) error { return h.decodeAdd(dst, f, ph) }
		var applied, combined bool
		switch ph.Phase {
		case 0:
			applied, err = p.shard.Add(rank, step, off, n, decode)
			combined = applied
		default:
			var sum []float32
			sum, err = p.shard.Sum(rank, step, ph.Total, off, n, decode)
			switch {
			case sum == nil:
			case ph.Phase == 1:
				p.pFactor, combined = p.recv.CombineP(sum), true
			default:
				p.qFactor = p.recv.CombineQ(sum, p.grad)
				err = p.shard.Apply(p.grad)
				applied, combined = true, true
			}
		}
		if f.Last && err == nil && ph.Phase <= 1 {
			p.lags.arrived(rank, p.world, env.Now(), combined)
		}
		if p.shard.Skipped() > skipped {
			env.Metrics.NonFiniteStepSkipped()
			env.Log.Warn("step skipped: gradient holds NaN or Inf (nonfinite_policy skip)", "job", p.jobID, "step", step)
		}
		var due *checkpoint.State
		if applied && err == nil {
			due = p.dueLocked(env.Now())
			if due != nil && p.recv.OwnLen() > 0 {
				// The ranks' error feedback is part of it: they send it
				// with their next parameters' answer (recvState).
				p.gather = &stateGather{st: due, own: make([][]float32, p.world), saved: make(chan struct{})}
				due = nil
			}
		}
		if combined && due == nil {
			p.signalLocked()
		}
		p.mu.Unlock()
		if due != nil {
			// Every rank waits for the next parameters until the
			// checkpoint is on disk, so the shard cannot move past
			// it meanwhile (as ring ranks wait for their rank 0).
			if err := h.save(due); err != nil {
				return nil, err
			}
			p.mu.Lock()
			p.signalLocked()
			p.mu.Unlock()
		}
		if err != nil {
			return nil, p.addErr(rank, err)
		}
		if f.Last {
			return done, nil
		}
	}
}

// recvGradient reads the rank's next frame of the push asm assembles
// and returns it with the element range it covers; io.EOF when the rank
// closed its stream.
func (h *psStream) recvGradient(asm *wire.Assembler) (f *framecodec.Frame, off, n int, err error) {
	if err := h.recv(); err != nil {
		return nil, 0, 0, err
	}
	if h.in.Msg != framecodec.FieldGradient {
		return nil, 0, 0, status.Error(codes.InvalidArgument, "expected a gradient frame")
	}
	f = &h.in.Frame
	if off, n, err = f.Take(asm); err != nil {
		return nil, 0, 0, frameErr(h.rank, fmt.Errorf("%w (compression %s)", err, h.p.recv.Type()))
	}
	return f, off, n, nil
}

// save writes a due checkpoint; a failure fails the job (as in ring mode,
// a checkpoint the spec asks for that cannot be written does).
func (h *psStream) save(due *checkpoint.State) error {
	p := h.p
	path, err := p.ckpt.save(due, p.env.Now())
	switch {
	case err != nil && path == "":
		err = fmt.Errorf("step %d: writing a checkpoint: %w", due.Meta.Step, err)
		p.abort(err)
		return status.Error(codes.Internal, err.Error())
	case err != nil:
		p.env.Log.Warn("checkpoint written, but removing older ones failed", "job", p.jobID, "err", err)
	default:
		p.env.Log.Debug("checkpoint written", "job", p.jobID, "path", path)
	}
	return nil
}

// resetTimer restarts the step timeout.
func (h *psStream) resetTimer() {
	if !h.timer.Stop() {
		select {
		case <-h.timer.C:
		default:
		}
	}
	h.timer.Reset(h.p.stepTimeout)
}

// wait waits for done (every rank's push of a phase of step combined),
// within the step timeout.
func (h *psStream) wait(ctx context.Context, step int64, done chan struct{}) error {
	p := h.p
	h.resetTimer()
	select {
	case <-done:
		return nil
	case <-p.aborted:
		return abortedStatus(p.abortErr)
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	case <-h.timer.C:
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
}

// recvState receives the rank's own compression state for the checkpoint
// g after step-1 steps; the rank that completes the set writes the
// checkpoint.
func (h *psStream) recvState(step int64, g *stateGather) error {
	p, rank := h.p, h.rank
	n := p.recv.OwnLen()
	var asm wire.Assembler
	asm.Start(wire.Expect{JobID: p.jobID, Generation: p.gen, Op: pb.Op_OP_PUSH_STATE, Step: step, Total: uint64(n)}, 0)
	for {
		err := h.recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = status.Errorf(codes.InvalidArgument, "rank %d closed its stream instead of sending its compression state for the checkpoint after step %d", rank, step-1)
			}
			return err
		}
		if h.in.Msg != framecodec.FieldState {
			return status.Errorf(codes.InvalidArgument, "rank %d: expected a state frame (the checkpoint after step %d needs the rank's compression state)", rank, step-1)
		}
		f := &h.in.Frame
		p.mu.Lock()
		if g.own[rank] == nil {
			g.own[rank] = make([]float32, n)
		}
		err = f.Assemble(&asm, g.own[rank])
		complete := false
		if err == nil && f.Last {
			g.n++
			complete = g.n == p.world
			if complete && p.gather == g {
				p.gather = nil
			}
		}
		p.mu.Unlock()
		if err != nil {
			return status.Errorf(codes.InvalidArgument, "rank %d: state: %v", rank, err)
		}
		if complete {
			for r, v := range g.own {
				g.st.Extra[compress.CheckpointOwn(r)] = models.F32Tensor([]int{n}, v)
			}
			g.err = h.save(g.st)
			close(g.saved)
		}
		if f.Last {
			return nil
		}
	}
}

// sendWritten answers the rank checkpoint_written once the checkpoint g
// after step-1 steps is on disk (written by the stream whose rank's
// state completed it), within the step timeout.
func (h *psStream) sendWritten(ctx context.Context, step int64, g *stateGather) error {
	p := h.p
	h.resetTimer()
	select {
	case <-g.saved:
		if g.err != nil {
			return g.err
		}
	case <-p.aborted:
		return abortedStatus(p.abortErr)
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	case <-h.timer.C:
		err := fmt.Errorf("the checkpoint after step %d: not every rank sent its compression state within the step timeout of %v", step-1, p.stepTimeout)
		p.abort(err)
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return h.stream.Send(&pb.SyncResponse{CheckpointWritten: true})
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
