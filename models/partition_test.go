package models

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// The blocks of every architecture: whole residual and transformer
// blocks, layers without parameters with the block before them, and
// together every layer, parameter and buffer exactly once, in order.
func TestBlocks(t *testing.T) {
	want := map[string][]string{
		"logreg":        {"fc"},
		"mlp":           {"fc1", "fc2", "fc3"},
		"lenet5":        {"0", "3", "7", "9", "11"},
		"cnn":           {"0", "2", "7", "10"},
		"fedcnn":        {"0", "3", "7", "9"},
		"resnet8":       {"conv1", "bn1", "layer1.0", "layer2.0", "layer3.0", "fc"},
		"vit-tiny":      {"patch_embed", "blocks.0", "blocks.1", "norm", "head"},
		"resnet18":      {"conv1", "bn1", "layer1.0", "layer1.1", "layer2.0", "layer2.1", "layer3.0", "layer3.1", "layer4.0", "layer4.1", "fc"},
		"se-resnet8":    {"conv1", "bn1", "layer1.0", "layer2.0", "layer3.0", "fc"},
		"mobilenet":     append(append([]string{"conv1", "bn1"}, mobileNetBlockNames()...), "linear"),
		"mobilenet-0.5": append(append([]string{"conv1", "bn1"}, mobileNetBlockNames()...), "linear"),
		"convvit":       {"stem.0", "stem.1", "stem.3", "stem.4", "pos_embed", "blocks.0", "blocks.1", "norm", "head"},
	}
	for _, arch := range Names() {
		n, err := New(arch, Options{})
		if err != nil {
			t.Fatal(err)
		}
		blocks := n.Blocks()
		var names []string
		layer, param, buf := 0, 0, 0
		for _, b := range blocks {
			names = append(names, b.Name)
			if b.First != layer || b.End <= b.First || b.ParamOffset != param || b.ParamLen < 1 || b.BufferOffset != buf {
				t.Errorf("%s: block %+v does not follow layer %d, parameter %d, buffer %d", arch, b, layer, param, buf)
			}
			layer, param, buf = b.End, b.ParamOffset+b.ParamLen, b.BufferOffset+b.BufferLen
			for _, s := range n.Segments() {
				inside := s.Offset >= b.ParamOffset && s.Offset < b.ParamOffset+b.ParamLen
				if inside != (blockName(s.Name) == b.Name) && !(arch == "vit-tiny" && b.Name == "patch_embed" && inside && (s.Name == "cls_token" || s.Name == "pos_embed")) {
					t.Errorf("%s: parameter %s (offset %d) and block %+v", arch, s.Name, s.Offset, b)
				}
			}
		}
		if layer != len(n.layers) || param != n.NumParams() || buf != len(n.Buffers()) {
			t.Errorf("%s: blocks cover %d layers, %d parameters, %d buffer values; want %d, %d, %d",
				arch, layer, param, buf, len(n.layers), n.NumParams(), len(n.Buffers()))
		}
		if w, ok := want[arch]; !ok {
			t.Errorf("%s: no expected blocks written down (got %q)", arch, names)
		} else if !slices.Equal(names, w) {
			t.Errorf("%s: blocks %q, want %q", arch, names, w)
		}
	}
}

// mobileNetBlockNames are layers.0 … layers.12.
func mobileNetBlockNames() []string {
	var names []string
	for i := range mobileNetBlocks {
		names = append(names, fmt.Sprintf("layers.%d", i))
	}
	return names
}

// cuts returns every way to cut nb blocks into s non-empty runs, as the
// first block of each run.
func cuts(nb, s int) [][]int {
	if s == 1 {
		return [][]int{{0}}
	}
	var out [][]int
	for _, c := range cuts(nb, s-1) {
		for k := c[len(c)-1] + 1; k < nb; k++ {
			out = append(out, append(slices.Clone(c), k))
		}
	}
	return out
}

// largest is the largest run's cost under the cut starts, summed left to
// right as balance does.
func largest(cost []float64, starts []int) float64 {
	var m float64
	for i, f := range starts {
		end := len(cost)
		if i+1 < len(starts) {
			end = starts[i+1]
		}
		var t float64
		for _, c := range cost[f:end] {
			t += c
		}
		m = max(m, t)
	}
	return m
}

