package worker

import (
	"fmt"
	"time"

	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// checkpointer writes rank 0's training state when the spec's
// checkpoint conditions say so.
type checkpointer struct {
	dir      string
	spec     *pb.JobSpec
	jobID    string
	world    int
	lastSave time.Time
	meta     map[string]string // model.safetensors's metadata (jobspec.ModelMetadata)
}

// specHash identifies a spec in checkpoints (a resume checks it, less the
// number of workers, which may change).
func specHash(spec *pb.JobSpec) string { return jobspec.CheckpointHash(spec) }

// due reports whether a checkpoint is wanted after step (1-based count of
// steps taken), and whether it is an epoch's end.
func (c *checkpointer) due(step int64, epochEnd bool, epoch int, now time.Time) bool {
	return jobspec.CheckpointDue(c.spec, step, epochEnd, epoch, now.Sub(c.lastSave))
}

// save writes the network, the optimiser's state and the sampler position.
// epoch is the epoch in progress and consumed the leading positions of its
// global order trained on (0 with epoch+1 at an epoch's end). extra is
// written to extra.safetensors (ring mode: the compression state).
func (c *checkpointer) save(net *models.Network, opt optim.Stepper, step int64, epoch int, consumed int64, extra map[string]models.Tensor, now time.Time) (string, error) {
	st := &checkpoint.State{
		Meta: checkpoint.Meta{JobID: c.jobID, SpecHash: specHash(c.spec), Step: step, Epoch: epoch,
			EpochConsumed: consumed, WorldSize: c.world, Seed: c.spec.GetSeed()},
		Tensors:   net.State(),
		ModelMeta: c.meta,
		Extra:     extra,
	}
	st.CaptureOptimizer(opt, net.Segments())
	path, err := checkpoint.Save(c.dir, st, int(c.spec.GetCheckpoint().GetKeep()))
	if err != nil {
		return "", err
	}
	c.lastSave = now
	return path, nil
}

// restoreCheckpoint loads st, the checkpoint read from path, into net and
// opt, once it has checked that st was written for spec.
func restoreCheckpoint(st *checkpoint.State, path string, spec *pb.JobSpec, net *models.Network, opt optim.Stepper) error {
	if st.Meta.SpecHash != specHash(spec) {
		return fmt.Errorf("checkpoint %s was written for another spec", path)
	}
	if err := net.LoadState(st.Tensors); err != nil {
		return fmt.Errorf("checkpoint %s: %w", path, err)
	}
	if err := st.RestoreOptimizer(opt, net.Segments()); err != nil {
		return fmt.Errorf("checkpoint %s: optimiser state: %w", path, err)
	}
	return nil
}

// normalization returns what obj's inputs are normalised with, one value
// or one per channel: x = (p/255 − mean)/std; nil when it does not say.
func normalization(obj objective) (mean, std []float64) {
	switch o := obj.(type) {
	case *streamed:
		return o.mean, o.std
	case *classification:
		return datasetNormalization(o.train)
	}
	return nil, nil
}

func datasetNormalization(d *data.Dataset) (mean, std []float64) {
	if d.ChannelMean != nil {
		return d.ChannelMean, d.ChannelStd
	}
	return []float64{float64(d.Mean)}, []float64{float64(d.Std)}
}
