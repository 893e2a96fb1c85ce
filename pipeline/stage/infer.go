package stage

import (
	"context"
	"errors"
	"fmt"

	"github.com/gradsync/gradsync/pipeline"
)

// Infer runs n samples forward through the pipeline in evaluation mode
// (batch norm's running statistics, no dropout), as an evaluation of the
// test set does: in micro-batches of the training micro-batch's size
// (Batch/M samples; the last one shorter), one after another, each
// stage forwarding micro-batch i while the next forwards i−1. The first
// stage reads x (n × Net.InputSize() values); the last hands each
// micro-batch's logits, of samples [lo, lo+k), to out, which must not
// keep them after it returns. Every stage is called with the same pass
// and n (pass numbers the evaluations; its frames are tagged apart from
// training steps'). Nothing of the network changes. A failure aborts the
// links and leaves the executor unusable, as in Step.
func (e *Executor) Infer(ctx context.Context, pass int64, n int, x []float32, out func(lo int, logits []float32)) error {
	if e.failed != nil {
		return fmt.Errorf("pipeline: stage %d: a failed executor is not reusable: %w", e.cfg.Stage, e.failed)
	}
	if err := e.infer(ctx, pass, n, x, out); err != nil {
		e.fail(err)
		return err
	}
	return nil
}

func (e *Executor) infer(ctx context.Context, pass int64, n int, x []float32, out func(lo int, logits []float32)) error {
	fail := func(a pipeline.Action, err error) error {
		return &StepError{Stage: e.cfg.Stage, Step: pass, Eval: true, Action: a, Err: err}
	}
	switch {
	case n < 1:
		return fail(pipeline.Action{}, fmt.Errorf("evaluation of %d samples; want at least 1", n))
	case e.first && len(x) != n*e.inLen:
		return fail(pipeline.Action{}, fmt.Errorf("input of %d values, want %d samples × %d", len(x), n, e.inLen))
	case e.last && out == nil:
		return fail(pipeline.Action{}, errors.New("the last stage needs somewhere to put the logits"))
	}
	// One micro-batch at a time: the first slot's twin and buffers do.
	sl := e.slots[0]
	for mb, lo := 0, 0; lo < n; mb, lo = mb+1, lo+e.micro {
		k := min(e.micro, n-lo)
		h := func(perSample int) Header {
			return Header{Step: pass, MicroBatch: mb, Dir: Activation, Shape: [2]int{k, perSample}, Eval: true}
		}
		if err := ctx.Err(); err != nil {
			return fail(pipeline.Action{Op: pipeline.Forward, MicroBatch: mb}, context.Cause(ctx))
		}
		var in []float32
		if e.first {
			in = x[lo*e.inLen : (lo+k)*e.inLen]
		} else {
			in = sl.in[:k*e.inLen]
			if err := e.cfg.Prev.Recv(ctx, h(e.inLen), in); err != nil {
				return fail(pipeline.Action{Op: pipeline.RecvActivation, MicroBatch: mb}, err)
			}
		}
		y := sl.net.ForwardStage(e.st, in, k, false)
		if e.last {
			out(lo, y)
			continue
		}
		if err := e.cfg.Next.Send(ctx, h(e.outLen), y); err != nil {
			return fail(pipeline.Action{Op: pipeline.SendActivation, MicroBatch: mb}, err)
		}
	}
	return nil
}
