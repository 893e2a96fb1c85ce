package models

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestTorchParity loads the fixtures scripts/torch_fixtures.py writes
// (PyTorch's weights, input batch, logits, loss and gradients for each
// architecture) and checks the Go networks reproduce them: logits and
// running statistics within 1e-4 and gradients within 1e-3, relative to
// the largest magnitude in each tensor, on every GEMM backend.
// Regenerate with: /usr/bin/python3 scripts/torch_fixtures.py
//
// resnet8-rgb is resnet8 on 3×32×32 with 100 classes. The compact
// fixtures (resnet18, mobilenet, mobilenet-0.5: metadata "state") carry
// no weights: both sides compute them with the same formula
// (formulaValues), and they hold a sample of each gradient with its
// whole tensor's max |grad|.
func TestTorchParity(t *testing.T) {
	// Per backend (a global setting), the fixtures in parallel.
	forEachBackend(t, func(t *testing.T) {
		for _, fx := range []string{"mlp", "lenet5", "cnn", "fedcnn", "resnet8", "vit-tiny",
			"resnet8-rgb", "se-resnet8", "convvit", "resnet18", "mobilenet", "mobilenet-0.5"} {
			t.Run(fx, func(t *testing.T) {
				t.Parallel()
				checkParity(t, fx)
			})
		}
	})
}

// fmix32 is murmur3's 32-bit finaliser.
func fmix32(h uint32) uint32 {
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	return h ^ h>>16
}

// formulaValues are the values of state entry t (0-based, in PyTorch's
// state_dict order) named name, as scripts/torch_fixtures.py's
// formula_values computes them: u = fmix32(i + 0x9E3779B9·(t+1) mod 2³²)/2³²
// for element i, mapped by the entry's kind in float64 (each operation
// rounded: the conversions keep the compiler from fusing them), then
// rounded to float32.
func formulaValues(name string, shape []int, t int) []float32 {
	n := 1
	for _, d := range shape {
		n *= d
	}
	fanIn := 1
	if len(shape) > 1 {
		for _, d := range shape[1:] {
			fanIn *= d
		}
	}
	bound := 1 / math.Sqrt(float64(fanIn))
	off := uint32(0x9E3779B9 * uint64(t+1))
	out := make([]float32, n)
	for i := range out {
		u := float64(fmix32(uint32(i)+off)) / (1 << 32)
		s := float64(2*u) - 1 // exact
		var v float64
		switch {
		case strings.HasSuffix(name, "running_mean"):
			v = 0.5 * s
		case strings.HasSuffix(name, "running_var"):
			v = 0.5 + float64(1.5*u)
		case len(shape) == 1 && strings.HasSuffix(name, ".weight"):
			v = 0.5 + u
		case strings.HasSuffix(name, ".bias"):
			v = 0.2 * s
		default:
			v = bound * s
		}
		out[i] = float32(v)
	}
	return out
}

// loadFormulaState sets n's parameters and buffers from formulaValues,
// after checking that the fixture's state entries (name and shape, in
// PyTorch's order) are exactly n's.
func loadFormulaState(t *testing.T, n *Network, state string) {
	t.Helper()
	var entries []struct {
		Name  string
		Shape []int
	}
	var raw [][]json.RawMessage
	if err := json.Unmarshal([]byte(state), &raw); err != nil {
		t.Fatalf("metadata state: %v", err)
	}
	for _, e := range raw {
		var name string
		var shape []int
		if len(e) != 2 || json.Unmarshal(e[0], &name) != nil || json.Unmarshal(e[1], &shape) != nil {
			t.Fatalf("metadata state entry %s: want [name, shape]", e)
		}
		entries = append(entries, struct {
			Name  string
			Shape []int
		}{name, shape})
	}
	views := map[string][]float32{}
	shapes := map[string][]int{}
	for _, s := range n.Segments() {
		views[s.Name], shapes[s.Name] = n.Params()[s.Offset:s.Offset+s.Len], s.Shape
	}
	for _, s := range n.BufferSegments() {
		views[s.Name], shapes[s.Name] = n.Buffers()[s.Offset:s.Offset+s.Len], s.Shape
	}
	if len(entries) != len(views) {
		t.Fatalf("PyTorch's state has %d entries, the network %d", len(entries), len(views))
	}
	for i, e := range entries {
		v, ok := views[e.Name]
		if !ok || !slices.Equal(shapes[e.Name], e.Shape) {
			t.Fatalf("PyTorch's %s %v: the network has %v", e.Name, e.Shape, shapes[e.Name])
		}
		copy(v, formulaValues(e.Name, e.Shape, i))
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

// fixtureBatch is a fixture's input batch x and its labels.
func fixtureBatch(t *testing.T, io map[string]Tensor) ([]float32, []uint8) {
	t.Helper()
	lab, err := io["labels"].Int64s()
	if err != nil {
		t.Fatal(err)
	}
	labels := make([]uint8, len(lab))
	for i, l := range lab {
		labels[i] = uint8(l)
	}
	return f32(t, io, "x"), labels
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

func checkParity(t *testing.T, fixture string) {
	io, meta := readFixture(t, fixture+".io.safetensors")
	var opt Options
	if _, err := fmt.Sscanf(meta["input"], "%dx%dx%d", &opt.Channels, &opt.Height, &opt.Width); err != nil {
		t.Fatalf("metadata input %q: %v", meta["input"], err)
	}
	if c, ok := meta["classes"]; ok {
		if _, err := fmt.Sscan(c, &opt.Classes); err != nil {
			t.Fatalf("metadata classes %q: %v", c, err)
		}
	}
	arch := fixture
	if a, ok := meta["arch"]; ok {
		arch = a
	}
	n, err := New(arch, opt)
	if err != nil {
		t.Fatal(err)
	}
	compact := meta["state"] != ""
	if compact {
		loadFormulaState(t, n, meta["state"])
	} else {
		state, _ := readFixture(t, fixture+".state.safetensors")
		if err := n.LoadState(state); err != nil {
			t.Fatal(err)
		}
	}
	x, labels := fixtureBatch(t, io)
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
		g := n.Grads()[s.Offset : s.Offset+s.Len]
		if compact {
			nearSampled(t, "grad."+s.Name, g, io, 1e-3)
			continue
		}
		near(t, "grad."+s.Name, g, f32(t, io, "grad."+s.Name), 1e-3)
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

// nearSampled is near for a compact fixture's gradient name: the
// elements grad_idx.name of got against grad.name, relative to the whole
// tensor's max |grad| (grad_absmax.name).
func nearSampled(t *testing.T, name string, got []float32, io map[string]Tensor, tol float64) {
	t.Helper()
	base := strings.TrimPrefix(name, "grad.")
	idx, err := io["grad_idx."+base].Int64s()
	if err != nil {
		t.Fatalf("grad_idx.%s: %v", base, err)
	}
	want := f32(t, io, name)
	scale := f32(t, io, "grad_absmax."+base)
	if len(idx) != len(want) || len(scale) != 1 || len(idx) == 0 {
		t.Fatalf("%s: %d indices, %d values, %d scales", name, len(idx), len(want), len(scale))
	}
	bound := tol*float64(scale[0]) + 1e-7
	for j, i := range idx {
		if i < 0 || int(i) >= len(got) {
			t.Fatalf("%s: index %d out of %d", name, i, len(got))
		}
		if d := math.Abs(float64(got[i]) - float64(want[j])); !(d <= bound) {
			t.Errorf("%s[%d] = %v, torch %v: difference %.3g exceeds %.3g·max|torch| = %.3g", name, i, got[i], want[j], d, tol, bound)
			return
		}
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
