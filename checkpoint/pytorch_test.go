package checkpoint_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// torchPython is the Python with torch (Debian's python3-torch); the
// pyenv python3 on PATH may lack it.
const torchPython = "/usr/bin/python3"

// safetensorsShim stands in for the safetensors package where it is not
// installed (it is not a Debian package): safe_open(...).metadata() and
// safetensors.torch.load_file for F32 and I64 tensors, read as the format
// specifies (u64 header length, JSON header, little-endian data).
const safetensorsShim = `
import json, struct
import torch as _torch  # the package's own submodule is named torch
class safe_open:
    def __init__(self, path, framework):
        with open(path, "rb") as f:
            b = f.read()
        n = struct.unpack("<Q", b[:8])[0]
        self.h = json.loads(b[8:8 + n])
        self.data = b[8 + n:]
    def metadata(self):
        return self.h.get("__metadata__")
    def tensors(self):
        dt = {"F32": _torch.float32, "I64": _torch.int64}
        out = {}
        for k, v in self.h.items():
            if k == "__metadata__":
                continue
            lo, hi = v["data_offsets"]
            out[k] = _torch.frombuffer(bytearray(self.data[lo:hi]), dtype=dt[v["dtype"]]).reshape(v["shape"]).clone()
        return out
`

// TestPyTorchLoadsCheckpoint runs the README's PyTorch lines on a
// checkpoint of a CIFAR resnet18 (BN running statistics moved off their
// initial values) and a PNG: torchvision's resnet18 adapted as the README
// says loads the state_dict (only num_batches_tracked missing, nothing
// unexpected), normalises the image with the metadata's mean and std, and
// gives gradsync's logits (1e-4) and class name for the same file.
func TestPyTorchLoadsCheckpoint(t *testing.T) {
	if err := exec.Command(torchPython, "-c", "import torch, torchvision, PIL").Run(); err != nil {
		t.Skipf("%s with torch, torchvision and PIL not available: %v", torchPython, err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	snippet := readmeSnippet(t, string(readme))

	names := []string{"airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"}
	mean, std := []float64{0.4914, 0.4822, 0.4465}, []float64{0.2470, 0.2435, 0.2616}
	spec, err := jobspec.Normalize(&pb.JobSpec{Model: "resnet18", Mode: "ring", Workers: proto.Int32(2),
		Dataset: &pb.DatasetSpec{Name: "cifar10", Mean: mean, Std: std,
			Shape: &pb.DataShape{Channels: 3, Height: 32, Width: 32, Classes: 10, ClassNames: names}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	net, err := models.New("resnet18", models.Options{Channels: 3, Height: 32, Width: 32, Classes: 10, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer net.Close()
	rng := rand.New(rand.NewPCG(7, 8))
	warm := make([]float32, 4*net.InputSize())
	for i := range warm {
		warm[i] = float32(rng.NormFloat64())
	}
	for range 3 { // training-mode passes move the BN running statistics
		net.Forward(warm, 4, true)
	}

	dir := t.TempDir()
	meta := jobspec.ModelMetadata(spec, nil, nil)
	if _, err := checkpoint.Save(filepath.Join(dir, "checkpoints"), &checkpoint.State{
		Meta:      checkpoint.Meta{JobID: "job-1", Step: 390, WorldSize: 2, Created: time.Unix(1, 0)},
		Tensors:   net.State(),
		ModelMeta: meta,
	}, 0); err != nil {
		t.Fatal(err)
	}
	st, err := checkpoint.Load(filepath.Join(dir, "checkpoints", "ckpt-390"))
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(st.ModelMeta); got != fmt.Sprint(meta) {
		t.Errorf("Load's ModelMeta %s, want %s", got, meta)
	}

	// The image, and gradsync's logits for it through the loader's
	// normalisation.
	img := image.NewNRGBA(image.Rect(0, 0, 32, 32))
	pix := make([]uint8, 3*32*32)
	for y := range 32 {
		for x := range 32 {
			c := color.NRGBA{uint8(rng.IntN(256)), uint8(rng.IntN(256)), uint8(rng.IntN(256)), 255}
			img.SetNRGBA(x, y, c)
			pix[0*1024+y*32+x], pix[1*1024+y*32+x], pix[2*1024+y*32+x] = c.R, c.G, c.B
		}
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cat.png"), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	norm, err := data.NewNormalizer(data.Info{N: 1, C: 3, H: 32, W: 32, Classes: 10}, mean, std)
	if err != nil {
		t.Fatal(err)
	}
	x := make([]float32, len(pix))
	norm.Apply(x, pix)
	want := net.Forward(x, 1, false)
	best := 0
	for i, v := range want {
		if v > want[best] {
			best = i
		}
	}

	env := os.Environ()
	if exec.Command(torchPython, "-c", "import safetensors").Run() != nil {
		shim := filepath.Join(dir, "shim", "safetensors")
		if err := os.MkdirAll(shim, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(shim, "__init__.py"), []byte(safetensorsShim), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(shim, "torch.py"), []byte("from . import safe_open\ndef load_file(path):\n    return safe_open(path, 'pt').tensors()\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		env = append(env, "PYTHONPATH="+filepath.Join(dir, "shim"))
		t.Log("safetensors not installed: a minimal reader stands in for it")
	}
	check := snippet + `
r = net.load_state_dict(load_file("checkpoints/ckpt-390/model.safetensors"), strict=False)
print(json.dumps({"missing": r.missing_keys, "unexpected": r.unexpected_keys, "logits": net(x[None])[0].tolist()}))
`
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, torchPython, "-c", check)
	cmd.Dir, cmd.Env = dir, append(env, "OMP_NUM_THREADS=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the README's lines: %v\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 {
		t.Fatalf("output %q, want the class name and the check's JSON", out)
	}
	if lines[0] != names[best] {
		t.Errorf("PyTorch classifies the image as %q, gradsync as %q", lines[0], names[best])
	}
	var got struct {
		Missing, Unexpected []string
		Logits              []float64
	}
	if err := json.Unmarshal([]byte(lines[1]), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Unexpected) != 0 {
		t.Errorf("unexpected keys %v", got.Unexpected)
	}
	for _, k := range got.Missing {
		if !strings.HasSuffix(k, ".num_batches_tracked") {
			t.Errorf("missing key %s", k)
		}
	}
	if len(got.Logits) != len(want) {
		t.Fatalf("%d logits from PyTorch, %d from gradsync", len(got.Logits), len(want))
	}
	var scale, worst float64
	for i := range want {
		scale = max(scale, math.Abs(float64(want[i])))
		worst = max(worst, math.Abs(got.Logits[i]-float64(want[i])))
	}
	t.Logf("class %s; logits worst difference %.2e of max |logit| %.3f", lines[0], worst, scale)
	if worst > 1e-4*max(scale, 1) {
		t.Errorf("logits differ by %.2e (max |logit| %.3f): PyTorch %v, gradsync %v", worst, scale, got.Logits, want)
	}
}

// readmeSnippet returns the python block after the README's
// "pytorch-load" marker.
func readmeSnippet(t *testing.T, readme string) string {
	t.Helper()
	_, after, ok := strings.Cut(readme, "<!-- pytorch-load")
	if !ok {
		t.Fatal("README.md has no pytorch-load block")
	}
	_, after, ok = strings.Cut(after, "```python\n")
	if !ok {
		t.Fatal("README.md: no python block after the pytorch-load marker")
	}
	block, _, ok := strings.Cut(after, "```")
	if !ok {
		t.Fatal("README.md: the pytorch-load block is not closed")
	}
	return block
}

// TestModelMetaFormatReserved: ModelMeta cannot replace "format".
func TestModelMetaFormatReserved(t *testing.T) {
	_, err := checkpoint.Save(t.TempDir(), &checkpoint.State{Meta: checkpoint.Meta{Step: 1}, ModelMeta: map[string]string{"format": "np"}}, 0)
	if err == nil || !strings.Contains(err.Error(), `"format"`) {
		t.Errorf("Save with ModelMeta format: %v, want a refusal", err)
	}
}
