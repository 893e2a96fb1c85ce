package models

import (
	"fmt"
	"math"
	"testing"
)

// TestTorchParityBF16 compares bf16 training steps with PyTorch's bf16
// autocast on CPU (fixtures from scripts/torch_bf16_fixtures.py: the
// same weights, batch and labels as TestTorchParity's, one forward +
// cross-entropy + backward under torch.autocast("cpu", bfloat16)).
//
// The two are not the same arithmetic — PyTorch rounds the outputs of
// linear layers and convolutions to bf16, gradsync keeps them in float32
// and runs its first convolution and attention's inner products in
// float32 — so equality is no test. Some of the points are also
// ill-conditioned: a ReLU or max-pool decision flips when a value moves
// by bf16's rounding, and then float32 itself, with its weights and input
// perturbed by a relative 2⁻⁸, moves a gradient by several per cent (the
// fixture's floor.<name>, measured by the script). So the scale is e, the
// largest of PyTorch's bf16 error, that floor and 2⁻⁸: for the logits
// and every gradient, gradsync's bf16 must be within 2e of the float32
// result and within 3e of PyTorch's bf16. Distances are relative L2
// norms, ‖a − b‖ / ‖b‖, per tensor.
func TestTorchParityBF16(t *testing.T) {
	forEachBackend(t, func(t *testing.T) {
		for _, fx := range []string{"mlp", "lenet5", "cnn", "resnet8", "vit-tiny"} {
			t.Run(fx, func(t *testing.T) {
				checkParityBF16(t, fx)
			})
		}
	})
	if bf16Native { // and the rounded-float32 path the CPUs without AVX512-BF16 take
		bf16Native = false
		defer func() { bf16Native = true }()
		t.Run("rounded", func(t *testing.T) {
			for _, fx := range []string{"mlp", "lenet5", "cnn", "resnet8", "vit-tiny"} {
				t.Run(fx, func(t *testing.T) { checkParityBF16(t, fx) })
			}
		})
	}
}

func checkParityBF16(t *testing.T, fixture string) {
	io, meta := readFixture(t, fixture+".io.safetensors")
	bf, _ := readFixture(t, fixture+".bf16.io.safetensors")
	var opt Options
	if _, err := fmt.Sscanf(meta["input"], "%dx%dx%d", &opt.Channels, &opt.Height, &opt.Width); err != nil {
		t.Fatalf("metadata input %q: %v", meta["input"], err)
	}
	n, err := New(fixture, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	state, _ := readFixture(t, fixture+".state.safetensors")
	if err := n.LoadState(state); err != nil {
		t.Fatal(err)
	}
	if err := n.SetPrecision(BF16); err != nil {
		t.Fatal(err)
	}
	x, labels := fixtureBatch(t, io)
	n.ZeroGrad()
	logits := n.Forward(x, len(labels), meta["mode"] == "train")
	d := make([]float32, len(logits))
	SoftmaxCrossEntropy(logits, labels, n.Options().Classes, d)
	n.Backward(d)
	check := func(name string, ours []float32) {
		t.Helper()
		fp32, torch := f32(t, io, name), f32(t, bf, name)
		eTorch := relDist(torch, fp32)
		eOurs := relDist(ours, fp32)
		dist := relDist(ours, torch)
		noise := float64(f32(t, bf, "floor."+name)[0])
		e := max(eTorch, noise, 1.0/256)
		t.Logf("%-34s ours−fp32 %.2e, torch bf16−fp32 %.2e, ours−torch bf16 %.2e, fp32 noise floor %.2e", name, eOurs, eTorch, dist, noise)
		if eOurs > 2*e || dist > 3*e || math.IsNaN(eOurs) {
			t.Errorf("%s: gradsync bf16 is %.2e from fp32 and %.2e from PyTorch's bf16 (PyTorch's own error %.2e, fp32's noise floor %.2e): want ≤ %.2e and ≤ %.2e",
				name, eOurs, dist, eTorch, noise, 2*e, 3*e)
		}
	}
	check("logits", logits)
	for _, s := range n.Segments() {
		check("grad."+s.Name, n.Grads()[s.Offset:s.Offset+s.Len])
	}
}

// relDist is ‖a−b‖₂ / ‖b‖₂ (‖a−b‖₂ when b is zero).
func relDist(a, b []float32) float64 {
	var diff, scale float64
	for i := range b {
		e := float64(a[i]) - float64(b[i])
		diff += e * e
		scale += float64(b[i]) * float64(b[i])
	}
	if scale == 0 {
		return math.Sqrt(diff)
	}
	return math.Sqrt(diff / scale)
}
