package worker

import (
	"context"
	"fmt"

	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/internal/wire"
	"github.com/gradsync/gradsync/paramserver/psstep"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// step walks this link's side of step's exchanges (psstep.Plan): it
// pushes grads (this shard's range of the rank's gradient), encoded as
// the job's compression says (compress.PSPusher: one push, or
// PowerSGD's two with the server's P in between), and overwrites params
// (the range) with the parameters after the update. When the server
// asks, it then sends this rank's compression state for a checkpoint
// and waits until the checkpoint is written. ctx bounds it
// (psClient.step: the step timeout).
func (l *psLink) step(ctx context.Context, step int64, grads, params []float32) error {
	c := l.c
	tag := &pb.TensorFrame{JobId: c.a.JobId, Generation: c.a.Generation, Op: pb.Op_OP_PUSH_GRADIENT, Step: step, Rank: c.a.Rank}
	send := linkSender{l: l, ctx: ctx, tag: tag}
	var (
		pm, q    []float32 // PowerSGD: the server's P, then its averaged Q
		askState bool
	)
	for _, ex := range psstep.Plan(step, l.push.Phases(step)) {
		var err error
		switch ex.Kind {
		case psstep.Push:
			if ex.Phase == 2 {
				err = l.push.PushQ(step, pm, send)
			} else {
				err = l.push.Push(step, grads, send)
			}
			if err != nil {
				return l.explain(l.recvErr(err))
			}
		case psstep.Factors:
			pm, err = l.recvFactors(ctx, ex.Step, ex.Phase)
		case psstep.Params:
			askState, err = l.recvParams(ctx, params, ex.Step)
		case psstep.SharedQ:
			q, err = l.recvFactors(ctx, ex.Step, ex.Phase)
		default:
			panic(fmt.Sprintf("worker: a ps step plan holds %v", ex))
		}
		if err != nil {
			return err
		}
	}
	// The state a checkpoint gathers is that after the step.
	if err := l.push.Applied(step, q); err != nil {
		return err
	}
	if !askState {
		return nil
	}
	for _, ex := range psstep.AskState(step) {
		var err error
		switch ex.Kind {
		case psstep.State:
			err = l.sendState(ctx, ex.Step)
		case psstep.Written:
			err = l.recvWritten(ctx, ex.Step)
		default:
			panic(fmt.Sprintf("worker: a ps state plan holds %v", ex))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// recvFactors reads PowerSGD's factors the server sends after phase of a
// step (P: phase 1, tagged with the step; Q: phase 2, tagged with the
// next), into a buffer valid until the next call.
func (l *psLink) recvFactors(ctx context.Context, step int64, phase uint32) ([]float32, error) {
	c := l.c
	n := l.push.FactorLen(phase)
	if cap(l.factors) < n {
		l.factors = make([]float32, n)
	}
	dst := l.factors[:n]
	var asm wire.Assembler
	asm.Start(wire.Expect{JobID: c.a.JobId, Generation: c.a.Generation, Op: pb.Op_OP_PULL_PARAMETERS, Step: step, Total: uint64(n)}, phase)
	for !asm.Done() {
		m, err := l.recv(ctx)
		if err != nil {
			return nil, l.explain(err)
		}
		if !m.HasFactors {
			return nil, fmt.Errorf("parameter server: expected PowerSGD's factors after phase %d of step %d", phase, step)
		}
		if err := m.Factors.Assemble(&asm, dst); err != nil {
			return nil, fmt.Errorf("PowerSGD's factors after phase %d of step %d: %w", phase, step, err)
		}
		c.metrics.AddBytesReceived(c.a.JobId, "ps", m.Factors.NBytes)
	}
	return dst, nil
}

// sendState sends this rank's own compression state (error feedback) for
// the checkpoint after step-1 steps.
func (l *psLink) sendState(ctx context.Context, step int64) error {
	c := l.c
	ns, no := l.push.FlatLen()
	fl := &compress.Flat{Shared: make([]float32, ns), Own: make([]float32, no)}
	l.push.CopyState(fl)
	tag := &pb.TensorFrame{JobId: c.a.JobId, Generation: c.a.Generation, Op: pb.Op_OP_PUSH_STATE, Step: step, Rank: c.a.Rank}
	err := l.sp.Frames(tag, fl.Own, func(f *pb.TensorFrame) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		return l.stream.Send(&pb.SyncRequest{Msg: &pb.SyncRequest_State{State: f}})
	})
	if err != nil {
		return l.explain(l.recvErr(err))
	}
	return nil
}

// recvWritten waits for the server to answer that the checkpoint after
// step-1 steps is written.
func (l *psLink) recvWritten(ctx context.Context, step int64) error {
	m, err := l.recv(ctx)
	if err != nil {
		return l.explain(err)
	}
	if !m.CheckpointWritten {
		return fmt.Errorf("parameter server: expected checkpoint_written after sending the compression state for step %d", step)
	}
	return nil
}