func starts(st []Stage) []int {
	var out []int
	at := 0
	for _, s := range st {
		out = append(out, at)
		at += len(s.Blocks)
	}
	return out
}

// Balancing by parameters finds the least largest stage, checked against
// every possible cut, for every architecture and stage count.
func TestPartitionByParamsIsOptimal(t *testing.T) {
	for _, arch := range Names() {
		n, _ := New(arch, Options{})
		blocks := n.Blocks()
		cost := make([]float64, len(blocks))
		for i, b := range blocks {
			cost[i] = float64(b.ParamLen)
		}
		for s := 1; s <= len(blocks); s++ {
			st, err := Partition(n, s, Balance{})
			if err != nil {
				t.Fatalf("%s S=%d: %v", arch, s, err)
			}
			checkStages(t, n, st, s)
			best := math.Inf(1)
			for _, c := range cuts(len(blocks), s) {
				best = min(best, largest(cost, c))
			}
			if got := largest(cost, starts(st)); got != best {
				t.Errorf("%s S=%d: largest stage %v parameters (cut %v), best is %v", arch, s, got, starts(st), best)
			}
		}
	}
}

// checkStages checks that st is s stages that tile n's blocks, layers and
// buffers.
func checkStages(t *testing.T, n *Network, st []Stage, s int) {
	t.Helper()
	if len(st) != s {
		t.Fatalf("%d stages, want %d", len(st), s)
	}
	layer, param, buf := 0, 0, 0
	for i, x := range st {
		if len(x.Blocks) == 0 || x.First != layer || x.ParamOffset != param || x.BufferOffset != buf ||
			x.First != x.Blocks[0].First || x.End != x.Blocks[len(x.Blocks)-1].End {
			t.Fatalf("stage %d %+v does not follow layer %d, parameter %d, buffer %d", i, x, layer, param, buf)
		}
		layer, param, buf = x.End, x.ParamOffset+x.ParamLen, x.BufferOffset+x.BufferLen
	}
	if layer != len(n.layers) || param != n.NumParams() || buf != len(n.Buffers()) {
		t.Fatalf("stages end at layer %d, parameter %d, buffer %d", layer, param, buf)
	}
}

// Balancing by time is optimal too (random times, against every cut),
// and among equal optima takes the cut with the largest earlier stages.
func TestPartitionByTime(t *testing.T) {
	n, _ := New("resnet8", Options{})
	nb := len(n.Blocks())
	r := rand.New(rand.NewPCG(3, 4))
	for trial := range 200 {
		times := make([]float64, nb)
		for i := range times {
			times[i] = float64(r.IntN(10)) * r.Float64()
		}
		s := 1 + trial%nb
		st, err := Partition(n, s, Balance{By: ByTime, Times: times})
		if err != nil {
			t.Fatal(err)
		}
		checkStages(t, n, st, s)
		best := math.Inf(1)
		for _, c := range cuts(nb, s) {
			best = min(best, largest(times, c))
		}
		if got := largest(times, starts(st)); got != best {
			t.Fatalf("times %v S=%d: largest stage %v (cut %v), best is %v", times, s, got, starts(st), best)
		}
	}
	for _, c := range []struct {
		times []float64
		s     int
		want  []int
	}{
		{[]float64{1, 1, 1, 1, 1, 1}, 2, []int{0, 3}},
		{[]float64{1, 1, 1, 1, 1, 1}, 4, []int{0, 2, 4, 5}},
		{[]float64{0, 0, 0, 0, 0, 5}, 3, []int{0, 4, 5}},
		{[]float64{6, 1, 1, 1, 1, 1}, 2, []int{0, 1}},
		{[]float64{1, 1, 1, 1, 1, 6}, 6, []int{0, 1, 2, 3, 4, 5}},
	} {
		st, err := Partition(n, c.s, Balance{By: ByTime, Times: c.times})
		if err != nil {
			t.Fatal(err)
		}
		if got := starts(st); !slices.Equal(got, c.want) {
			t.Errorf("times %v S=%d: cut %v, want %v", c.times, c.s, got, c.want)
		}
	}
}

