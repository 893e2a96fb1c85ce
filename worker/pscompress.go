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
// the job's compression says (psstep.Rank over compress.PSPusher: one
// push, or PowerSGD's two with the server's P in between), and
// overwrites params (the range) with the parameters after the update.
// When the server asks, it then sends this rank's compression state for
// a checkpoint and waits until the checkpoint is written. ctx bounds it
// (psClient.step: the step timeout).
func (l *psLink) step(ctx context.Context, step int64, grads, params []float32) error {
	c := l.c
	tag := &pb.TensorFrame{JobId: c.a.JobId, Generation: c.a.Generation, Op: pb.Op_OP_PUSH_GRADIENT, Step: step, Rank: c.a.Rank}
	send := linkSender{l: l, ctx: ctx, tag: tag}
	var askState bool
	for _, ex := range l.side.Plan(step) {
		var err error
		switch ex.Kind {
		case psstep.Push:
			if err = l.side.Push(ex, grads, send); err != nil {
				return l.explain(l.recvErr(err))
			}
		case psstep.Params:
			askState, err = l.recvParams(ctx, params, ex.Step)
		default: // Factors, SharedQ
			err = l.recvFactors(ctx, ex, l.side.Factors(ex))
		}
		if err != nil {
			return err
		}
	}
	if err := l.side.Applied(step); err != nil {
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

// recvFactors reads into dst PowerSGD's factors the server answers ex
// with (P after phase 1, tagged with the step; Q after phase 2, tagged
// with the next).
func (l *psLink) recvFactors(ctx context.Context, ex psstep.Exchange, dst []float32) error {
	c := l.c
	var asm wire.Assembler
	asm.Start(wire.Expect{JobID: c.a.JobId, Generation: c.a.Generation, Op: pb.Op_OP_PULL_PARAMETERS, Step: ex.Step, Total: uint64(len(dst))}, ex.Phase)
	for !asm.Done() {
		m, err := l.recv(ctx)
		if err != nil {
			return l.explain(err)
		}
		if !m.HasFactors {
			return fmt.Errorf("parameter server: expected PowerSGD's factors after phase %d of step %d", ex.Phase, ex.Step)
		}
		if err := m.Factors.Assemble(&asm, dst); err != nil {
			return fmt.Errorf("PowerSGD's factors after phase %d of step %d: %w", ex.Phase, ex.Step, err)
		}
		c.metrics.AddBytesReceived(c.a.JobId, "ps", m.Factors.NBytes)
	}
	return nil
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
