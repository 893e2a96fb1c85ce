package paramserver

import (
	"sync"
	"time"

	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/paramserver/psstep"
)

// psCheckpointer writes a ps job's checkpoints. The server holds the
// parameters and the optimiser state, so it writes them, in the same
// format and folder as a ring job's rank 0 (see worker/checkpoint.go):
// after a step when the spec says (psstep.Checkpoints decides, over
// jobspec.CheckpointDue), and at the last applied step when the job
// stops early. The sampler position comes from the step count
// (psstep.Checkpoints.Position), as every rank trains the same number of
// steps in lockstep. Batch norm's running statistics live on each
// worker in ps mode and are not synchronised: a checkpoint holds those
// the job started with.
type psCheckpointer struct {
	dir   string
	keep  int
	hash  string
	jobID string
	seed  int64
	net   *models.Network   // the parameter layout and buffers; read only
	meta  map[string]string // model.safetensors's metadata (jobspec.ModelMetadata)

	// sched decides when a checkpoint is due and where the samplers are
	// (its TrainN is set from the first join); guarded by jobShard.mu.
	sched psstep.Checkpoints

	mu        sync.Mutex // serialises Saves; guards lastSave, savedStep
	lastSave  time.Time
	savedStep int64 // the step of the newest checkpoint on disk
}

// captureLocked copies the shard's state into a checkpoint: the
// parameters after Step() steps, the optimiser's state and the workers'
// sampler position then. p.ckpt must be set and a rank must have joined.
func (p *jobShard) captureLocked() *checkpoint.State {
	c := p.ckpt
	step := p.shard.Step()
	epoch, consumed, _ := c.sched.Position(step)
	st := &checkpoint.State{
		Meta: checkpoint.Meta{JobID: c.jobID, SpecHash: c.hash, Step: step, Epoch: epoch, EpochConsumed: consumed,
			WorldSize: p.world, Seed: c.seed},
		Tensors:   map[string]checkpoint.Tensor{},
		ModelMeta: c.meta,
	}
	checkpoint.PutFlat(st.Tensors, "", c.net.Segments(), p.shard.Params())
	checkpoint.PutFlat(st.Tensors, "", c.net.BufferSegments(), c.net.Buffers())
	// Compression state: the shared part is the server's (PowerSGD's Q
	// it last sent); the ranks' own (error feedback) is gathered when
	// psstep.Checkpoints says so, and a checkpoint of a stopped job has
	// none (a resume starts those residuals at zero, logged by the
	// workers).
	st.Extra = map[string]checkpoint.Tensor{}
	if q := p.recv.Shared(); q != nil {
		st.Extra[compress.CheckpointShared] = models.F32Tensor([]int{len(q)}, q)
	}
	st.CaptureOptimizer(p.opt, c.net.Segments())
	return st
}

// dueLocked returns the decision on a checkpoint after the step the
// shard just applied (psstep.Checkpoints.Due), with the checkpoint's
// state captured unless it is NotDue.
func (p *jobShard) dueLocked(now time.Time) (psstep.Decision, *checkpoint.State) {
	c := p.ckpt
	if c == nil {
		return psstep.NotDue, nil
	}
	c.mu.Lock()
	since := now.Sub(c.lastSave)
	c.mu.Unlock()
	d := c.sched.Due(p.shard.Step(), since, p.recv.OwnLen())
	if d == psstep.NotDue {
		return d, nil
	}
	return d, p.captureLocked()
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
	if !p.stopped || p.trainN == 0 || p.shard.Step() == p.ckpt.sched.StartStep {
		p.mu.Unlock()
		return "", nil
	}
	st := p.captureLocked()
	p.mu.Unlock()
	return p.ckpt.save(st, now)
}
