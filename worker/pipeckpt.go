package worker

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
)

// A pipeline job's checkpoint is the same as a whole-model job's: the
// whole model's tensors with PyTorch names (model.safetensors) and the
// whole optimiser state, so PyTorch loads it as if one worker had
// trained, and a job resumes from it on any cut. No rank builds the
// whole network or optimiser for it: stage after stage, replica 0's rank
// of the stage broadcasts its parameters, buffers and optimiser state
// over the job's ring, and rank 0 writes each stage's tensors into the
// checkpoint's files as they arrive (checkpoint.Writer: the files'
// headers follow from the names and shapes alone), so no rank holds
// every stage's state at once. Every rank decides alike when one is due (steps and epochs
// only: jobspec refuses every_seconds for pipeline jobs, which would
// need rank 0's clock).

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

// stageSegments are the whole network's segments (parameters, or
// buffers with bufs) of stage st, with offsets into the stage's part.
func stageSegments(net *models.Network, st models.Stage, bufs bool) []models.Segment {
	segs, lo, n := net.WholeSegments(), st.ParamOffset, st.ParamLen
	if bufs {
		segs, lo, n = net.WholeBufferSegments(), st.BufferOffset, st.BufferLen
	}
	var out []models.Segment
	for _, g := range segs {
		if g.Offset >= lo && g.Offset+g.Len <= lo+n {
			g.Offset -= lo
			out = append(out, g)
		}
	}
	return out
}

// optimKinds agrees over the job's ring on how many optimiser buffers
// every stage keeps (every stage has taken the same steps: checked).
func (p *pipeTask) optimKinds(ctx context.Context) (int, error) {
	k := len(optimParts(p.optim))
	n := p.coord.Stages * p.coord.Replicas
	all := make([]float32, n)
	if err := p.worldCollective(ctx, func(ctx context.Context, seq int64) error {
		return aggregator.AllGather(ctx, p.world, all, []float32{float32(k)}, seq, p.opt)
	}); err != nil {
		return 0, fmt.Errorf("agreeing on the stages' optimiser state: %w", err)
	}
	for r, v := range all {
		if v != float32(k) {
			return 0, fmt.Errorf("pipeline: rank %d keeps %v optimiser buffers, rank %d %d", r, v, p.coord.Rank, k)
		}
	}
	return k, nil
}

// stageOptim is an optimiser of the job's kind over stage st's part,
// with part(i) as its i-th of k state buffers (nil part: zeros), to name
// its state as a whole-model job's checkpoint does; steps is Adam's step
// count.
func (p *pipeTask) stageOptim(st *checkpoint.State, sg models.Stage, k int, part func(i int) []float32) {
	if part == nil {
		part = func(int) []float32 { return make([]float32, sg.ParamLen) }
	}
	o := optim.FromSpec(p.spec)
	switch o := o.(type) {
	case *optim.SGD:
		if k > 0 {
			o.SetState(part(0))
		}
	case *optim.Adam:
		_, _, t := p.optim.(*optim.Adam).State()
		if k > 0 {
			o.SetState(part(0), part(1), t)
		} else {
			o.SetState(nil, nil, t)
		}
	}
	st.CaptureOptimizer(o, stageSegments(p.net, sg, false))
}

// checkpointLayout is what rank 0's checkpoint.Writer needs before any
// stage's state arrives: every tensor's name, dtype and shape in
// model.safetensors and optim.safetensors (their data nil), and the
// optimiser's description. It holds one stage's optimiser state at a
// time, zeros, to name it.
func (p *pipeTask) checkpointLayout(k int) (model, opt map[string]models.Tensor, o checkpoint.Optimizer) {
	model, opt = map[string]models.Tensor{}, map[string]models.Tensor{}
	for _, segs := range [][]models.Segment{p.net.WholeSegments(), p.net.WholeBufferSegments()} {
		for _, g := range segs {
			model[g.Name] = models.Tensor{DType: "F32", Shape: g.Shape}
		}
	}
	for _, sg := range p.stages {
		var st checkpoint.State
		p.stageOptim(&st, sg, k, nil)
		for name, t := range st.Optim {
			opt[name] = models.Tensor{DType: t.DType, Shape: t.Shape}
		}
		o = st.Meta.Optimizer
	}
	return model, opt, o
}