func TestPartitionBoundaries(t *testing.T) {
	r8, _ := New("resnet8", Options{})
	vit, _ := New("vit-tiny", Options{})
	lenet, _ := New("lenet5", Options{})
	for _, c := range []struct {
		n     *Network
		s     int
		b     []string
		names [][]string
	}{
		{r8, 2, []string{"layer3.0"}, [][]string{{"conv1", "bn1", "layer1.0", "layer2.0"}, {"layer3.0", "fc"}}},
		{r8, 3, []string{"layer2", "5"}, [][]string{{"conv1", "bn1", "layer1.0"}, {"layer2.0", "layer3.0"}, {"fc"}}},
		{r8, 1, nil, [][]string{{"conv1", "bn1", "layer1.0", "layer2.0", "layer3.0", "fc"}}},
		{vit, 2, []string{"blocks.1"}, [][]string{{"patch_embed", "blocks.0"}, {"blocks.1", "norm", "head"}}},
		{vit, 3, []string{"blocks", "norm"}, [][]string{{"patch_embed"}, {"blocks.0", "blocks.1"}, {"norm", "head"}}},
		{lenet, 3, []string{"3", "9"}, [][]string{{"0"}, {"3", "7"}, {"9", "11"}}},
	} {
		st, err := Partition(c.n, c.s, Balance{Boundaries: c.b})
		if err != nil {
			t.Fatalf("%s %v: %v", c.n.Name(), c.b, err)
		}
		checkStages(t, c.n, st, c.s)
		var names [][]string
		for _, x := range st {
			var ns []string
			for _, b := range x.Blocks {
				ns = append(ns, b.Name)
			}
			names = append(names, ns)
		}
		if !slices.EqualFunc(names, c.names, slices.Equal) {
			t.Errorf("%s %v: stages %q, want %q", c.n.Name(), c.b, names, c.names)
		}
	}
}

// Refusals name the spec field, say what is wrong and what is allowed.
func TestPartitionRefuses(t *testing.T) {
	r8, _ := New("resnet8", Options{})
	vit, _ := New("vit-tiny", Options{})
	lenet, _ := New("lenet5", Options{})
	allowed := "allowed: bn1, layer1.0, layer2.0, layer3.0, fc or an index in [1, 6)"
	for _, c := range []struct {
		n     *Network
		s     int
		bal   Balance
		field string
		msg   string
	}{
		{r8, 0, Balance{}, "parallelism.pipeline.stages", "must be at least 1, got 0"},
		{r8, 7, Balance{}, "parallelism.pipeline.stages", "7 stages but resnet8 has 6 blocks (conv1, bn1, layer1.0, layer2.0, layer3.0, fc)"},
		{r8, 3, Balance{Boundaries: []string{"layer2.0", "layer3.0.conv2"}}, "parallelism.pipeline.boundaries[1]",
			`"layer3.0.conv2" is inside block layer3.0; ` + allowed},
		{r8, 2, Balance{Boundaries: []string{"layer3.0.downsample"}}, "parallelism.pipeline.boundaries[0]", `"layer3.0.downsample" is inside block layer3.0`},
		{vit, 2, Balance{Boundaries: []string{"blocks.0.attn"}}, "parallelism.pipeline.boundaries[0]",
			`"blocks.0.attn" is inside block blocks.0; allowed: blocks.0, blocks.1, norm, head or an index in [1, 5)`},
		{r8, 2, Balance{Boundaries: []string{"layer9"}}, "parallelism.pipeline.boundaries[0]", `"layer9" is not a block boundary of resnet8; ` + allowed},
		{r8, 2, Balance{Boundaries: []string{"layer3.0.conv9"}}, "parallelism.pipeline.boundaries[0]", `"layer3.0.conv9" is not a block boundary of resnet8`},
		{lenet, 2, Balance{Boundaries: []string{"1"}}, "parallelism.pipeline.boundaries[0]", `"1" is not a block boundary of lenet5; allowed: 3, 7, 9, 11`},
		{lenet, 2, Balance{Boundaries: []string{"0"}}, "parallelism.pipeline.boundaries[0]", `"0" is the first block, where stage 0 starts; allowed: 3, 7, 9, 11`},
		{r8, 2, Balance{Boundaries: []string{"6"}}, "parallelism.pipeline.boundaries[0]", "block index 6 is out of range; " + allowed},
		{r8, 2, Balance{Boundaries: []string{"-1"}}, "parallelism.pipeline.boundaries[0]", "block index -1 is out of range"},
		{r8, 2, Balance{Boundaries: []string{"conv1"}}, "parallelism.pipeline.boundaries[0]", `"conv1" is the first block, where stage 0 starts`},
		{r8, 3, Balance{Boundaries: []string{"layer3.0", "layer2.0"}}, "parallelism.pipeline.boundaries[1]",
			`"layer2.0" (block 3, layer2.0) does not come after the previous boundary (block 4, layer3.0)`},
		{r8, 3, Balance{Boundaries: []string{"layer2.0"}}, "parallelism.pipeline.boundaries", "1 boundaries for 3 stages, want 2"},
		{r8, 2, Balance{By: ByTime, Boundaries: []string{"fc"}}, "parallelism.pipeline.boundaries", "boundaries and balance are exclusive"},
		{r8, 2, Balance{By: ByTime, Times: []float64{1, 2}}, "parallelism.pipeline.balance", "2 times for the 6 blocks of resnet8"},
		{r8, 2, Balance{By: ByTime, Times: []float64{1, 2, 3, math.NaN(), 1, 1}}, "parallelism.pipeline.balance", "time of block layer2.0 is NaN"},
		{r8, 2, Balance{By: ByTime, Times: []float64{1, 2, 3, -1, 1, 1}}, "parallelism.pipeline.balance", "time of block layer2.0 is -1"},
		{r8, 2, Balance{By: 7}, "parallelism.pipeline.balance", "unknown balance 7"},
	} {
		_, err := Partition(c.n, c.s, c.bal)
		var pe *PartitionError
		if !errors.As(err, &pe) || pe.Field != c.field || !strings.Contains(pe.Msg, c.msg) {
			t.Errorf("Partition(%s, %d, %+v) = %v, want %s: …%s…", c.n.Name(), c.s, c.bal, err, c.field, c.msg)
		}
	}
}

