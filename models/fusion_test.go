package models

import (
	"fmt"
	"math"
	"slices"
	"testing"
)

// TestFusedReLUMatchesUnfused: the architectures whose batch norms apply
// the ReLU after them themselves (fuseReLU) give the
// logits, gradients and running statistics of the same network built with
// separate ReLU layers, bit for bit, over two training steps and an
// evaluation, with one and two threads and with block checkpointing.
// Not parallel: it flips fuseReLU, which every build reads (the package's
// parallel tests start after it).
func TestFusedReLUMatchesUnfused(t *testing.T) {
	defer func() { fuseReLU = true }()
	const batch = 13
	big := Options{Channels: 3, Height: 12, Width: 11, Classes: 10, Seed: 2}
	cases := []struct {
		name string
		opt  Options
	}{
		{"resnet8", testOptions("resnet8", Options{Seed: 2})}, {"resnet8", big},
		{"se-resnet8", testOptions("se-resnet8", Options{Seed: 2})},
		{"mobilenet-0.5", testOptions("mobilenet-0.5", Options{Seed: 2})}, {"mobilenet-0.5", big},
		{"convvit", testOptions("convvit", Options{Seed: 2})},
	}
	for _, tc := range cases {
		for _, threads := range []int{1, 2} {
			for _, ck := range []Checkpointing{CheckpointNone, CheckpointBlocks} {
				label := fmt.Sprintf("%s %dx%dx%d, %d threads, checkpointing %s", tc.name, tc.opt.Channels, tc.opt.Height, tc.opt.Width, threads, ck)
				var runs [2][][]float32
				fused := 0
				for i, fuse := range []bool{false, true} {
					fuseReLU = fuse
					n, err := New(tc.name, tc.opt)
					if err != nil {
						t.Fatal(err)
					}
					for _, l := range n.layers {
						if r, ok := l.(*ReLU); ok && r.Fused {
							fused++
						}
					}
					if err := n.SetThreads(threads); err != nil {
						t.Fatal(err)
					}
					if err := n.SetCheckpointing(ck); err != nil {
						t.Fatal(err)
					}
					x, labels := threadBatch(n, batch)
					for range 2 {
						y, g := threadStep(n, x, labels, batch)
						runs[i] = append(runs[i], y, g, slices.Clone(n.Buffers()))
						n.Params()[0] -= 0.01 * g[0] // a second step from other weights
					}
					runs[i] = append(runs[i], slices.Clone(n.Forward(x, batch, false)))
					n.Close()
				}
				fuseReLU = true
				if fused == 0 {
					t.Fatalf("%s: no fused ReLU in the network", label)
				}
				for k := range runs[0] {
					a, b := runs[0][k], runs[1][k]
					for j := range a {
						if math.Float32bits(a[j]) != math.Float32bits(b[j]) {
							t.Fatalf("%s: result %d differs at %d: fused %v, unfused %v", label, k, j, b[j], a[j])
						}
					}
				}
			}
		}
	}
}
