package models

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gradsync/gradsync/internal/kernels"
)

// ckStep runs one training step of n (Forward, loss, BackwardNotify) and
// returns copies of the logits, the gradients and the ready offsets.
func ckStep(n *Network, x []float32, labels []uint8, batch int) (logits, grads []float32, ready []int) {
	c := n.Options().Classes
	d := make([]float32, batch*c)
	n.ZeroGrad()
	y := n.Forward(x, batch, true)
	SoftmaxCrossEntropy(y, labels, c, d)
	logits = slices.Clone(y)
	n.BackwardNotify(d, func(from int) { ready = append(ready, from) })
	return logits, slices.Clone(n.Grads()), ready
}

// sameBits reports the first index where a and b differ in their bits.
func sameBits(a, b []float32) (int, bool) {
	if len(a) != len(b) {
		return 0, false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i, false
		}
	}
	return 0, true
}

// TestCheckpointingBitIdentical checks, on every architecture, both
// checkpointing modes and one and two threads, that several training
// steps give bit for bit the logits, gradients, ready offsets, batch-norm
// running statistics and (after an SGD step) parameters of the same
// network without checkpointing. Dropout draws fresh masks every step
// (it is not rewound), so a recomputation that drew new ones, or moved
// the running statistics a second time, would show; the later steps run
// on arenas holding an earlier step's values, so a lent buffer read
// before it is written would show too. Batch 13 makes the threads'
// slices uneven.
func TestCheckpointingBitIdentical(t *testing.T) {
	t.Parallel() // as its cases: each builds its own networks
	const batch, steps = 13, 3
	for _, name := range Names() {
		for _, mode := range []Checkpointing{CheckpointBlocks, CheckpointSqrt} {
			for _, threads := range []int{1, 2} {
				if heavyArchs[name] && (mode == CheckpointBlocks) != (threads == 1) {
					continue // millions of parameters: blocks on 1 thread, sqrt on 2
				}
				t.Run(fmt.Sprintf("%s/%s/%d", name, mode, threads), func(t *testing.T) {
					t.Parallel()
					ref, _ := New(name, testOptions(name, Options{Seed: 4}))
					ck, _ := New(name, testOptions(name, Options{Seed: 4}))
					defer ref.Close()
					defer ck.Close()
					for _, n := range []*Network{ref, ck} {
						if err := n.SetThreads(threads); err != nil {
							t.Fatal(err)
						}
					}
					if err := ck.SetCheckpointing(mode); err != nil {
						t.Fatal(err)
					}
					for s := range steps {
						r := rand.New(rand.NewPCG(uint64(s), 9))
						x := randn(r, batch*ref.InputSize())
						labels := make([]uint8, batch)
						for i := range labels {
							labels[i] = uint8(r.IntN(ref.Options().Classes))
						}
						wy, wg, wr := ckStep(ref, x, labels, batch)
						y, g, rd := ckStep(ck, x, labels, batch)
						if i, ok := sameBits(wy, y); !ok {
							t.Fatalf("step %d: logit %d is %v, want %v", s, i, y[i], wy[i])
						}
						if i, ok := sameBits(wg, g); !ok {
							t.Fatalf("step %d: gradient %d is %v, want %v", s, i, g[i], wg[i])
						}
						if i, ok := sameBits(ref.Buffers(), ck.Buffers()); !ok {
							t.Fatalf("step %d: buffer %d is %v, want %v", s, i, ck.Buffers()[i], ref.Buffers()[i])
						}
						if !slices.Equal(wr, rd) {
							t.Fatalf("step %d: ready offsets %v, want %v", s, rd, wr)
						}
						for _, n := range []*Network{ref, ck} {
							p, gr := n.Params(), n.Grads()
							for i := range p {
								p[i] -= 0.05 * gr[i]
							}
						}
					}
					// evaluation mode through the checkpointed path
					x := randn(rand.New(rand.NewPCG(7, 7)), batch*ref.InputSize())
					wy := slices.Clone(ref.Forward(x, batch, false))
					if i, ok := sameBits(wy, ck.Forward(x, batch, false)); !ok {
						t.Fatalf("evaluation logit %d differs", i)
					}
				})
			}
		}
	}
}

// TestCheckpointingMemory checks that checkpointing with blocks lowers
// the activation memory held after a step by at least 2× on resnet8 and
// vit-tiny (the figure), and logs the factors of every
// architecture and mode. (On small networks whose memory is in one block,
// such as the cnn's convolutions, the kept segment outputs and the
// arenas cost about what they save.)
func TestCheckpointingMemory(t *testing.T) {
	t.Parallel() // as its architectures: each builds its own networks
	const batch = 32
	for _, name := range Names() {
		batch := batch
		if heavyArchs[name] {
			batch = 4 // millions of parameters
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			none := ckBytes(t, name, CheckpointNone, batch)
			for _, mode := range []Checkpointing{CheckpointBlocks, CheckpointSqrt} {
				got := ckBytes(t, name, mode, batch)
				f := float64(none) / float64(got)
				t.Logf("%s %s: %d → %d bytes (%.2f×)", name, mode, none, got, f)
				if mode == CheckpointBlocks && (name == "resnet8" || name == "vit-tiny") && f < 2 {
					t.Errorf("%s blocks: activation memory %.2f× lower, want ≥ 2×", name, f)
				}
			}
		})
	}
}

