package models

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/gradsync/gradsync/internal/kernels"
	"github.com/gradsync/gradsync/models/modeltest"
)

func TestNames(t *testing.T) {
	names := Names()
	if !slices.IsSorted(names) || !slices.Contains(names, "logreg") || !slices.Contains(names, "mlp") {
		t.Fatalf("Names() = %v", names)
	}
	_, err := New("resnet-huge", Options{})
	if err == nil || !strings.Contains(err.Error(), "logreg, mlp") {
		t.Fatalf("New(unknown) error = %v, want one listing the known names", err)
	}
}

func TestSegments(t *testing.T) {
	cases := []struct {
		name  string
		opt   Options
		segs  []Segment
		total int
	}{
		{"logreg", Options{}, []Segment{
			{"fc.weight", []int{10, 784}, 0, 7840},
			{"fc.bias", []int{10}, 7840, 10},
		}, 7850},
		{"mlp", Options{}, []Segment{
			{"fc1.weight", []int{256, 784}, 0, 200704},
			{"fc1.bias", []int{256}, 200704, 256},
			{"fc2.weight", []int{128, 256}, 200960, 32768},
			{"fc2.bias", []int{128}, 233728, 128},
			{"fc3.weight", []int{10, 128}, 233856, 1280},
			{"fc3.bias", []int{10}, 235136, 10},
		}, 235146},
		{"lenet5", Options{}, []Segment{
			{"0.weight", []int{6, 1, 5, 5}, 0, 150},
			{"0.bias", []int{6}, 150, 6},
			{"3.weight", []int{16, 6, 5, 5}, 156, 2400},
			{"3.bias", []int{16}, 2556, 16},
			{"7.weight", []int{120, 400}, 2572, 48000},
			{"7.bias", []int{120}, 50572, 120},
			{"9.weight", []int{84, 120}, 50692, 10080},
			{"9.bias", []int{84}, 60772, 84},
			{"11.weight", []int{10, 84}, 60856, 840},
			{"11.bias", []int{10}, 61696, 10},
		}, 61706},
		{"cnn", Options{}, []Segment{
			{"0.weight", []int{32, 1, 3, 3}, 0, 288},
			{"0.bias", []int{32}, 288, 32},
			{"2.weight", []int{64, 32, 3, 3}, 320, 18432},
			{"2.bias", []int{64}, 18752, 64},
			{"7.weight", []int{128, 9216}, 18816, 1179648},
			{"7.bias", []int{128}, 1198464, 128},
			{"10.weight", []int{10, 128}, 1198592, 1280},
			{"10.bias", []int{10}, 1199872, 10},
		}, 1199882},
		{"logreg", Options{Channels: 3, Height: 4, Width: 5, Classes: 2}, []Segment{
			{"fc.weight", []int{2, 60}, 0, 120},
			{"fc.bias", []int{2}, 120, 2},
		}, 122},
	}
	for _, c := range cases {
		n, err := New(c.name, c.opt)
		if err != nil {
			t.Fatal(err)
		}
		if n.NumParams() != c.total || len(n.Params()) != c.total || len(n.Grads()) != c.total {
			t.Errorf("%s: NumParams=%d len(Params)=%d len(Grads)=%d, want %d", c.name, n.NumParams(), len(n.Params()), len(n.Grads()), c.total)
		}
		got := n.Segments()
		if len(got) != len(c.segs) {
			t.Fatalf("%s: Segments() = %v, want %v", c.name, got, c.segs)
		}
		for i := range got {
			g, w := got[i], c.segs[i]
			if g.Name != w.Name || !slices.Equal(g.Shape, w.Shape) || g.Offset != w.Offset || g.Len != w.Len {
				t.Errorf("%s: segment %d = %+v, want %+v", c.name, i, g, w)
			}
		}
	}
}

