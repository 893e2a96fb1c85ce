package worker

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"time"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/internal/metrics"
	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/internal/trace"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// checksumEvery is how often (in steps) ranks compare a checksum of their
// parameters, so that a silent desync becomes a clear error.
const checksumEvery = 50

// trafficker is a ring that counts its bytes (ringrpc's does).
type trafficker interface {
	Traffic() (sent, received int64, right, left string)
}

// overlapStarter is a reducer that can start reducing a gradient before
// backward has finished it, bucket by bucket as Overlapped.Ready reports
// them final (compress.Plain can; compressors need the whole gradient
// first).
type overlapStarter interface {
	Start(ctx context.Context, grads []float32, step int64) (*compress.Overlapped, error)
}

// ringSync is data-parallel training over a ring: each step every rank
// all-reduces its gradient bucket by bucket, divides by the world size, and
// applies the same optimiser step locally, so all ranks keep bit-identical
// parameters (checked every checksumEvery steps).
type ringSync struct {
	ring  aggregator.Ring
	trace *trace.Recorder // records the all-reduces (setTrace); nil: none

	reducerTraces bool              // the reducer records its buckets itself
	metrics       *metrics.Registry // may be nil
	jobID         string
	sent          int64 // bytes reported to metrics so far
	recv          int64
	closeFn       func()
	world         int
	spec          *pb.JobSpec
	total         int64
	optim         optim.Stepper
	opt           aggregator.Options
	reducer       compress.Reducer
	state         compress.Stateful // the reducer's state
	overlap       overlapStarter    // the reducer, if it can reduce while backward runs; else nil
	timeout       time.Duration
	skipBad       bool
	// noOverlap reduces after backward even without compression (tests).
	noOverlap bool
	// The overlapped reduction of the current step, between beginStep and
	// step.
	pending       *compress.Overlapped
	pendingCtx    context.Context
	pendingCancel context.CancelCauseFunc

	seq     int64 // tags this type's own collectives: -1, -2, … (the reducer's are ≥ 0)
	steps   int64 // optimiser steps taken
	skipped int64
	sums    []float32
	// scaler is precision fp16's dynamic loss scaler (nil otherwise): the
	// reduced gradient is unscaled and checked on every rank alike, so
	// all ranks skip the same steps.
	scaler *optim.LossScaler
}