func ckBytes(t *testing.T, name string, mode Checkpointing, batch int) int64 {
	t.Helper()
	n, _ := New(name, testOptions(name, Options{Seed: 1}))
	if err := n.SetCheckpointing(mode); err != nil {
		t.Fatal(err)
	}
	x, labels := threadBatch(n, batch)
	for range 3 {
		ckStep(n, x, labels, batch)
	}
	return n.ActivationBytes()
}

func TestParseCheckpointing(t *testing.T) {
	for s, want := range map[string]Checkpointing{"": CheckpointNone, "none": CheckpointNone, "blocks": CheckpointBlocks, "sqrt": CheckpointSqrt} {
		got, err := ParseCheckpointing(s)
		if err != nil || got != want {
			t.Errorf("ParseCheckpointing(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	if _, err := ParseCheckpointing("layers"); err == nil {
		t.Error(`ParseCheckpointing("layers"): no error`)
	}
	n, _ := New("mlp", Options{})
	if err := n.SetCheckpointing(Checkpointing(9)); err == nil {
		t.Error("SetCheckpointing(9): no error")
	}
}

// TestCheckpointingDoesNotAllocate checks that warm checkpointed steps
// allocate nothing, as steps without checkpointing (the arenas are sized
// by the first steps), on one thread and on two, in fp32 and in bf16
// (whose rounded operands live in per-layer scratch).
func TestCheckpointingDoesNotAllocate(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("allocation accounting (not under -short or -race)")
	}
	forEachBackend(t, func(t *testing.T) {
		if kernels.Backend() != "openblas" {
			t.Skip("gonum's GEMM allocates")
		}
		for _, name := range Names() {
			for _, cfg := range []struct {
				threads int
				prec    Precision
			}{{1, FP32}, {2, FP32}, {1, BF16}} {
				threads := cfg.threads
				n, _ := New(name, Options{})
				if err := n.SetThreads(threads); err != nil {
					t.Fatal(err)
				}
				if err := n.SetPrecision(cfg.prec); err != nil {
					t.Fatal(err)
				}
				if err := n.SetCheckpointing(CheckpointBlocks); err != nil {
					t.Fatal(err)
				}
				const batch = 16
				x, labels := threadBatch(n, batch)
				d := make([]float32, batch*n.Options().Classes)
				step := func() {
					n.ZeroGrad()
					SoftmaxCrossEntropy(n.Forward(x, batch, true), labels, n.Options().Classes, d)
					n.Backward(d)
				}
				step()
				step()
				if a := warmAllocs(step); a != 0 {
					t.Errorf("%s, %d threads, %v: %v allocations per checkpointed step, want 0", name, threads, cfg.prec, a)
				}
				n.Close()
			}
		}
	})
}

// TestCheckpointingRefusesStages checks that the stage entry points,
// which run layers without checkpointing, refuse a network that has it.
func TestCheckpointingRefusesStages(t *testing.T) {
	n, _ := New("resnet8", Options{})
	st := Stage{First: 0, End: 1}
	n.ForwardStage(st, make([]float32, n.InputSize()), 1, true) // fine without checkpointing
	if err := n.SetCheckpointing(CheckpointBlocks); err != nil {
		t.Fatal(err)
	}
	for _, f := range []func(){
		func() { n.ForwardStage(st, make([]float32, n.InputSize()), 1, true) },
		func() { n.BackwardStage(st, nil) },
	} {
		func() {
			defer func() {
				if r := recover(); r == nil {
					t.Error("no panic on a checkpointed network")
				}
			}()
			f()
		}()
	}
}

// BenchmarkCheckpointingStep measures a batch-64 training step of resnet8
// and vit-tiny without checkpointing and with blocks:
// docs/experiments/engine-speed/2026-12-02-bf16-checkpointing.md.
func BenchmarkCheckpointingStep(b *testing.B) {
	for _, name := range []string{"resnet8", "vit-tiny"} {
		for _, c := range []Checkpointing{CheckpointNone, CheckpointBlocks} {
			b.Run(name+"/"+c.String(), func(b *testing.B) {
				n, _ := New(name, Options{})
				if err := n.SetCheckpointing(c); err != nil {
					b.Fatal(err)
				}
				benchStep(b, n)
			})
		}
	}
}