// TestBuffers checks batch norm's running statistics are named buffers
// outside the gradient buffer, initialised as PyTorch and updated only by
// training-mode Forwards.
func TestBuffers(t *testing.T) {
	n, _ := New("resnet8", Options{Seed: 1})
	segs := n.BufferSegments()
	if len(segs) != 2*9 || segs[0].Name != "bn1.running_mean" || segs[1].Name != "bn1.running_var" ||
		segs[len(segs)-1].Name != "layer3.0.downsample.1.running_var" {
		t.Fatalf("BufferSegments() = %v", segs)
	}
	total := 0
	for _, s := range segs {
		if s.Offset != total {
			t.Fatalf("%s at offset %d, want %d", s.Name, s.Offset, total)
		}
		total += s.Len
		want := float32(0)
		if strings.HasSuffix(s.Name, "running_var") {
			want = 1
		}
		for _, v := range n.Buffers()[s.Offset : s.Offset+s.Len] {
			if v != want {
				t.Fatalf("%s initialised to %v, want %v", s.Name, v, want)
			}
		}
	}
	if total != len(n.Buffers()) {
		t.Fatalf("buffer segments cover %d of %d values", total, len(n.Buffers()))
	}
	for _, s := range n.Segments() {
		if strings.Contains(s.Name, "running") {
			t.Fatalf("buffer %s among the parameters", s.Name)
		}
	}
	x := randn(rand.New(rand.NewPCG(1, 2)), 4*784)
	before := slices.Clone(n.Buffers())
	n.Forward(x, 4, false)
	if !slices.Equal(before, n.Buffers()) {
		t.Fatal("evaluation Forward changed the buffers")
	}
	n.Forward(x, 4, true)
	if slices.Equal(before, n.Buffers()) {
		t.Fatal("training Forward left the running statistics alone")
	}
	if m, _ := New("mlp", Options{}); len(m.Buffers()) != 0 || len(m.BufferSegments()) != 0 {
		t.Fatal("mlp has buffers")
	}
}

func TestInitDeterministic(t *testing.T) {
	a, _ := New("mlp", Options{Seed: 7})
	b, _ := New("mlp", Options{Seed: 7})
	c, _ := New("mlp", Options{Seed: 8})
	if !slices.Equal(a.Params(), b.Params()) {
		t.Fatal("same seed gave different parameters")
	}
	if slices.Equal(a.Params(), c.Params()) {
		t.Fatal("different seeds gave the same parameters")
	}
	// Each segment is U(−1/√fan_in, 1/√fan_in) with fan_in the layer's input width.
	for _, s := range a.Segments() {
		fanIn := map[string]float64{"fc1": 784, "fc2": 256, "fc3": 128}[s.Name[:3]]
		bound := float32(1 / math.Sqrt(fanIn))
		var maxAbs float32
		var sum float64
		for _, v := range a.Params()[s.Offset : s.Offset+s.Len] {
			maxAbs = max(maxAbs, v, -v)
			sum += float64(v)
		}
		if maxAbs > bound || (s.Len > 1000 && maxAbs < 0.99*bound) {
			t.Errorf("%s: max |w| = %v, bound %v", s.Name, maxAbs, bound)
		}
		if mean := sum / float64(s.Len); s.Len > 1000 && math.Abs(mean) > 0.05*float64(bound) {
			t.Errorf("%s: mean %v not near 0", s.Name, mean)
		}
	}
	if slices.ContainsFunc(a.Grads(), func(v float32) bool { return v != 0 }) {
		t.Fatal("new network has non-zero gradients")
	}
}

// TestParamsAreLive checks that writes to Params() are seen by Forward.
func TestParamsAreLive(t *testing.T) {
	n, _ := New("logreg", Options{Channels: 1, Height: 2, Width: 2, Classes: 3})
	p := n.Params()
	clear(p)
	bias := n.Segments()[1]
	copy(p[bias.Offset:], []float32{1, 2, 3})
	p[0] = 10 // fc.weight[0,0]
	y := n.Forward([]float32{0.5, 9, 9, 9}, 1, false)
	if !slices.Equal(y, []float32{6, 2, 3}) {
		t.Fatalf("logits = %v, want [6 2 3]", y)
	}
}

