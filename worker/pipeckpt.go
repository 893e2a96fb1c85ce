package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/jobspec"
)

// A pipeline job's checkpoint is the same as a whole-model job's: the
// whole model's tensors with PyTorch names (model.safetensors) and the
// whole optimiser state, written by rank 0 after every rank has
// all-gathered the stages' parts (replica 0's) — so PyTorch loads it as
// if one worker had trained, and a job resumes from it on any cut. Every
// rank decides alike when one is due (steps and epochs only: jobspec
// refuses every_seconds for pipeline jobs, which would need rank 0's
// clock).

// optimParts is how many buffers of the stage's length the optimiser
// keeps: SGD's momentum, Adam's two moments (0: none yet).
func optimParts(o optim.Stepper) [][]float32 {
	switch o := o.(type) {
	case *optim.SGD:
		if b := o.State(); b != nil {
			return [][]float32{b}
		}
	case *optim.Adam:
		if m, v, _ := o.State(); m != nil {
			return [][]float32{m, v}
		}
	}
	return nil
}

// wholeOptimizer all-gathers every stage's optimiser state (replica 0's)
// into an optimiser of the spec's kind over the whole flat buffer; every
// rank calls it at the same step.
func (p *pipeTask) wholeOptimizer(ctx context.Context) (optim.Stepper, error) {
	whole := optim.FromSpec(p.spec)
	parts := optimParts(p.optim)
	k := len(parts)
	// Every stage has taken the same steps, so all agree on k; checked.
	chunk := 0
	for _, s := range p.stages {
		chunk = max(chunk, s.ParamLen)
	}
	src := make([]float32, 1+k*chunk)
	src[0] = float32(k)
	for i, b := range parts {
		copy(src[1+i*chunk:], b)
	}
	n := p.coord.Stages * p.coord.Replicas
	if k == 0 {
		// A 1-value gather tells every rank that no stage has state yet.
		src = src[:1]
		chunk = 0
	}
	all := make([]float32, n*len(src))
	if err := p.worldCollective(ctx, func(ctx context.Context, seq int64) error {
		return aggregator.AllGather(ctx, p.world, all, src, seq, p.opt)
	}); err != nil {
		return nil, fmt.Errorf("gathering the stages' optimiser state: %w", err)
	}
	for r := range n {
		if all[r*len(src)] != float32(k) {
			return nil, fmt.Errorf("pipeline: rank %d keeps %v optimiser buffers, rank %d %d", r, all[r*len(src)], p.coord.Rank, k)
		}
	}
	if k == 0 {
		return whole, nil
	}
	full := make([][]float32, k)
	for i := range full {
		full[i] = make([]float32, p.net.NumParams())
	}
	for s, st := range p.stages {
		base := p.coord.RankOf(0, s) * len(src)
		for i := range full {
			copy(full[i][st.ParamOffset:st.ParamOffset+st.ParamLen], all[base+1+i*chunk:][:st.ParamLen])
		}
	}
	switch o := whole.(type) {
	case *optim.SGD:
		o.SetState(full[0])
	case *optim.Adam:
		_, _, t := p.optim.(*optim.Adam).State()
		o.SetState(full[0], full[1], t)
	}
	return whole, nil
}

// restoreStage loads a whole-model checkpoint into the network and this
// stage's part of its optimiser state.
func (p *pipeTask) restoreStage(st *checkpoint.State) error {
	whole := optim.FromSpec(p.spec)
	if err := restoreCheckpoint(st, p.a.ResumeFrom, p.spec, p.net, whole); err != nil {
		return err
	}
	lo, hi := p.st.ParamOffset, p.st.ParamOffset+p.st.ParamLen
	cut := func(b []float32) []float32 {
		if b == nil {
			return nil
		}
		return append([]float32(nil), b[lo:hi]...)
	}
	switch o := p.optim.(type) {
	case *optim.SGD:
		o.SetState(cut(whole.(*optim.SGD).State()))
	case *optim.Adam:
		m, v, t := whole.(*optim.Adam).State()
		o.SetState(cut(m), cut(v), t)
	}
	return nil
}

// checkpoint writes the job's checkpoint of the state at at when one is
// due; every rank takes part in gathering it.
func (p *pipeTask) checkpoint(ctx context.Context, epoch int, at position) (gathered bool, err error) {
	if p.ckpt == nil || !jobspec.CheckpointDue(p.spec, at.step, at.epoch > epoch, epoch, 0) {
		return false, nil
	}
	if err := p.gather(ctx); err != nil {
		return false, err
	}
	whole, err := p.wholeOptimizer(ctx)
	if err != nil {
		return true, err
	}
	if p.coord.Rank != 0 {
		return true, nil
	}
	path, err := p.ckpt.save(p.net, whole, at.step, at.epoch, at.consumed, nil, time.Now())
	if err != nil {
		return true, fmt.Errorf("writing a checkpoint: %w", err)
	}
	p.env.log.Debug("checkpoint written", "job", p.a.JobId, "path", path)
	return true, nil
}
