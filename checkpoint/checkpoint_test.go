package checkpoint

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gradsync/gradsync/internal/optim"
	"github.com/gradsync/gradsync/models"
)

// trainedNet returns a resnet8 (parameters and batch-norm buffers) after
// two steps of opt on a fixed batch, so every piece of state is non-trivial.
func trainedNet(t *testing.T, step func(params, grads []float32)) *models.Network {
	t.Helper()
	net, err := models.New("resnet8", models.Options{Channels: 1, Height: 8, Width: 8, Classes: 3, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	const batch = 4
	x := make([]float32, batch*net.InputSize())
	for i := range x {
		x[i] = float32(i%13) / 13
	}
	y := []uint8{0, 1, 2, 1}
	dl := make([]float32, batch*3)
	for range 2 {
		net.ZeroGrad()
		logits := net.Forward(x, batch, true)
		models.SoftmaxCrossEntropy(logits, y, 3, dl)
		net.Backward(dl)
		step(net.Params(), net.Grads())
	}
	return net
}

func TestSaveLoadRoundTrip(t *testing.T) {
	sgd := &optim.SGD{LR: 0.1, Momentum: 0.9}
	net := trainedNet(t, sgd.Step)
	adam := optim.NewAdamW(1e-3)
	adam.Step(slices.Clone(net.Params()), net.Grads())
	adam.Step(slices.Clone(net.Params()), net.Grads())

	dir := t.TempDir()
	want := Meta{JobID: "job-1", SpecHash: "abc", Step: 7, Epoch: 1, EpochConsumed: 96, WorldSize: 3, Seed: -4,
		RNG: map[string][]byte{"dropout": {0, 1, 2, 255}}, Created: time.Date(2025, 1, 2, 3, 4, 5, 6, time.FixedZone("x", 3600))}
	for _, tc := range []struct {
		name    string
		capture func(*State)
		restore func(*State) error
	}{
		{"sgd", func(s *State) { s.CaptureSGD(sgd, net.Segments()) }, func(s *State) error {
			o := &optim.SGD{}
			if err := s.RestoreSGD(o, net.Segments()); err != nil {
				return err
			}
			if !slices.Equal(o.State(), sgd.State()) {
				return errors.New("momentum differs")
			}
			return nil
		}},
		{"adamw", func(s *State) { s.CaptureAdam(adam, net.Segments()) }, func(s *State) error {
			o := optim.NewAdamW(1e-3)
			if err := s.RestoreAdam(o, net.Segments()); err != nil {
				return err
			}
			m, v, n := o.State()
			wm, wv, wn := adam.State()
			if !slices.Equal(m, wm) || !slices.Equal(v, wv) || n != wn || n != 2 {
				return fmt.Errorf("adam state differs (steps %d, want %d)", n, wn)
			}
			if err := s.RestoreAdam(optim.NewAdam(1e-3), net.Segments()); err == nil {
				return errors.New("RestoreAdam into plain Adam accepted an AdamW checkpoint")
			}
			if err := s.RestoreSGD(&optim.SGD{}, net.Segments()); err == nil {
				return errors.New("RestoreSGD accepted an AdamW checkpoint")
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &State{Meta: want, Tensors: net.State(), Extra: map[string]Tensor{
				"compress.powersgd.q.fc.weight": models.F32Tensor([]int{3, 2}, []float32{1, 2, 3, 4, 5, 6}),
				"server.adam.step":              {DType: "I64", Shape: []int{}, Data: []byte{9, 0, 0, 0, 0, 0, 0, 0}},
			}}
			tc.capture(s)
			path, err := Save(filepath.Join(dir, tc.name), s, 2)
			if err != nil {
				t.Fatal(err)
			}
			if filepath.Base(path) != "ckpt-7" {
				t.Fatalf("path %s", path)
			}
			got, err := Load(path)
			if err != nil {
				t.Fatal(err)
			}
			m := got.Meta
			if m.Format != FormatVersion || m.JobID != want.JobID || m.SpecHash != want.SpecHash || m.Step != want.Step ||
				m.Epoch != want.Epoch || m.EpochConsumed != want.EpochConsumed || m.WorldSize != want.WorldSize ||
				m.Seed != want.Seed || !maps.EqualFunc(m.RNG, want.RNG, bytes.Equal) || !m.Created.Equal(want.Created) ||
				m.Optimizer != s.Meta.Optimizer || len(m.Files) != 3 {
				t.Errorf("meta round trip:\n got %+v\nwant %+v", m, want)
			}
			fresh, err := models.New("resnet8", net.Options())
			if err != nil {
				t.Fatal(err)
			}
			if err := fresh.LoadState(got.Tensors); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(fresh.Params(), net.Params()) || !slices.Equal(fresh.Buffers(), net.Buffers()) {
				t.Error("parameters or buffers differ after the round trip")
			}
			if err := tc.restore(got); err != nil {
				t.Error(err)
			}
			for name, tt := range s.Extra {
				g := got.Extra[name]
				if g.DType != tt.DType || !slices.Equal(g.Shape, tt.Shape) || !bytes.Equal(g.Data, tt.Data) {
					t.Errorf("extra %s differs", name)
				}
			}
		})
	}
}

// TestModelFileIsTorchStateDict checks model.safetensors against a
// state_dict PyTorch wrote (scripts/torch_fixtures.py): the same names,
// dtypes, shapes and bytes, num_batches_tracked aside, so
// Module.load_state_dict accepts it (strict=False for num_batches_tracked,
// which torch then leaves at its current value).
func TestModelFileIsTorchStateDict(t *testing.T) {
	b, err := os.ReadFile("../models/testdata/parity/resnet8.state.safetensors")
	if err != nil {
		t.Skip(err)
	}
	torch, _, err := models.ReadSafetensors(b)
	if err != nil {
		t.Fatal(err)
	}
	b, err = os.ReadFile("../models/testdata/parity/resnet8.io.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	_, ioMeta, err := models.ReadSafetensors(b)
	if err != nil {
		t.Fatal(err)
	}
	var opt models.Options
	if _, err := fmt.Sscanf(ioMeta["input"], "%dx%dx%d", &opt.Channels, &opt.Height, &opt.Width); err != nil {
		t.Fatalf("fixture metadata input %q: %v", ioMeta["input"], err)
	}
	net, err := models.New("resnet8", opt)
	if err != nil {
		t.Fatal(err)
	}
	if err := net.LoadState(torch); err != nil {
		t.Fatal(err)
	}
	path, err := Save(t.TempDir(), &State{Tensors: net.State()}, 1)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(path, ModelFile))
	if err != nil {
		t.Fatal(err)
	}
	ours, meta, err := models.ReadSafetensors(raw)
	if err != nil {
		t.Fatal(err)
	}
	if meta["format"] != "pt" {
		t.Errorf("metadata %v, want format pt", meta)
	}
	for name, tt := range torch {
		if strings.HasSuffix(name, ".num_batches_tracked") {
			continue
		}
		o, ok := ours[name]
		if !ok {
			t.Errorf("model.safetensors lacks %s", name)
			continue
		}
		if o.DType != tt.DType || !slices.Equal(o.Shape, tt.Shape) || !bytes.Equal(o.Data, tt.Data) {
			t.Errorf("%s: %s%v, torch %s%v (or data differs)", name, o.DType, o.Shape, tt.DType, tt.Shape)
		}
	}
	for name := range ours {
		if _, ok := torch[name]; !ok {
			t.Errorf("model.safetensors has %s, torch's state_dict does not", name)
		}
	}
}

func small(step int64) *State {
	return &State{
		Meta:    Meta{JobID: "j", Step: step, WorldSize: 2},
		Tensors: map[string]Tensor{"fc.weight": models.F32Tensor([]int{2, 3}, []float32{1, 2, 3, 4, 5, float32(step)})},
		Optim:   map[string]Tensor{"momentum_buffer.fc.weight": models.F32Tensor([]int{2, 3}, []float32{6, 5, 4, 3, 2, 1})},
	}
}

// names lists dir's entries, hidden ones included.
func names(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, de := range des {
		out = append(out, de.Name())
	}
	slices.Sort(out)
	return out
}

func TestKeep(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b") // created by Save
	for step := int64(1); step <= 6; step++ {
		if _, err := Save(dir, small(step), 3); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := names(t, dir), []string{"ckpt-4", "ckpt-5", "ckpt-6"}; !slices.Equal(got, want) {
		t.Errorf("after 6 saves with keep 3: %v, want %v", got, want)
	}
	// A crashed writer's leftovers go at the next Save.
	os.Mkdir(filepath.Join(dir, ".tmp-ckpt-7-123"), 0o755)
	os.Mkdir(filepath.Join(dir, ".trash-ckpt-2-456"), 0o755)
	if _, err := Save(dir, small(7), 0); err != nil {
		t.Fatal(err)
	}
	if got, want := names(t, dir), []string{"ckpt-4", "ckpt-5", "ckpt-6", "ckpt-7"}; !slices.Equal(got, want) {
		t.Errorf("keep 0: %v, want %v", got, want)
	}
}

func TestSaveAbandonsNewerAndReplacesSame(t *testing.T) {
	dir := t.TempDir()
	for _, step := range []int64{10, 20, 30} {
		if _, err := Save(dir, small(step), 5); err != nil {
			t.Fatal(err)
		}
	}
	// The run resumed from step 20 (say 30 was corrupt) and saves 20 and
	// then 25: 30 is abandoned, 20 replaced.
	s := small(20)
	s.Meta.JobID = "replaced"
	if _, err := Save(dir, s, 5); err != nil {
		t.Fatal(err)
	}
	if got, want := names(t, dir), []string{"ckpt-10", "ckpt-20"}; !slices.Equal(got, want) {
		t.Errorf("%v, want %v", got, want)
	}
	got, path, skipped, err := Latest(dir)
	if err != nil || len(skipped) != 0 || filepath.Base(path) != "ckpt-20" || got.Meta.JobID != "replaced" {
		t.Fatalf("Latest: %s %v %v", path, skipped, err)
	}
}

func TestSaveRejects(t *testing.T) {
	dir := t.TempDir()
	bad := small(1)
	bad.Tensors["x"] = Tensor{DType: "F32", Shape: []int{3}, Data: make([]byte, 8)}
	if _, err := Save(dir, bad, 1); err == nil {
		t.Error("Save accepted a tensor whose data does not fit its shape")
	}
	if _, err := Save(dir, small(-1), 1); err == nil {
		t.Error("Save accepted step -1")
	}
	if got := names(t, dir); len(got) != 0 {
		t.Errorf("failed saves left %v", got)
	}
}

// rewriteMeta applies edit to dir/meta.json's Meta and writes it back
// with a valid checksum, so only edit's effect is under test.
func rewriteMeta(t *testing.T, dir string, edit func(*Meta)) {
	t.Helper()
	p := filepath.Join(dir, MetaFile)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	m, err := decodeMeta(b)
	if err != nil {
		t.Fatal(err)
	}
	edit(&m)
	if b, err = encodeMeta(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func flipByte(t *testing.T, path string, at func(size int) int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[at(len(b))] ^= 0x01
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLatestSkipsCorrupt(t *testing.T) {
	for _, tc := range []struct {
		name    string
		corrupt func(t *testing.T, ck string)
		reason  string
	}{
		{"flip model byte", func(t *testing.T, ck string) {
			flipByte(t, filepath.Join(ck, ModelFile), func(n int) int { return n - 3 })
		}, "model.safetensors: sha256"},
		{"truncate optim", func(t *testing.T, ck string) {
			if err := os.Truncate(filepath.Join(ck, OptimFile), 40); err != nil {
				t.Fatal(err)
			}
		}, "optim.safetensors: 40 bytes"},
		{"empty model", func(t *testing.T, ck string) {
			if err := os.Truncate(filepath.Join(ck, ModelFile), 0); err != nil {
				t.Fatal(err)
			}
		}, "model.safetensors: 0 bytes"},
		{"missing extra", func(t *testing.T, ck string) {
			if err := os.Remove(filepath.Join(ck, ExtraFile)); err != nil {
				t.Fatal(err)
			}
		}, "extra.safetensors: missing"},
		{"missing meta", func(t *testing.T, ck string) {
			if err := os.Remove(filepath.Join(ck, MetaFile)); err != nil {
				t.Fatal(err)
			}
		}, "meta.json: missing"},
		{"flip meta value", func(t *testing.T, ck string) {
			// "step": 2 becomes "step": 3, still valid JSON.
			p := filepath.Join(ck, MetaFile)
			b, _ := os.ReadFile(p)
			b = bytes.Replace(b, []byte(`"step": 2,`), []byte(`"step": 3,`), 1)
			os.WriteFile(p, b, 0o644)
		}, "meta.json: checksum"},
		{"truncate meta", func(t *testing.T, ck string) {
			if err := os.Truncate(filepath.Join(ck, MetaFile), 50); err != nil {
				t.Fatal(err)
			}
		}, "meta.json: unexpected EOF"},
		{"future format", func(t *testing.T, ck string) {
			rewriteMeta(t, ck, func(m *Meta) { m.Format = 2 })
		}, "format 2"},
		{"wrong folder", func(t *testing.T, ck string) {
			rewriteMeta(t, ck, func(m *Meta) { m.Step = 1 })
		}, "folder ckpt-2 holds step 1"},
		{"file list", func(t *testing.T, ck string) {
			rewriteMeta(t, ck, func(m *Meta) { delete(m.Files, ExtraFile) })
		}, "lists files"},
		{"malformed safetensors with matching hash", func(t *testing.T, ck string) {
			// A writer bug rather than bit rot: the hash matches, the
			// contents do not parse.
			p := filepath.Join(ck, ModelFile)
			b, _ := os.ReadFile(p)
			b = b[:len(b)-4]
			os.WriteFile(p, b, 0o644)
			f, err := writeFile(p+".x", func(w io.Writer) error { _, err := w.Write(b); return err })
			if err != nil {
				t.Fatal(err)
			}
			os.Remove(p + ".x")
			rewriteMeta(t, ck, func(m *Meta) { m.Files[ModelFile] = f })
		}, "model.safetensors: models: safetensors: tensor \"fc.weight\" has offsets"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, step := range []int64{1, 2} {
				if _, err := Save(dir, small(step), 0); err != nil {
					t.Fatal(err)
				}
			}
			ck := filepath.Join(dir, "ckpt-2")
			tc.corrupt(t, ck)
			if _, err := Load(ck); !errors.Is(err, ErrCorrupt) {
				t.Errorf("Load: %v, want ErrCorrupt", err)
			}
			s, path, skipped, err := Latest(dir)
			if err != nil {
				t.Fatal(err)
			}
			if filepath.Base(path) != "ckpt-1" || s.Meta.Step != 1 {
				t.Errorf("Latest returned %s", path)
			}
			if len(skipped) != 1 || skipped[0].Path != ck || !errors.Is(skipped[0].Err, ErrCorrupt) ||
				!strings.Contains(skipped[0].Err.Error(), tc.reason) {
				t.Errorf("skipped %v, want %s with reason containing %q", skipped, ck, tc.reason)
			}
		})
	}
}

func TestLatestNone(t *testing.T) {
	dir := t.TempDir()
	if _, _, _, err := Latest(filepath.Join(dir, "nope")); !errors.Is(err, ErrNoCheckpoint) {
		t.Errorf("missing dir: %v", err)
	}
	// Hidden temporary folders and other names are not checkpoints; a
	// ckpt-<step> that is not a folder is reported.
	if _, err := Save(dir, small(3), 0); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(dir, ".tmp-ckpt-9-1"), 0o755)
	os.Mkdir(filepath.Join(dir, "ckpt-007"), 0o755)
	os.WriteFile(filepath.Join(dir, "ckpt-8"), []byte("x"), 0o644)
	flipByte(t, filepath.Join(dir, "ckpt-3", OptimFile), func(n int) int { return n / 2 })
	s, _, skipped, err := Latest(dir)
	if !errors.Is(err, ErrNoCheckpoint) || s != nil {
		t.Errorf("all corrupt: %v", err)
	}
	if len(skipped) != 2 || !strings.HasSuffix(skipped[0].Path, "ckpt-8") || !strings.HasSuffix(skipped[1].Path, "ckpt-3") {
		t.Errorf("skipped %v", skipped)
	}
}

func TestGetFlatErrors(t *testing.T) {
	segs := []models.Segment{{Name: "a", Shape: []int{2}, Offset: 0, Len: 2}, {Name: "b", Shape: []int{1, 3}, Offset: 2, Len: 3}}
	m := map[string]Tensor{}
	PutFlat(m, "p.", segs, []float32{1, 2, 3, 4, 5})
	got, err := GetFlat(m, "p.", segs)
	if err != nil || !slices.Equal(got, []float32{1, 2, 3, 4, 5}) {
		t.Fatalf("%v %v", got, err)
	}
	m["p.c"] = m["p.a"]
	m["p.b"] = models.F32Tensor([]int{3}, []float32{3, 4, 5})
	delete(m, "p.a")
	_, err = GetFlat(m, "p.", segs)
	for _, want := range []string{`missing tensor "p.a"`, "p.b: shape [3], want [1 3]", `unexpected tensor "p.c"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
}
