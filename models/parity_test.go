package models

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTorchParity loads the fixtures scripts/torch_fixtures.py writes
// (PyTorch's weights, input batch, logits, loss and gradients for each
// architecture) and checks the Go networks reproduce them: logits and
// running statistics within 1e-4 and gradients within 1e-3, relative to
// the largest magnitude in each tensor, on every GEMM backend.
// Regenerate with: /usr/bin/python3 scripts/torch_fixtures.py
func TestTorchParity(t *testing.T) {
	for _, arch := range []string{"mlp", "lenet5", "cnn", "fedcnn", "resnet8", "vit-tiny"} {
		t.Run(arch, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T) { checkParity(t, arch) })
		})
	}
}

func readFixture(t *testing.T, name string) (map[string]Tensor, map[string]string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "parity", name))
	if err != nil {
		t.Fatal(err)
	}
	ts, meta, err := ReadSafetensors(b)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return ts, meta
}

func f32(t *testing.T, ts map[string]Tensor, name string) []float32 {
	t.Helper()
	tt, ok := ts[name]
	if !ok {
		t.Fatalf("fixture has no %q", name)
	}
	v, err := tt.Float32s()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return v
}

func checkParity(t *testing.T, arch string) {
	state, _ := readFixture(t, arch+".state.safetensors")
	io, meta := readFixture(t, arch+".io.safetensors")
	var opt Options
	if _, err := fmt.Sscanf(meta["input"], "%dx%dx%d", &opt.Channels, &opt.Height, &opt.Width); err != nil {
		t.Fatalf("metadata input %q: %v", meta["input"], err)
	}
	n, err := New(arch, opt)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.LoadState(state); err != nil {
		t.Fatal(err)
	}
	x := f32(t, io, "x")
	lab, err := io["labels"].Int64s()
	if err != nil {
		t.Fatal(err)
	}
	labels := make([]uint8, len(lab))
	for i, l := range lab {
		labels[i] = uint8(l)
	}
	batch := len(labels)
	if _, ok := io["logits_eval"]; ok {
		near(t, "logits_eval", n.Forward(x, batch, false), f32(t, io, "logits_eval"), 1e-4)
	}
	train := meta["mode"] == "train"
	n.ZeroGrad()
	logits := n.Forward(x, batch, train)
	near(t, "logits", logits, f32(t, io, "logits"), 1e-4)
	d := make([]float32, len(logits))
	loss := SoftmaxCrossEntropy(logits, labels, n.Options().Classes, d)
	near(t, "loss", []float32{loss}, f32(t, io, "loss"), 1e-5)
	n.Backward(d)
	for _, s := range n.Segments() {
		near(t, "grad."+s.Name, n.Grads()[s.Offset:s.Offset+s.Len], f32(t, io, "grad."+s.Name), 1e-3)
	}
	for _, s := range n.BufferSegments() {
		near(t, "buffer_after."+s.Name, n.Buffers()[s.Offset:s.Offset+s.Len], f32(t, io, "buffer_after."+s.Name), 1e-4)
	}
	extra := 0
	for name := range io {
		if strings.HasPrefix(name, "buffer_after.") {
			extra++
		}
	}
	if extra != len(n.BufferSegments()) {
		t.Errorf("fixture has %d buffers, network %d", extra, len(n.BufferSegments()))
	}
}

// near checks |got − want| ≤ tol·max|want| elementwise (plus a floor for
// all-zero tensors).
func near(t *testing.T, name string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", name, len(got), len(want))
	}
	var scale, worst float64
	for _, w := range want {
		scale = max(scale, math.Abs(float64(w)))
	}
	bound := tol*scale + 1e-7
	bad := -1
	for i := range got {
		if d := math.Abs(float64(got[i]) - float64(want[i])); d > worst || math.IsNaN(d) {
			worst = d
			if d > bound || math.IsNaN(d) {
				bad = i
			}
		}
	}
	if bad >= 0 {
		t.Errorf("%s: worst difference %.3g at [%d] (%v vs torch %v) exceeds %.3g·max|torch| = %.3g",
			name, worst, bad, got[bad], want[bad], tol, bound)
	}
}