// Running the stages one after another — forward in order, backward in
// reverse, activations and gradients copied between stages as a wire
// would — gives the whole network's logits, gradients and batch-norm
// statistics bit for bit, for every architecture and every cut (dropout
// and batch norm in training mode).
func TestStagesBitExact(t *testing.T) {
	t.Parallel() // as its architectures: each builds its own networks
	const batch = 3
	for _, arch := range Names() {
		t.Run(arch, func(t *testing.T) {
			t.Parallel()
			whole, _ := New(arch, testOptions(arch, Options{Seed: 5}))
			split, _ := New(arch, testOptions(arch, Options{Seed: 5}))
			nb := len(whole.Blocks())
			r := rand.New(rand.NewPCG(1, 1))
			x := make([]float32, batch*whole.InputSize())
			for i := range x {
				x[i] = float32(r.NormFloat64())
			}
			dlogits := make([]float32, batch*whole.Options().Classes)
			for i := range dlogits {
				dlogits[i] = float32(r.NormFloat64())
			}
			for s := 1; s <= nb; s++ {
				cs := someCuts(nb, s)
				if heavyArchs[arch] {
					// millions of parameters: 1, 2, nb/2 and nb stages,
					// two cuts each at the most
					if s != 1 && s != 2 && s != nb/2 && s != nb {
						continue
					}
					cs = cs[:min(2, len(cs))]
				}
				for _, c := range cs {
					var bounds []string
					for _, k := range c[1:] {
						bounds = append(bounds, whole.Blocks()[k].Name)
					}
					st, err := Partition(split, s, Balance{Boundaries: bounds})
					if err != nil {
						t.Fatal(err)
					}
					whole.ZeroGrad()
					split.ZeroGrad()
					want := whole.Forward(x, batch, true)
					whole.Backward(dlogits)

					act := slices.Clone(x)
					for _, stage := range st {
						act = slices.Clone(split.ForwardStage(stage, act, batch, true))
					}
					grad := slices.Clone(dlogits)
					for i := len(st) - 1; i >= 0; i-- {
						grad = slices.Clone(split.BackwardStage(st[i], grad))
					}
					if grad != nil {
						t.Fatalf("cut %v: the first stage returned an input gradient", bounds)
					}
					same := func(what string, a, b []float32) {
						t.Helper()
						if len(a) != len(b) {
							t.Fatalf("cut %v: %s: %d values, want %d", bounds, what, len(a), len(b))
						}
						for i := range a {
							if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
								t.Fatalf("cut %v: %s[%d] = %v, want %v", bounds, what, i, a[i], b[i])
							}
						}
					}
					same("logits", act, want)
					same("grads", split.Grads(), whole.Grads())
					same("buffers", split.Buffers(), whole.Buffers())
					same("params", split.Params(), whole.Params())
				}
			}
		})
	}
}

