package paramserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/internal/wire"
	"github.com/gradsync/gradsync/internal/wire/framecodec"
	"github.com/gradsync/gradsync/paramserver/psstep"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// serveAsync serves a rank's stream to an async or bounded shard: for
// each step, wait until the rank may read (bounded: at most staleness
// steps ahead of the slowest rank; never longer than the step timeout),
// send the shard's parameters as they are then (with the receipt of the
// rank's last gradient), and take its next gradient, applied as soon as
// it is in (aggregator.AsyncShard). There is no barrier: a rank that
// finishes closes its stream and no longer holds the others back.
func (h *psStream) serveAsync(ctx context.Context) error {
	p, rank := h.p, h.rank
	buf := make([]float32, p.rng.Len())
	var rc *pb.PushReceipt
	for {
		p.mu.Lock()
		step := p.async.Next(rank)
		p.mu.Unlock()
		waited, err := h.waitReady(ctx, step)
		if err != nil {
			return err
		}
		p.mu.Lock()
		if p.stopped {
			p.mu.Unlock()
			return abortedStatus(p.abortErr)
		}
		copy(buf, p.async.Read(rank))
		p.mu.Unlock()
		if rc != nil {
			rc.WaitSeconds = waited.Seconds()
		}
		err = h.sendFrames(&pb.TensorFrame{JobId: p.jobID, Generation: p.gen, Op: pb.Op_OP_PULL_PARAMETERS, Step: step},
			framecodec.FieldParameters, buf, false, rc)
		if err != nil {
			return err
		}
		if rc, err = h.recvAsync(ctx, step); err != nil || rc == nil {
			return err // rc == nil: the rank closed its stream
		}
	}
}

// signalLocked wakes every stream waiting on the shard's done (sync: a
// phase of the step is combined; async: a gradient was taken or a rank
// finished).
func (p *jobShard) signalLocked() {
	close(p.done)
	p.done = make(chan struct{})
}

// recvAsync receives the rank's gradient of step and gives it to the
// shard. It returns the receipt, or nil when the rank closed its stream
// (it has finished; the others no longer wait for it).
func (h *psStream) recvAsync(ctx context.Context, step int64) (*pb.PushReceipt, error) {
	p, rank := h.p, h.rank
	ph := p.recv.Phases(step)[0] // no compression with async (jobspec): plain float32
	var asm wire.Assembler
	asm.Start(wire.Expect{JobID: p.jobID, Generation: p.gen, Op: pb.Op_OP_PUSH_GRADIENT, Step: step, Total: uint64(ph.Total), DType: psstep.DType(ph.Encoding)}, ph.Phase)
	for {
		f, off, n, err := h.recvGradient(ctx, &asm)
		if errors.Is(err, io.EOF) {
			p.mu.Lock()
			p.async.Finish(rank)
			p.signalLocked()
			p.mu.Unlock()
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		p.mu.Lock()
		if p.stopped {
			p.mu.Unlock()
			return nil, abortedStatus(p.abortErr)
		}
		// Each rank's gradient is applied at the learning rate of the
		// step it was computed for.
		p.opt.SetLR(float32(optim.LearningRate(p.spec, step, p.totalSteps)))
		rc, complete, err := p.async.Add(rank, step, off, n, func(dst []float32) error { return h.decodeAdd(dst, f, ph) })
		if complete {
			p.signalLocked()
		}
		p.mu.Unlock()
		if err != nil {
			return nil, p.addErr(rank, err)
		}
		if !complete {
			continue
		}
		switch {
		case rc.Refused:
			p.env.Log.Warn("gradient refused: computed on parameters too stale", "job", p.jobID, "shard", p.index, "rank", rank, "step", step,
				"stale_steps", rc.StaleSteps, "staleness", p.spec.GetParameterServer().GetStaleness())
		case !rc.Applied:
			p.env.Metrics.NonFiniteStepSkipped()
			p.env.Log.Warn("gradient skipped: it holds NaN or Inf (nonfinite_policy skip)", "job", p.jobID, "rank", rank, "step", step)
		}
		return &pb.PushReceipt{Applied: rc.Applied, Refused: rc.Refused, StaleSteps: rc.StaleSteps, StaleUpdates: rc.StaleUpdates}, nil
	}
}

// waitReady waits until the rank may read the parameters for step (see
// aggregator.AsyncShard.Ready), within the step timeout; past it the job
// fails, naming the ranks it waited for. It returns how long it waited.
func (h *psStream) waitReady(ctx context.Context, step int64) (time.Duration, error) {
	p := h.p
	start := p.env.Now()
	h.resetTimer()
	for {
		p.mu.Lock()
		if p.stopped {
			p.mu.Unlock()
			return 0, abortedStatus(p.abortErr)
		}
		if p.async.Ready(h.rank) {
			p.mu.Unlock()
			return p.env.Now().Sub(start), nil
		}
		done := p.done
		laggards, clock := p.async.Laggards(), p.async.Clock()
		p.mu.Unlock()
		select {
		case <-done:
		case <-p.aborted:
			return 0, abortedStatus(p.abortErr)
		case <-ctx.Done():
			return 0, status.FromContextError(ctx.Err()).Err()
		case <-h.timer.C:
			err := fmt.Errorf("parameter-server shard %d: rank %d at step %d may be at most %d step(s) ahead of the slowest, but rank(s) %v stayed at step %d for the step timeout of %v",
				p.index, h.rank, step, p.spec.GetParameterServer().GetStaleness(), laggards, clock, p.stepTimeout)
			p.abort(err)
			return 0, status.Error(codes.DeadlineExceeded, err.Error())
		}
	}
}