// TestNetworkGradient checks every parameter segment of each architecture
// end to end (network + cross-entropy) against finite differences, in
// training mode (dropout masks held fixed). The ReLUs are swapped for
// GELUs: with batch norm a weight moves every unit of its channel, so a
// step of h almost always crosses several ReLU kinks at once, which no
// finite difference can check; ReLU's own gradient is checked by itself,
// and the real networks are compared with PyTorch in parity_test.go.
func TestNetworkGradient(t *testing.T) {
	be := backends()
	last := be[len(be)-1]
	forEachBackend(t, func(t *testing.T) {
		for _, name := range Names() {
			checks, train := 40, true
			if heavyArchs[name] {
				// Their layers are checked one by one; here, the wiring,
				// with 2 entries per parameter tensor on one backend, in
				// evaluation mode: with 2×2 and 1×1 planes, batch norm's
				// training statistics over 12 and 3 values curve the loss
				// too much for a finite difference (train mode is checked
				// against PyTorch in parity_test.go).
				if kernels.Backend() != last {
					continue
				}
				checks, train = 2, false
			}
			// The architectures are independent: in parallel (the
			// backend stays set until they have all ended). A heavy one
			// is the longest by far: its parameter tensors are split
			// over two subtests, each on its own copy of the network.
			parts := 1
			if heavyArchs[name] {
				parts = 2
			}
			for part := range parts {
				sub := name
				if parts > 1 {
					sub = fmt.Sprintf("%s/part%d", name, part)
				}
				t.Run(sub, func(t *testing.T) {
					t.Parallel()
					networkGradient(t, name, checks, train, part, parts)
				})
			}
		}
	})
}

// networkGradient checks the parameter tensors i of name with
// i mod parts = part.
func networkGradient(t *testing.T, name string, checks int, train bool, part, parts int) {
	opt := smallOptions(name)
	n, err := New(name, opt)
	if err != nil {
		t.Fatal(err)
	}
	smoothen(n.layers)
	const batch = 3
	r := rand.New(rand.NewPCG(5, 5))
	x := randn(r, batch*n.InputSize())
	labels := []uint8{0, 3, 2}
	loss := func() float64 {
		n.rewindDropout()
		return float64(SoftmaxCrossEntropy(n.Forward(x, batch, train), labels, opt.Classes, nil))
	}
	n.ZeroGrad()
	d := make([]float32, batch*opt.Classes)
	n.rewindDropout()
	SoftmaxCrossEntropy(n.Forward(x, batch, train), labels, opt.Classes, d)
	n.Backward(d)
	grads := slices.Clone(n.Grads())
	for i, s := range n.Segments() {
		if i%parts != part {
			continue
		}
		end := s.Offset + s.Len
		modeltest.CheckGrad(t, name+" "+s.Name, loss, n.Params()[s.Offset:end], grads[s.Offset:end],
			modeltest.Config{Eps: 1e-3, ATol: 2e-4, MaxChecks: checks, Seed: uint64(s.Offset)})
	}
}

// smoothen replaces every ReLU in ls (and in residual branches) by a GELU.
// A ReLU fused into the batch norm before it (ReLU.Fused) is that batch
// norm's own max(0, ·): the batch norm is unfused, or the GELU would
// follow a ReLU that is still there.
func smoothen(ls []Layer) {
	for i, l := range ls {
		switch l := l.(type) {
		case *ReLU:
			if l.Fused {
				bn, ok := ls[i-1].(*BatchNorm2d)
				if !ok || !bn.ReLU {
					panic(fmt.Sprintf("layer %d: a fused ReLU after %T", i, ls[i-1]))
				}
				bn.ReLU = false
			}
			ls[i] = &GELU{}
		case *Residual:
			smoothen(l.Body)
			smoothen(l.Shortcut)
		}
	}
}

// smallOptions are the smallest inputs each architecture accepts, so that
// whole-network gradient checks stay fast.
func smallOptions(name string) Options {
	opt := Options{Channels: 1, Height: 6, Width: 5, Classes: 4, Seed: 3}
	switch name {
	case "lenet5":
		opt.Height, opt.Width = 12, 13 // 12→6→2→1 and 13→6→2→1
	case "cnn":
		opt.Height, opt.Width, opt.Channels = 7, 6, 2 // 5×4 → 3×2 → 1×1
	case "fedcnn":
		opt.Height, opt.Width = 5, 6 // 5×6 → 2×3 → 1×1
	case "resnet8":
		opt.Height, opt.Width, opt.Channels = 5, 4, 2 // 5×4 → 3×2 → 2×1
	case "vit-tiny":
		opt.Height, opt.Width = 14, 15 // 2×2 patches, a column left over
	case "se-resnet8":
		opt.Height, opt.Width, opt.Channels = 5, 4, 2 // as resnet8
	case "convvit":
		opt.Height, opt.Width, opt.Channels = 8, 7, 2 // 4×4 → 2×2: 4 tokens
	}
	return opt
}