// someCuts is cuts(nb, s), all of them for networks of up to 8 blocks;
// with more (2^(nb−1) cuts: 32,768 for mobilenet's 16 blocks) every cut
// into 1, 2 and nb stages and, for the other stage counts, 4 cuts spread
// over cuts' order.
func someCuts(nb, s int) [][]int {
	all := cuts(nb, s)
	if nb <= 8 || s <= 2 || s == nb || len(all) <= 4 {
		return all
	}
	var some [][]int
	for i := range 4 {
		some = append(some, all[i*(len(all)-1)/3])
	}
	return some
}

// cuts itself: C(nb−1, s−1) distinct cuts, each starting at block 0.
func TestCuts(t *testing.T) {
	binom := func(n, k int) int {
		r := 1
		for i := range k {
			r = r * (n - i) / (i + 1)
		}
		return r
	}
	for nb := 1; nb <= 6; nb++ {
		for s := 1; s <= nb; s++ {
			cs := cuts(nb, s)
			seen := map[string]bool{}
			for _, c := range cs {
				if len(c) != s || c[0] != 0 || !slices.IsSorted(c) || c[s-1] >= nb {
					t.Fatalf("cuts(%d, %d): %v", nb, s, c)
				}
				key := fmt.Sprint(c)
				if seen[key] {
					t.Fatalf("cuts(%d, %d): %v twice", nb, s, c)
				}
				seen[key] = true
			}
			if len(cs) != binom(nb-1, s-1) {
				t.Errorf("cuts(%d, %d): %d cuts, want %d", nb, s, len(cs), binom(nb-1, s-1))
			}
		}
	}
}

// A twin shares the network's parameters, gradients and buffers but keeps
// its own activations: two micro-batches forwarded on the network and a
// twin, then backwarded, give bit for bit the logits, gradients and
// batch-norm statistics of one network that forwards and backwards them
// one after the other (dropout masks set to the same forward numbers).
// It is the one test of the race suite that runs resnet18 and mobilenet
// at their default 28×28 inputs (the others give them 8×8): kept so.
func TestTwin(t *testing.T) {
	t.Parallel() // as its architectures: each builds its own networks
	const batch = 2
	for _, arch := range Names() {
		t.Run(arch, func(t *testing.T) {
			t.Parallel()
			ref, _ := New(arch, Options{Seed: 3})
			net, _ := New(arch, Options{Seed: 3})
			twin := net.Twin()
			r := rand.New(rand.NewPCG(2, 2))
			fill := func(n int) []float32 {
				v := make([]float32, n)
				for i := range v {
					v[i] = float32(r.NormFloat64())
				}
				return v
			}
			x0, x1 := fill(batch*ref.InputSize()), fill(batch*ref.InputSize())
			d0, d1 := fill(batch*ref.Options().Classes), fill(batch*ref.Options().Classes)
			ref.SetDropoutCalls(0)
			want0 := slices.Clone(ref.Forward(x0, batch, true))
			ref.Backward(d0)
			want1 := slices.Clone(ref.Forward(x1, batch, true))
			ref.Backward(d1)

			net.SetDropoutCalls(0)
			twin.SetDropoutCalls(1)
			got0 := slices.Clone(net.Forward(x0, batch, true))
			got1 := slices.Clone(twin.Forward(x1, batch, true))
			net.Backward(d0)
			twin.Backward(d1)
			for _, c := range []struct {
				what      string
				got, want []float32
			}{
				{"logits 0", got0, want0}, {"logits 1", got1, want1},
				{"grads", net.Grads(), ref.Grads()}, {"buffers", net.Buffers(), ref.Buffers()},
				{"twin grads", twin.Grads(), ref.Grads()},
			} {
				for i := range c.want {
					if math.Float32bits(c.got[i]) != math.Float32bits(c.want[i]) {
						t.Fatalf("%s[%d] = %v, want %v", c.what, i, c.got[i], c.want[i])
					}
				}
			}
		})
	}
}