// writeCheckpoint writes the whole model's checkpoint of the state at
// at: stage after stage, replica 0's rank of the stage broadcasts its
// parameters, buffers and optimiser state over the job's ring, and rank
// 0 writes that stage's tensors into the checkpoint's files as they
// arrive (checkpoint.Writer), holding one stage's state at a time. Every
// rank takes part in every broadcast, whatever rank 0's writing does; a
// failure to write is rank 0's error once the broadcasts are done.
func (p *pipeTask) writeCheckpoint(ctx context.Context, at position) (string, error) {
	k, err := p.optimKinds(ctx)
	if err != nil {
		return "", err
	}
	var w *checkpoint.Writer
	var werr error // rank 0's first failure to write
	if p.coord.Rank == 0 {
		model, opt, o := p.checkpointLayout(k)
		meta := checkpoint.Meta{JobID: p.ckpt.jobID, SpecHash: specHash(p.spec), Step: at.step, Epoch: at.epoch,
			EpochConsumed: at.consumed, WorldSize: p.ckpt.world, Seed: p.spec.GetSeed(), Optimizer: o}
		if w, werr = checkpoint.NewWriter(p.ckpt.dir, meta, p.ckpt.meta, model, opt); werr != nil {
			w = nil
		}
	}
	if w != nil {
		defer w.Abort()
	}
	put := func(file, name string, t models.Tensor) {
		if werr == nil {
			werr = w.Put(file, name, t)
		}
	}
	longest := 0
	for _, s := range p.stages {
		longest = max(longest, (1+k)*s.ParamLen+s.BufferLen)
	}
	buf := make([]float32, longest)
	for s, sg := range p.stages {
		// [params | buffers | optimiser buffer 1 | … | k]
		pl, bl := sg.ParamLen, sg.BufferLen
		b := buf[:(1+k)*pl+bl]
		root := p.coord.RankOf(0, s)
		if root == p.coord.Rank {
			copy(b, p.net.Params())
			copy(b[pl:], p.net.Buffers())
			for i, o := range optimParts(p.optim) {
				copy(b[pl+bl+i*pl:], o)
			}
		}
		if err := p.worldCollective(ctx, func(ctx context.Context, seq int64) error {
			return aggregator.Broadcast(ctx, p.world, b, root, seq, p.opt)
		}); err != nil {
			return "", fmt.Errorf("sharing stage %d's state for the checkpoint: %w", s, err)
		}
		if w == nil {
			continue
		}
		for _, g := range stageSegments(p.net, sg, false) {
			put(checkpoint.ModelFile, g.Name, models.F32Tensor(g.Shape, b[g.Offset:g.Offset+g.Len]))
		}
		for _, g := range stageSegments(p.net, sg, true) {
			put(checkpoint.ModelFile, g.Name, models.F32Tensor(g.Shape, b[pl+g.Offset:pl+g.Offset+g.Len]))
		}
		var st checkpoint.State
		p.stageOptim(&st, sg, k, func(i int) []float32 { return b[pl+bl+i*pl : pl+bl+(i+1)*pl] })
		for name, t := range st.Optim {
			put(checkpoint.OptimFile, name, t)
		}
	}
	if werr != nil {
		return "", werr
	}
	if w == nil {
		return "", nil
	}
	return w.Commit(nil, int(p.spec.GetCheckpoint().GetKeep()))
}

// restoreStage loads this stage's part of a whole-model checkpoint into
// the stage's network and optimiser.
func (p *pipeTask) restoreStage(st *checkpoint.State) error {
	params, bufs := map[string]bool{}, map[string]bool{}
	for _, g := range p.net.Segments() {
		params[g.Name] = true
	}
	for _, g := range p.net.BufferSegments() {
		bufs[g.Name] = true
	}
	part := *st
	part.Tensors = map[string]models.Tensor{}
	for name, t := range st.Tensors {
		if params[name] || bufs[name] {
			part.Tensors[name] = t
		}
	}
	part.Optim = map[string]models.Tensor{}
	for name, t := range st.Optim {
		for _, prefix := range []string{checkpoint.MomentumPrefix, checkpoint.AdamMPrefix, checkpoint.AdamVPrefix} {
			if strings.HasPrefix(name, prefix) && params[strings.TrimPrefix(name, prefix)] {
				part.Optim[name] = t
			}
		}
	}
	return restoreCheckpoint(&part, p.a.ResumeFrom, p.spec, p.net, p.optim)
}

// checkpoint writes the job's checkpoint of the state at at when one is
// due; every rank takes part in assembling it.
func (p *pipeTask) checkpoint(ctx context.Context, epoch int, at position) error {
	if p.ckpt == nil || !jobspec.CheckpointDue(p.spec, at.step, at.epoch > epoch, epoch, 0) {
		return nil
	}
	path, err := p.writeCheckpoint(ctx, at)
	if err != nil {
		return fmt.Errorf("writing a checkpoint: %w", err)
	}
	if path == "" {
		return nil // not rank 0
	}
	p.ckpt.lastSave = time.Now()
	p.env.log.Debug("checkpoint written", "job", p.a.JobId, "path", path)
	return nil
}
