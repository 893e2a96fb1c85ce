package worker

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/checkpoint"
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
}

// specHash identifies a spec in checkpoints (a resume checks it, less the
// number of workers, which may change).
func specHash(spec *pb.JobSpec) string {
	s := proto.Clone(spec).(*pb.JobSpec)
	s.Workers, s.MinWorkers, s.MaxWorkers = nil, 0, 0
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(s)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// due reports whether a checkpoint is wanted after step (1-based count of
// steps taken), and whether it is an epoch's end.
func (c *checkpointer) due(step int64, epochEnd bool, epoch int, now time.Time) bool {
	cs := c.spec.GetCheckpoint()
	switch {
	case cs.GetEverySteps() > 0 && step%cs.GetEverySteps() == 0:
		return true
	case epochEnd && cs.GetEveryEpochs() > 0 && (epoch+1)%int(cs.GetEveryEpochs()) == 0:
		return true
	case cs.GetEverySeconds() > 0 && now.Sub(c.lastSave).Seconds() >= cs.GetEverySeconds():
		return true
	}
	return false
}

// save writes the network, the optimiser's state and the sampler position.
// epoch is the epoch in progress and consumed the leading positions of its
// global order trained on (0 with epoch+1 at an epoch's end). extra is
// written to extra.safetensors (ring mode: the compression state).
func (c *checkpointer) save(net *models.Network, opt jobspec.Stepper, step int64, epoch int, consumed int64, extra map[string]models.Tensor, now time.Time) (string, error) {
	st := &checkpoint.State{
		Meta: checkpoint.Meta{JobID: c.jobID, SpecHash: specHash(c.spec), Step: step, Epoch: epoch,
			EpochConsumed: consumed, WorldSize: c.world, Seed: c.spec.GetSeed()},
		Tensors: net.State(),
		Extra:   extra,
	}
	switch o := opt.(type) {
	case *optim.SGD:
		st.CaptureSGD(o, net.Segments())
	case *optim.Adam:
		st.CaptureAdam(o, net.Segments())
	}
	path, err := checkpoint.Save(c.dir, st, int(c.spec.GetCheckpoint().GetKeep()))
	if err != nil {
		return "", err
	}
	c.lastSave = now
	return path, nil
}

// resume loads a checkpoint into net and opt and returns where training
// stopped.
func resume(path string, spec *pb.JobSpec, net *models.Network, opt jobspec.Stepper) (checkpoint.Meta, error) {
	st, err := checkpoint.Load(path)
	if err != nil {
		return checkpoint.Meta{}, err
	}
	if st.Meta.SpecHash != specHash(spec) {
		return checkpoint.Meta{}, fmt.Errorf("checkpoint %s was written for another spec", path)
	}
	if err := net.LoadState(st.Tensors); err != nil {
		return checkpoint.Meta{}, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	switch o := opt.(type) {
	case *optim.SGD:
		err = st.RestoreSGD(o, net.Segments())
	case *optim.Adam:
		err = st.RestoreAdam(o, net.Segments())
	}
	if err != nil {
		return checkpoint.Meta{}, fmt.Errorf("checkpoint %s: optimiser state: %w", path, err)
	}
	return st.Meta, nil
}
