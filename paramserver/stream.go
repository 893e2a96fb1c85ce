package paramserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/internal/wire"
	"github.com/gradsync/gradsync/internal/wire/framecodec"
	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/paramserver/psstep"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

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
// chose), after releasing the previous one's buffers. A Recv takes no
// context: ctx is the stream's, whose end ends the Recv; recv checks it
// first, so a loop of recvs returns once ctx ends.
func (h *psStream) recv(ctx context.Context) error {
	h.in.Release()
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
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

// sendAnswer sends v, the shard's answer to ex (psstep.Shard.Answer):
// the parameters, the first frame with askState (a checkpoint asks for
// the rank's compression state), or PowerSGD's factors (P tagged with
// the step, Q with the next, as the parameters).
func (h *psStream) sendAnswer(ex psstep.Exchange, v []float32, askState bool) error {
	p := h.p
	num := framecodec.FieldFactors
	if ex.Kind == psstep.Params {
		num = framecodec.FieldParameters
	}
	return h.sendFrames(&pb.TensorFrame{JobId: p.jobID, Generation: p.gen, Op: pb.Op_OP_PULL_PARAMETERS, Step: ex.Step, Phase: ex.Phase},
		num, v, askState, nil)
}

// recvPhase receives the rank's push of phase ph of step and adds it to
// the shard (psstep.Shard.Add). It returns the channel that is closed
// once every rank's push of the phase is in and combined (for the last
// phase: the update applied and checkpointed when due), or nil when the
// worker closed the stream.
func (h *psStream) recvPhase(ctx context.Context, step int64, ph compress.PSPhase) (chan struct{}, error) {
	p, env, rank := h.p, h.p.env, h.rank
	var asm wire.Assembler
	asm.Start(wire.Expect{JobID: p.jobID, Generation: p.gen, Op: pb.Op_OP_PUSH_GRADIENT, Step: step, Total: uint64(ph.Total), DType: psstep.DType(ph.Encoding)}, ph.Phase)
	for {
		f, off, n, err := h.recvGradient(ctx, &asm)
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
		out, err := p.round.Add(rank, step, ph, off, n, func(dst []float32) error { return h.decodeAdd(dst, f, ph) })
		if f.Last && err == nil && ph.Phase <= 1 {
			p.lags.Arrived(rank, p.world, env.Now(), out.Combined)
		}
		if p.shard.Skipped() > skipped {
			env.Metrics.NonFiniteStepSkipped()
			env.Log.Warn("step skipped: gradient holds NaN or Inf (nonfinite_policy skip)", "job", p.jobID, "step", step)
		}
		var due *checkpoint.State
		if out.Applied && err == nil {
			var d psstep.Decision
			d, due = p.dueLocked(env.Now())
			if d == psstep.Gather {
				// The ranks' error feedback is part of it: they send it
				// with their next parameters' answer (recvState).
				p.gather = &stateGather{st: due, own: make([][]float32, p.world), saved: make(chan struct{})}
				due = nil
			}
		}
		if out.Combined && due == nil {
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
func (h *psStream) recvGradient(ctx context.Context, asm *wire.Assembler) (f *framecodec.Frame, off, n int, err error) {
	if err := h.recv(ctx); err != nil {
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
func (h *psStream) recvState(ctx context.Context, step int64, g *stateGather) error {
	p, rank := h.p, h.rank
	n := p.recv.OwnLen()
	var asm wire.Assembler
	asm.Start(wire.Expect{JobID: p.jobID, Generation: p.gen, Op: pb.Op_OP_PUSH_STATE, Step: step, Total: uint64(n)}, 0)
	for {
		err := h.recv(ctx)
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
