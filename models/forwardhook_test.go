package models

import (
	"slices"
	"testing"
)

// TestForwardHook: the hook hears every layer before and after its
// Forward, in order, and changes nothing the network computes; with
// activation checkpointing it is not called.
func TestForwardHook(t *testing.T) {
	n, err := New("lenet5", Options{Channels: 1, Height: 28, Width: 28, Classes: 10, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	x := make([]float32, 2*n.InputSize())
	for i := range x {
		x[i] = float32(i%7) / 7
	}
	want := slices.Clone(n.Forward(x, 2, true))
	var calls []int
	n.SetForwardHook(func(i int, done bool) {
		if done {
			i = -i - 1
		}
		calls = append(calls, i)
	})
	got := n.Forward(x, 2, true)
	if !slices.Equal(got, want) {
		t.Fatal("the hook changed the output")
	}
	kinds := n.LayerKinds()
	if len(calls) != 2*len(kinds) {
		t.Fatalf("%d calls for %d layers %v", len(calls), len(kinds), kinds)
	}
	for i := range kinds {
		if calls[2*i] != i || calls[2*i+1] != -i-1 {
			t.Fatalf("calls %v: want before and after each layer in order", calls)
		}
	}
	if kinds[0] != "Conv2D" {
		t.Errorf("layer 0 is %q, want Conv2D", kinds[0])
	}
	calls = nil
	if err := n.SetCheckpointing(CheckpointBlocks); err != nil {
		t.Fatal(err)
	}
	n.Forward(x, 2, true)
	if len(calls) != 0 {
		t.Errorf("with checkpointing the hook was called %d times", len(calls))
	}
}
