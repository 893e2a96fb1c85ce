package federated

import (
	"fmt"
	"strings"

	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/models"
)

// A fedavg job's checkpoint is a Snapshot in the checkpoint package's
// format, written alike by the simulation (one worker) and by the
// coordinator's round driver (real clients):
//
//   - model.safetensors: Snapshot.Model, the global model's state_dict
//     (global parameters and the network's buffers);
//   - extra.safetensors: Snapshot.Server, the server optimiser's state,
//     each tensor named ServerStatePrefix + "<state>.<param>"
//     ("server.momentum.fc.weight"); empty for a stateless optimiser;
//   - meta.json: Step = rounds closed (Snapshot.Completed), Epoch = the
//     last closed round's number (Snapshot.Round); no optimiser state
//     (the clients' SGD keeps none across rounds).

// ServerStatePrefix marks the server optimiser's state among a fedavg
// checkpoint's extra tensors.
const ServerStatePrefix = "server."

// NewSnapshot captures the state after completed closed rounds, the last
// numbered round: net gives the parameter and buffer layout (its values
// are not read), global the global parameters, buffers the network's
// buffers (nil for a network without any), and strat the server
// optimiser's state. The tensors are copies.
func NewSnapshot(round, completed int, net *models.Network, global, buffers []float32, strat *Strategy) Snapshot {
	snap := Snapshot{Round: round, Completed: completed, Model: map[string]models.Tensor{}, Server: map[string]models.Tensor{}}
	checkpoint.PutFlat(snap.Model, "", net.Segments(), global)
	checkpoint.PutFlat(snap.Model, "", net.BufferSegments(), buffers)
	if so, ok := strat.Server.(StatefulOptimizer); ok {
		for name, buf := range so.State() {
			checkpoint.PutFlat(snap.Server, name+".", net.Segments(), buf)
		}
	}
	return snap
}

// Restore loads the snapshot's model (parameters and buffers) into net
// and its server optimiser state into strat.
func (r *Snapshot) Restore(net *models.Network, strat *Strategy) error {
	if err := net.LoadState(r.Model); err != nil {
		return fmt.Errorf("federated: resume: model: %w", err)
	}
	so, ok := strat.Server.(StatefulOptimizer)
	if !ok {
		if len(r.Server) > 0 {
			return fmt.Errorf("federated: resume: strategy %s keeps no server state, but the snapshot has %d tensors", strat.Name, len(r.Server))
		}
		return nil
	}
	if len(r.Server) == 0 {
		return so.SetState(nil)
	}
	state := map[string][]float32{}
	n := 0
	for _, name := range so.StateNames() {
		buf, err := checkpoint.GetFlat(r.Server, name+".", net.Segments())
		if err != nil {
			return fmt.Errorf("federated: resume: server state: %w", err)
		}
		state[name] = buf
		n += len(net.Segments())
	}
	if n != len(r.Server) {
		return fmt.Errorf("federated: resume: server state has %d tensors, strategy %s's has %d", len(r.Server), strat.Name, n)
	}
	return so.SetState(state)
}

// SaveCheckpoint writes snap as a checkpoint in dir (checkpoint.Save,
// keeping the newest keep) and returns its folder. meta names the job
// (JobID, SpecHash, WorldSize, Seed; Created when set); its Step and
// Epoch are snap's. modelMeta goes into model.safetensors's
// __metadata__ (jobspec.ModelMetadata: architecture, input shape,
// classes, normalisation), as in ring and ps checkpoints.
func SaveCheckpoint(dir string, snap Snapshot, meta checkpoint.Meta, modelMeta map[string]string, keep int) (string, error) {
	meta.Step, meta.Epoch = int64(snap.Completed), snap.Round
	st := &checkpoint.State{Meta: meta, Tensors: snap.Model, ModelMeta: modelMeta, Optim: map[string]checkpoint.Tensor{}, Extra: map[string]checkpoint.Tensor{}}
	for name, t := range snap.Server {
		st.Extra[ServerStatePrefix+name] = t
	}
	return checkpoint.Save(dir, st, keep)
}

// LoadCheckpoint reads the fedavg checkpoint at path as the snapshot to
// resume from; specHash is the resuming spec's (jobspec.CheckpointHash),
// and a checkpoint written for another spec is refused.
func LoadCheckpoint(path, specHash string) (*Snapshot, error) {
	st, err := checkpoint.Load(path)
	if err != nil {
		return nil, err
	}
	if st.Meta.SpecHash != specHash {
		return nil, fmt.Errorf("checkpoint %s was written for another spec", path)
	}
	if st.Meta.Step < 0 || st.Meta.Step > int64(st.Meta.Epoch) {
		return nil, fmt.Errorf("checkpoint %s: %d rounds closed by round %d: not a fedavg checkpoint", path, st.Meta.Step, st.Meta.Epoch)
	}
	snap := &Snapshot{Round: st.Meta.Epoch, Completed: int(st.Meta.Step), Model: st.Tensors, Server: map[string]checkpoint.Tensor{}}
	for name, t := range st.Extra {
		rest, ok := strings.CutPrefix(name, ServerStatePrefix)
		if !ok {
			return nil, fmt.Errorf("checkpoint %s: unexpected extra tensor %q in a fedavg checkpoint", path, name)
		}
		snap.Server[rest] = t
	}
	return snap, nil
}