// heavyArchs have millions of parameters: the tests that run every
// architecture give them 8×8 inputs instead of 28×28, and the
// whole-network gradient check samples fewer entries of them.
var heavyArchs = map[string]bool{"resnet18": true, "mobilenet": true, "mobilenet-0.5": true}

// testOptions is opt, with 8×8 inputs for the heavy architectures.
func testOptions(name string, opt Options) Options {
	if heavyArchs[name] {
		opt.Height, opt.Width = 8, 8
	}
	return opt
}

// TestBackwardAccumulates checks Backward adds into Grads and ZeroGrad
// clears them.
func TestBackwardAccumulates(t *testing.T) {
	n, _ := New("mlp", Options{})
	r := rand.New(rand.NewPCG(6, 6))
	x := randn(r, 2*784)
	d := randn(r, 2*10)
	n.Forward(x, 2, true)
	n.Backward(d)
	once := slices.Clone(n.Grads())
	n.Forward(x, 2, true)
	n.Backward(d)
	for i, g := range n.Grads() {
		if math.Abs(float64(g-2*once[i])) > 1e-5*(1+math.Abs(float64(g))) {
			t.Fatalf("grad[%d] = %v after two passes, want 2×%v", i, g, once[i])
		}
	}
	n.ZeroGrad()
	if slices.ContainsFunc(n.Grads(), func(v float32) bool { return v != 0 }) {
		t.Fatal("ZeroGrad left non-zero gradients")
	}
}

func TestNetworkPanicsOnShape(t *testing.T) {
	n, _ := New("mlp", Options{})
	t.Run("forward", func(t *testing.T) { expectPanic(t, func() { n.Forward(make([]float32, 783), 1, true) }) })
	t.Run("backward before forward", func(t *testing.T) { expectPanic(t, func() { n.Backward(make([]float32, 10)) }) })
	n.Forward(make([]float32, 2*784), 2, true)
	t.Run("backward", func(t *testing.T) { expectPanic(t, func() { n.Backward(make([]float32, 10)) }) })
}

// TestStepDoesNotAllocate checks that, once warmed up for a batch size,
// Forward + loss + Backward allocate nothing (with the OpenBLAS backend;
// gonum's parallel GEMM allocates a little per call for its goroutines,
// and convolutions make two or three calls per sample — Winograd ones 48
// per block of samples — so that is bounded per sample instead).
func TestStepDoesNotAllocate(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("allocation accounting (not under -short or -race)")
	}
	forEachBackend(t, func(t *testing.T) {
		for _, name := range Names() {
			n, _ := New(name, testOptions(name, Options{}))
			const batch = 16
			r := rand.New(rand.NewPCG(7, 7))
			x := randn(r, batch*n.InputSize())
			labels := make([]uint8, batch)
			d := make([]float32, batch*10)
			step := func() {
				n.ZeroGrad()
				SoftmaxCrossEntropy(n.Forward(x, batch, true), labels, 10, d)
				n.Backward(d)
			}
			step()
			n.Forward(x[:batch/2*n.InputSize()], batch/2, true) // a smaller batch reuses the buffers
			if kernels.Backend() == "openblas" {
				if a := testing.AllocsPerRun(20, step); a != 0 {
					t.Errorf("%s: %v allocations per step, want 0", name, a)
				}
				continue
			}
			if heavyArchs[name] {
				// gonum allocates per GEMM call, and these make dozens of
				// calls per sample: the openblas case above is their check
				continue
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for range 20 {
				step()
			}
			runtime.ReadMemStats(&after)
			if per := (after.TotalAlloc - before.TotalAlloc) / 20; per > 128<<10*(1+batch) {
				t.Errorf("%s: %d bytes allocated per step with gonum, want < 128 KiB per sample", name, per)
			}
		}
	})
}

