package checkpoint

import (
	"bytes"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/models"
)

// specs are ts's names, dtypes and shapes (no data).
func specs(ts map[string]Tensor) map[string]Tensor {
	out := map[string]Tensor{}
	for n, t := range ts {
		out[n] = Tensor{DType: t.DType, Shape: t.Shape}
	}
	return out
}

// TestWriterMatchesSave: a checkpoint whose tensors are Put one by one in
// a random order is byte for byte the folder Save writes for the same
// State (resnet8 with batch-norm buffers, SGD momentum or Adam moments,
// model metadata, extra state; and with no optimiser state at all), and
// Load reads it.
func TestWriterMatchesSave(t *testing.T) {
	sgd := &optim.SGD{LR: 0.1, Momentum: 0.9}
	net := trainedNet(t, sgd.Step)
	adam := optim.NewAdamW(1e-3)
	adam.Step(slices.Clone(net.Params()), net.Grads())
	meta := Meta{JobID: "job-1", SpecHash: "abc", Step: 7, Epoch: 1, EpochConsumed: 96, WorldSize: 3, Seed: -4,
		Created: time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)}
	for _, tc := range []struct {
		name    string
		capture func(*State)
	}{
		{"sgd", func(s *State) { s.CaptureSGD(sgd, net.Segments()) }},
		{"adamw", func(s *State) { s.CaptureAdam(adam, net.Segments()) }},
		{"no optimiser state", func(*State) {}},
	} {
		st := &State{Meta: meta, Tensors: net.State(), ModelMeta: map[string]string{"architecture": "resnet8", "classes": "a,b,c"},
			Extra: map[string]Tensor{"compress.q": models.F32Tensor([]int{2}, []float32{1, 2})}}
		tc.capture(st)
		a, b := t.TempDir(), t.TempDir()
		want, err := Save(a, st, 0)
		if err != nil {
			t.Fatal(err)
		}
		w, err := NewWriter(b, st.Meta, st.ModelMeta, specs(st.Tensors), specs(st.Optim))
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, uint64(len(tc.name))))
		for _, file := range []string{OptimFile, ModelFile} {
			ts := st.Tensors
			if file == OptimFile {
				ts = st.Optim
			}
			names := slices.Collect(maps.Keys(ts))
			rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
			for _, n := range names {
				if err := w.Put(file, n, ts[n]); err != nil {
					t.Fatal(err)
				}
			}
		}
		got, err := w.Commit(st.Extra, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range append(slices.Clone(dataFiles), MetaFile) {
			x, err := os.ReadFile(filepath.Join(want, f))
			if err != nil {
				t.Fatal(err)
			}
			y, err := os.ReadFile(filepath.Join(got, f))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(x, y) {
				t.Errorf("%s: %s differs from Save's (%d and %d bytes)", tc.name, f, len(y), len(x))
			}
		}
		if _, err := Load(got); err != nil {
			t.Errorf("%s: Load: %v", tc.name, err)
		}
	}
}

// TestWriterRefuses: a tensor not announced, of the wrong size, or twice
// is refused; a checkpoint missing a tensor is not committed and leaves
// nothing behind; Abort removes what was written.
func TestWriterRefuses(t *testing.T) {
	model := map[string]Tensor{"a": models.F32Tensor([]int{2}, []float32{1, 2}), "b": models.F32Tensor([]int{1, 3}, []float32{1, 2, 3})}
	dir := t.TempDir()
	w, err := NewWriter(dir, Meta{Step: 3}, nil, specs(model), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		file, name string
		t          Tensor
		want       string
	}{
		{ModelFile, "c", model["a"], "no tensor"},
		{ModelFile, "a", model["b"], "has 12 bytes, want 8"},
		{ExtraFile, "a", model["a"], "not a file being written"},
	} {
		if err := w.Put(tc.file, tc.name, tc.t); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Put(%s, %s): %v; want %q", tc.file, tc.name, err, tc.want)
		}
	}
	if err := w.Put(ModelFile, "a", model["a"]); err != nil {
		t.Fatal(err)
	}
	if err := w.Put(ModelFile, "a", model["a"]); err == nil || !strings.Contains(err.Error(), "came twice") {
		t.Errorf("a twice: %v", err)
	}
	if _, err := w.Commit(nil, 0); err == nil || !strings.Contains(err.Error(), `"b" never came`) {
		t.Errorf("Commit without b: %v", err)
	}
	if es, _ := os.ReadDir(dir); len(es) != 0 {
		t.Errorf("after a failed Commit %s holds %v", dir, es)
	}
	w, err = NewWriter(dir, Meta{Step: 4}, nil, specs(model), nil)
	if err != nil {
		t.Fatal(err)
	}
	w.Abort()
	if es, _ := os.ReadDir(dir); len(es) != 0 {
		t.Errorf("after Abort %s holds %v", dir, es)
	}
	if _, err := NewWriter(dir, Meta{Step: -1}, nil, nil, nil); err == nil {
		t.Error("a negative step was taken")
	}
	if _, err := NewWriter(dir, Meta{}, map[string]string{"format": "x"}, nil, nil); err == nil {
		t.Error(`ModelMeta "format" was taken`)
	}
}
