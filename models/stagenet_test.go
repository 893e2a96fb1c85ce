package models

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// A network built by NewStage holds its stage alone (counted), with the
// whole network's initial values bit for bit, for every architecture and
// every stage of 2, 3 and 4-stage cuts; and its segments are the whole
// network's of that stage.
func TestNewStageHoldsItsStageAlone(t *testing.T) {
	for _, arch := range Names() {
		t.Run(arch, func(t *testing.T) {
			t.Parallel()
			opt := Options{Seed: 7}
			whole, err := New(arch, opt)
			if err != nil {
				t.Fatal(err)
			}
			for S := 2; S <= min(4, len(whole.Blocks())); S++ {
				want, err := Partition(whole, S, Balance{})
				if err != nil {
					t.Fatal(err)
				}
				for s := range S {
					n, parts, err := NewStage(arch, opt, S, Balance{}, s)
					if err != nil {
						t.Fatal(err)
					}
					if !slices.EqualFunc(parts, want, stagesEqual) {
						t.Fatalf("S=%d: NewStage's partition differs from Partition's", S)
					}
					st := want[s]
					if n.NumParams() != st.ParamLen || len(n.Grads()) != st.ParamLen || len(n.Buffers()) != st.BufferLen {
						t.Fatalf("S=%d stage %d holds %d parameters, %d gradients, %d buffer values; want %d, %d, %d",
							S, s, n.NumParams(), len(n.Grads()), len(n.Buffers()), st.ParamLen, st.ParamLen, st.BufferLen)
					}
					if n.WholeParams() != whole.NumParams() {
						t.Fatalf("WholeParams %d, want %d", n.WholeParams(), whole.NumParams())
					}
					largest := 0
					for _, g := range append(slices.Clone(whole.Segments()), whole.BufferSegments()...) {
						largest = max(largest, g.Len)
					}
					if n.ScratchLen() > largest {
						t.Fatalf("scratch of %d values, more than the largest tensor's %d", n.ScratchLen(), largest)
					}
					bitsEqual(t, "parameters", n.Params(), whole.Params()[st.ParamOffset:st.ParamOffset+st.ParamLen])
					bitsEqual(t, "buffers", n.Buffers(), whole.Buffers()[st.BufferOffset:st.BufferOffset+st.BufferLen])
					segsEqual(t, n.Segments(), whole.Segments(), st.ParamOffset, st.ParamLen)
					segsEqual(t, n.BufferSegments(), whole.BufferSegments(), st.BufferOffset, st.BufferLen)
					if i, got, ok := n.HeldStage(); !ok || i != s || !stagesEqual(got, st) {
						t.Fatalf("HeldStage = %d, %+v, %v", i, got, ok)
					}
				}
			}
		})
	}
}

func stagesEqual(a, b Stage) bool {
	return slices.Equal(a.Blocks, b.Blocks) && a.First == b.First && a.End == b.End && a.ParamOffset == b.ParamOffset &&
		a.ParamLen == b.ParamLen && a.BufferOffset == b.BufferOffset && a.BufferLen == b.BufferLen
}

