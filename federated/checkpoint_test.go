package federated

import (
	"context"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/data"
)

// TestCheckpointRoundTrip: a snapshot written by SaveCheckpoint (server
// state as server.<state>.<param>, rounds in the meta) loads back as the
// same snapshot; a checkpoint of another spec, or with extra tensors that
// are not server state, is refused.
func TestCheckpointRoundTrip(t *testing.T) {
	tr, te := synthetic(t, 200, 50)
	cfg := SimConfig{Train: tr, Test: te, Partition: data.PartitionIID(tr.Labels, 4, 1), Rounds: 3, Fraction: 0.5,
		Strategy: StrategyConfig{Name: "fedadam"}, Seed: 1}
	s, err := NewSim(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	snap := s.Snapshot()
	dir := t.TempDir()
	modelMeta := map[string]string{"gradsync.architecture": "logreg", "gradsync.classes": "10"}
	path, err := SaveCheckpoint(dir, snap, checkpoint.Meta{JobID: "job-1", SpecHash: "h", WorldSize: 3}, modelMeta, 0)
	if err != nil {
		t.Fatal(err)
	}
	st, err := checkpoint.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Meta.Step != 3 || st.Meta.Epoch != 3 || st.Meta.JobID != "job-1" || st.Meta.WorldSize != 3 || len(st.Optim) != 0 {
		t.Errorf("meta %+v, %d optimiser tensors; want step = epoch = 3, the job's id and world size, none", st.Meta, len(st.Optim))
	}
	if !maps.Equal(st.ModelMeta, modelMeta) {
		t.Errorf("model.safetensors metadata %v; want %v", st.ModelMeta, modelMeta)
	}
	if len(st.Extra) != 4 { // m and v of fc.weight and fc.bias
		t.Errorf("extra tensors %v; want server.{m,v}.fc.{weight,bias}", slices.Sorted(maps.Keys(st.Extra)))
	}
	for name := range st.Extra {
		if !strings.HasPrefix(name, ServerStatePrefix) {
			t.Errorf("extra tensor %q without the %q prefix", name, ServerStatePrefix)
		}
	}
	got, err := LoadCheckpoint(path, "h")
	if err != nil {
		t.Fatal(err)
	}
	if got.Round != snap.Round || got.Completed != snap.Completed {
		t.Errorf("loaded round %d, completed %d; want %d, %d", got.Round, got.Completed, snap.Round, snap.Completed)
	}
	sameTensors(t, "model", got.Model, snap.Model)
	sameTensors(t, "server state", got.Server, snap.Server)

	if _, err := LoadCheckpoint(path, "other"); err == nil || !strings.Contains(err.Error(), "another spec") {
		t.Errorf("checkpoint of another spec: err %v", err)
	}
	st.Extra["compress.q"] = st.Extra[ServerStatePrefix+"m.fc.bias"]
	odd, err := checkpoint.Save(filepath.Join(dir, "odd"), st, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCheckpoint(odd, "h"); err == nil || !strings.Contains(err.Error(), "compress.q") {
		t.Errorf("checkpoint with a foreign extra tensor: err %v", err)
	}
	if _, err := LoadCheckpoint(filepath.Join(dir, "none"), "h"); err == nil {
		t.Error("a checkpoint that does not exist loaded")
	}
}