// newRingSync builds a rank's synchroniser; the caller then brings every
// rank to the same starting state (agree, broadcastParams).
func newRingSync(ctx context.Context, ring aggregator.Ring, closeFn func(), a *pb.Assignment, net *models.Network, totalSteps int64, reg *metrics.Registry) (*ringSync, error) {
	spec := a.Spec
	capBytes := int(spec.GetBucketCapMb() * (1 << 20))
	if capBytes <= 0 {
		capBytes = 25 << 20
	}
	r := &ringSync{
		ring: ring, closeFn: closeFn, world: ring.Size(), spec: spec, total: totalSteps, metrics: reg, jobID: a.JobId,
		optim:   optim.FromSpec(spec),
		opt:     aggregator.Options{Generation: a.Generation},
		timeout: time.Duration(spec.GetStepTimeoutSeconds() * float64(time.Second)),
		skipBad: spec.GetNonfinitePolicy() == "skip",
		sums:    make([]float32, 2*ring.Size()),
		seq:     -1,
	}
	sc, err := jobspec.CompressionScheme(spec.GetCompression(), spec.GetSeed())
	if err != nil {
		return nil, err
	}
	red, err := compress.New(sc, ring, r.opt, net.Segments(), capBytes)
	if err != nil {
		return nil, err
	}
	r.reducer = red
	st, ok := red.(compress.Stateful)
	if !ok {
		return nil, fmt.Errorf("compression %q keeps no snapshotable state", spec.GetCompression().GetType())
	}
	r.state = st
	r.overlap, _ = red.(overlapStarter)
	if spec.GetPrecision() == "fp16" {
		if r.scaler, err = optim.NewLossScaler(optim.ScalerConfig{}); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// lossScale is the factor the loss gradient is multiplied by before
// backward: the loss scaler's (precision fp16), else 1.
func (r *ringSync) lossScale() float32 {
	if r.scaler == nil {
		return 1
	}
	return r.scaler.Scale()
}

// scalerStats fills s with the loss scaler's figures.
func (r *ringSync) scalerStats(s *syncStats) {
	if r.scaler != nil {
		s.skipped, s.lossScale = r.scaler.Skipped(), r.scaler.Scale()
	}
}

// broadcastParams gives every rank rank 0's parameters (a fresh start:
// each rank built the model from the seed, so this only guards against a
// different build).
func (r *ringSync) broadcastParams(ctx context.Context, params []float32) error {
	cctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	if err := aggregator.Broadcast(cctx, r.ring, params, 0, r.seq, r.opt); err != nil {
		return fmt.Errorf("broadcasting the initial parameters: %w", r.explain(cctx, err))
	}
	r.seq--
	return nil
}

// beginStep starts the uncompressed reduction of the step's gradient
// before backward, so that each bucket's all-reduce runs as soon as
// backward has finished it (DDP's overlap); it returns the function
// BackwardNotify reports progress to, or nil when the reducer compresses
// (compressors need the whole gradient) — then step reduces after
// backward. grads must be zeroed before, and step must follow.
func (r *ringSync) beginStep(ctx context.Context, grads []float32) (func(from int), error) {
	if r.overlap == nil || r.noOverlap {
		return nil, nil
	}
	// The step timeout bounds the all-reduce, not backward: it starts in
	// step, once backward is done (as without overlap).
	sctx, cancel := context.WithCancelCause(ctx)
	o, err := r.overlap.Start(sctx, grads, r.steps)
	if err != nil {
		cancel(nil)
		return nil, err
	}
	r.pending, r.pendingCtx, r.pendingCancel = o, sctx, cancel
	return o.Ready, nil
}

// setTrace records the ring's all-reduces in rec: per bucket where the
// reducer records them itself (the plain reducer), else one span per
// step's reduction.
func (r *ringSync) setTrace(rec *trace.Recorder) {
	r.trace, r.reducerTraces = rec, false
	if p, ok := r.reducer.(interface{ SetTrace(*trace.Recorder) }); ok {
		p.SetTrace(rec)
		r.reducerTraces = true
	}
}

func (r *ringSync) step(ctx context.Context, grads, params []float32) error {
	if o := r.pending; o != nil {
		// The all-reduce began with backward (beginStep).
		ctx, cancel := r.pendingCtx, r.pendingCancel
		r.pending, r.pendingCtx, r.pendingCancel = nil, nil, nil
		defer cancel(nil)
		t := time.AfterFunc(r.timeout, func() { cancel(context.DeadlineExceeded) })
		defer t.Stop()
		if err := o.Wait(); err != nil {
			return r.explain(ctx, err)
		}
		return r.apply(ctx, grads, params)
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	start := time.Now()
	if err := r.reducer.Reduce(ctx, grads, r.steps); err != nil {
		return r.explain(ctx, err)
	}
	if r.trace != nil && !r.reducerTraces {
		r.trace.Span("reduce (compressed)", trace.CatComm, trace.TidComm, start, time.Now(), map[string]any{"step": r.steps})
	}
	return r.apply(ctx, grads, params)
}

// apply takes the optimiser step with the averaged gradient.
func (r *ringSync) apply(ctx context.Context, grads, params []float32) error {
	finite := true
	scaled := false
	if r.scaler != nil {
		// GradScaler: unscale; a step with inf/NaN is skipped and backs
		// the scale off, whatever nonfinite_policy says (overflows are
		// how the scaler finds its scale)
		finite = r.scaler.Update(r.scaler.Unscale(grads))
		scaled = !finite
		if scaled && r.ring.Rank() == 0 { // once per job step
			r.metrics.NonFiniteStepSkipped() // gradsync_nonfinite_steps_skipped_total
		}
	} else {
		for _, g := range grads {
			if g-g != 0 {
				finite = false
				break
			}
		}
	}
	switch {
	case scaled:
	case finite:
		r.optim.SetLR(float32(optim.LearningRate(r.spec, r.steps, r.total)))
		r.optim.Step(params, grads)
	case r.skipBad:
		r.skipped++
	default:
		return fmt.Errorf("%w at step %d (nonfinite_policy fail)", aggregator.ErrNonFinite, r.steps)
	}
	r.steps++
	if r.metrics != nil {
		st := r.reducer.Stats()
		r.metrics.ObserveCompression(r.jobID, metrics.CompressionTotals{RawBytes: st.RawBytes, SentBytes: st.SentBytes, Seconds: st.CompressSeconds})
	}
	if t, ok := r.ring.(trafficker); ok && r.metrics != nil {
		sent, recv, right, left := t.Traffic()
		r.metrics.AddBytesSent(r.jobID, right, int(sent-r.sent))
		r.metrics.AddBytesReceived(r.jobID, left, int(recv-r.recv))
		r.sent, r.recv = sent, recv
	}
	if r.steps%checksumEvery == 0 || r.steps == r.total {
		return r.checkInSync(ctx, params)
	}
	return nil
}

// checkInSync all-gathers a CRC of every rank's parameters (as two 16-bit
// halves, exact in float32) and fails if any rank differs.
func (r *ringSync) checkInSync(ctx context.Context, params []float32) error {
	h := crc32.NewIEEE()
	var b [4]byte
	for _, v := range params {
		u := math.Float32bits(v)
		b[0], b[1], b[2], b[3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
		h.Write(b[:])
	}
	c := h.Sum32()
	mine := []float32{float32(c >> 16), float32(c & 0xffff)}
	if err := aggregator.AllGather(ctx, r.ring, r.sums, mine, r.seq, r.opt); err != nil {
		return r.explain(ctx, err)
	}
	r.seq--
	for rank := 0; rank < r.world; rank++ {
		if r.sums[2*rank] != mine[0] || r.sums[2*rank+1] != mine[1] {
			return fmt.Errorf("parameters diverged: rank %d's checksum differs from rank %d's after step %d", rank, r.ring.Rank(), r.steps)
		}
	}
	return nil
}

func (r *ringSync) explain(ctx context.Context, err error) error {
	var pe *aggregator.PeerError
	switch {
	case errors.As(err, &pe):
		return fmt.Errorf("peer rank %d: %w", pe.Rank, err)
	case ctx.Err() != nil && errors.Is(context.Cause(ctx), context.DeadlineExceeded):
		return fmt.Errorf("all-reduce did not finish within the step timeout of %v: %w", r.timeout, err)
	}
	return err
}

func (r *ringSync) close() {
	if r.closeFn != nil {
		r.closeFn()
	}
}