// BenchmarkStep measures one training step's Forward + loss + Backward at
// batch 64 on each backend (samples/s reported).
func BenchmarkStep(b *testing.B) {
	for _, be := range backends() {
		for _, name := range Names() {
			b.Run(be+"/"+name+"/batch64", func(b *testing.B) {
				prev := kernels.Backend()
				if err := kernels.SetBackend(be); err != nil {
					b.Fatal(err)
				}
				defer kernels.SetBackend(prev)
				n, _ := New(name, Options{})
				const batch = 64
				r := rand.New(rand.NewPCG(8, 8))
				x := randn(r, batch*784)
				labels := make([]uint8, batch)
				for i := range labels {
					labels[i] = uint8(i % 10)
				}
				d := make([]float32, batch*10)
				b.ReportAllocs()
				for b.Loop() {
					n.ZeroGrad()
					SoftmaxCrossEntropy(n.Forward(x, batch, true), labels, 10, d)
					n.Backward(d)
				}
				b.ReportMetric(float64(batch)*float64(b.N)/b.Elapsed().Seconds(), "samples/s")
			})
		}
	}
}

// TestTrainFlag checks that train toggles dropout: evaluation is
// deterministic, training draws a fresh mask per step from the seed, and
// two networks with the same seed draw the same masks.
func TestTrainFlag(t *testing.T) {
	opt := smallOptions("cnn")
	a, _ := New("cnn", opt)
	b, _ := New("cnn", opt)
	x := randn(rand.New(rand.NewPCG(1, 3)), 3*a.InputSize())
	e1 := slices.Clone(a.Forward(x, 3, false))
	e2 := slices.Clone(a.Forward(x, 3, false))
	t1 := slices.Clone(a.Forward(x, 3, true))
	t2 := slices.Clone(a.Forward(x, 3, true))
	if !slices.Equal(e1, e2) {
		t.Fatal("evaluation Forward is not deterministic")
	}
	if slices.Equal(t1, e1) || slices.Equal(t1, t2) {
		t.Fatal("training Forward did not apply fresh dropout masks")
	}
	if u1 := b.Forward(x, 3, true); !slices.Equal(u1, t1) {
		t.Fatal("same seed, first training step: different dropout masks")
	}
}

// TestSetDropoutStream: after SetDropoutStream(s) the masks depend only on
// s, whatever ran on the network before.
func TestSetDropoutStream(t *testing.T) {
	a, _ := New("cnn", smallOptions("cnn"))
	b, _ := New("cnn", smallOptions("cnn"))
	r := rand.New(rand.NewPCG(8, 8))
	x := randn(r, 3*a.InputSize())
	b.Forward(x, 3, true) // b's dropouts have advanced
	a.SetDropoutStream(7)
	b.SetDropoutStream(7)
	ya := slices.Clone(a.Forward(x, 3, true))
	yb := b.Forward(x, 3, true)
	if !slices.Equal(ya, yb) {
		t.Fatal("same stream, different outputs")
	}
	a.SetDropoutStream(8)
	if slices.Equal(ya, a.Forward(x, 3, true)) {
		t.Fatal("streams 7 and 8 drew the same masks")
	}
}

// TestSetDropoutCalls: a network told it has done k training Forwards
// draws the masks of one that did them.
func TestSetDropoutCalls(t *testing.T) {
	a, _ := New("cnn", smallOptions("cnn"))
	b, _ := New("cnn", smallOptions("cnn"))
	r := rand.New(rand.NewPCG(9, 9))
	x := randn(r, 2*a.InputSize())
	for range 3 {
		a.Forward(x, 2, true)
	}
	a.Forward(x, 2, false) // evaluation draws nothing
	b.SetDropoutCalls(3)
	if !slices.Equal(a.Forward(x, 2, true), b.Forward(x, 2, true)) {
		t.Fatal("after SetDropoutCalls(3), the fourth training Forward differs")
	}
}