func bitsEqual(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s[%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}

// segsEqual checks that got are want's segments inside [off, off+n),
// rebased to off.
func segsEqual(t *testing.T, got, want []Segment, off, n int) {
	t.Helper()
	var w []Segment
	for _, g := range want {
		if g.Offset >= off && g.Offset+g.Len <= off+n {
			g.Offset -= off
			w = append(w, g)
		}
	}
	if !slices.EqualFunc(got, w, func(a, b Segment) bool {
		return a.Name == b.Name && a.Offset == b.Offset && a.Len == b.Len && slices.Equal(a.Shape, b.Shape)
	}) {
		t.Fatalf("segments %v, want %v", got, w)
	}
}

// A chain of stage networks trains as the whole network does: each
// stage's forward output, parameter gradients and input gradient are the
// whole network's ForwardStage/BackwardStage bit for bit (training mode,
// dropout and batch norm included).
func TestStageNetworksChainAsWhole(t *testing.T) {
	for _, arch := range []string{"cnn", "resnet8", "vit-tiny", "mlp"} {
		t.Run(arch, func(t *testing.T) {
			t.Parallel()
			opt := Options{Seed: 3}
			const batch, S = 3, 3
			whole, err := New(arch, opt)
			if err != nil {
				t.Fatal(err)
			}
			parts, err := Partition(whole, S, Balance{})
			if err != nil {
				t.Fatal(err)
			}
			nets := make([]*Network, S)
			for s := range S {
				if nets[s], _, err = NewStage(arch, opt, S, Balance{}, s); err != nil {
					t.Fatal(err)
				}
			}
			r := rand.New(rand.NewPCG(1, 2))
			x := make([]float32, batch*whole.InputSize())
			for i := range x {
				x[i] = r.Float32()
			}
			hw, hs := x, x
			for s, st := range parts {
				hw = whole.ForwardStage(st, hw, batch, true)
				hs = nets[s].ForwardStage(st, hs, batch, true)
				bitsEqual(t, "activations", hs, hw)
			}
			dy := make([]float32, len(hw))
			for i := range dy {
				dy[i] = r.Float32() - 0.5
			}
			dw, ds := dy, slices.Clone(dy)
			for s := S - 1; s >= 0; s-- {
				dw = whole.BackwardStage(parts[s], dw)
				ds = nets[s].BackwardStage(parts[s], ds)
				if dw != nil || ds != nil {
					bitsEqual(t, "input gradient", ds, dw)
				}
				st := parts[s]
				bitsEqual(t, "gradients", nets[s].Grads(), whole.Grads()[st.ParamOffset:st.ParamOffset+st.ParamLen])
				bitsEqual(t, "buffers after training", nets[s].Buffers(), whole.Buffers()[st.BufferOffset:st.BufferOffset+st.BufferLen])
			}
		})
	}
}

// Training or backward through a stage the network does not hold is a
// programming error.
func TestStageNetworkRefusesOtherStages(t *testing.T) {
	n, parts, err := NewStage("mlp", Options{}, 3, Balance{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	mustPanic(t, func() { n.ForwardStage(parts[0], make([]float32, n.InputSize()), 1, true) })
	mustPanic(t, func() { n.BackwardStage(parts[2], make([]float32, 10)) })
	mustPanic(t, func() { n.Forward(make([]float32, n.InputSize()), 1, false) })
	// Evaluation through an earlier stage gives the right shape.
	y := n.ForwardStage(parts[0], make([]float32, n.InputSize()), 1, false)
	if len(y) != 256 {
		t.Fatalf("stage 0's output has %d values, want 256", len(y))
	}
	if _, _, err := NewStage("mlp", Options{}, 3, Balance{}, 3); err == nil {
		t.Fatal("stage 3 of 3 was built")
	}
}

func mustPanic(t *testing.T, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	f()
}

// A Checksummer fed in pieces gives Checksum of the whole, for every cut.
func TestChecksummerPieces(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	x := make([]float32, 37)
	for i := range x {
		x[i] = r.Float32() - 0.5
	}
	for cut := range len(x) + 1 {
		c := NewChecksummer()
		c.Add(x[:cut])
		c.Add(x[cut:])
		if c.Sum() != Checksum(x) {
			t.Fatalf("cut at %d: %x, want %x", cut, c.Sum(), Checksum(x))
		}
	}
}

// Footprints counts each stage's parameters and buffers as Partition
// cuts them, and for one stage the activation bytes of a 1-sample step
// of the whole network (ActivationBytes), without allocating it.
func TestFootprints(t *testing.T) {
	for _, arch := range []string{"mlp", "cnn", "resnet8", "vit-tiny"} {
		whole, err := New(arch, Options{})
		if err != nil {
			t.Fatal(err)
		}
		x := make([]float32, whole.InputSize())
		whole.Backward(make([]float32, len(whole.Forward(x, 1, true))))
		one, err := Footprints(arch, Options{}, 1, Balance{})
		if err != nil {
			t.Fatal(err)
		}
		x2 := make([]float32, 2*whole.InputSize())
		whole2, err := New(arch, Options{})
		if err != nil {
			t.Fatal(err)
		}
		whole2.Backward(make([]float32, len(whole2.Forward(x2, 2, true))))
		if got := 2*one[0].ActivationBytesPerSample + one[0].ActivationBytesFixed; got != whole2.ActivationBytes() {
			t.Errorf("%s: 2 samples hold %d activation bytes; Footprints says %d", arch, whole2.ActivationBytes(), got)
		}
		if len(one) != 1 || one[0].Params != whole.NumParams() || one[0].Buffers != len(whole.Buffers()) ||
			one[0].ActivationBytesPerSample+one[0].ActivationBytesFixed != whole.ActivationBytes() {
			t.Errorf("%s whole: %+v; want %d parameters, %d buffer values, %d activation bytes", arch, one, whole.NumParams(), len(whole.Buffers()), whole.ActivationBytes())
		}
		cut, err := Partition(whole, 3, Balance{})
		if err != nil {
			t.Fatal(err)
		}
		three, err := Footprints(arch, Options{}, 3, Balance{})
		if err != nil {
			t.Fatal(err)
		}
		var acts int64
		for s, f := range three {
			if f.Params != cut[s].ParamLen || f.Buffers != cut[s].BufferLen || f.ActivationBytesPerSample <= 0 {
				t.Errorf("%s stage %d: %+v; want %d parameters, %d buffer values", arch, s, f, cut[s].ParamLen, cut[s].BufferLen)
			}
			acts += f.ActivationBytesPerSample
		}
		t.Logf("%s: activation bytes per sample %d (+%d fixed) whole, %d summed over 3 stages", arch, one[0].ActivationBytesPerSample, one[0].ActivationBytesFixed, acts)
	}
}
