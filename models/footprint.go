package models

import (
	"fmt"
	"reflect"
)

// Footprint is what one stage of a network (or the whole network, as one
// stage) holds on its worker, for placing it where it fits.
type Footprint struct {
	// Params and Buffers are the stage's parameter and buffer values
	// (its gradients are as many as Params).
	Params, Buffers int
	// ActivationBytesPerSample and ActivationBytesFixed are the
	// activation memory the stage's layers hold for a training step (a
	// forward and a backward) of n samples, as ActivationBytes counts it:
	// Fixed + n·PerSample (Fixed is what does not grow with the batch,
	// such as a convolution's transformed weights), measured at 1 and 2
	// samples.
	ActivationBytesPerSample, ActivationBytesFixed int64
	// First and Last name the stage's first and last blocks.
	First, Last string
}

// Footprints measures each stage of the named architecture cut into
// stages as Partition cuts it (stages 1: the whole network) without
// allocating the network: every parameter, gradient and buffer view
// points at one scratch tensor (as long as the largest), and one sample
// runs forward and backward through the layers to measure what each
// stage's layers keep.
func Footprints(name string, opt Options, stages int, bal Balance) ([]Footprint, error) {
	a, ok := archs[name]
	if !ok {
		return nil, fmt.Errorf("models: unknown architecture %q", name)
	}
	opt = opt.withDefaults()
	b := builder{seed: uint64(opt.Seed)}
	layers, _, err := build(a, &b, name, opt)
	if err != nil {
		return nil, err
	}
	blocks := identifyBlocks(name, layers, &b)
	parts, err := partition(name, blocks, b.segs, stages, bal)
	if err != nil {
		return nil, err
	}
	largest := 0
	for _, g := range append(append([]Segment(nil), b.segs...), b.bufSegs...) {
		largest = max(largest, g.Len)
	}
	scratch := make([]float32, largest)
	for i, g := range b.segs {
		*b.views[2*i] = scratch[:g.Len:g.Len]
		*b.views[2*i+1] = scratch[:g.Len:g.Len]
	}
	for i, g := range b.bufSegs {
		*b.bufViews[i] = scratch[:g.Len:g.Len]
	}
	n := &Network{name: name, opt: opt, layers: layers, dropouts: b.dropouts, bns: b.bns}
	// The layers' buffers only grow: measure 1 sample, then 2.
	one := n.stageActivations(parts, 1, scratch)
	two := n.stageActivations(parts, 2, scratch)
	out := make([]Footprint, len(parts))
	for s, st := range parts {
		per := max(two[s]-one[s], 0)
		out[s] = Footprint{Params: st.ParamLen, Buffers: st.BufferLen,
			ActivationBytesPerSample: per, ActivationBytesFixed: max(one[s]-per, 0),
			First: st.Blocks[0].Name, Last: st.Blocks[len(st.Blocks)-1].Name}
	}
	return out, nil
}

// stageActivations runs a training step of batch samples through every
// stage of n (whose views all point at scratch) and returns what each
// stage's layers hold.
func (n *Network) stageActivations(parts []Stage, batch int, scratch []float32) []int64 {
	in := make([]float32, batch*n.InputSize())
	x := in
	for _, st := range parts {
		x = n.ForwardStage(st, x, batch, true)
	}
	dy := make([]float32, len(x))
	for s := len(parts) - 1; s >= 0 && dy != nil; s-- {
		dy = n.BackwardStage(parts[s], dy)
	}
	// not activations: the placeholder weights and the caller's input
	not := appendSpans(appendSpans(nil, reflect.ValueOf(scratch), nil), reflect.ValueOf(in), nil)
	out := make([]int64, len(parts))
	for s, st := range parts {
		spans := appendSpans(nil, reflect.ValueOf(n.layers[st.First:st.End]), map[uintptr]bool{})
		out[s] = unionBytes(spans) - overlapBytes(spans, not)
	}
	return out
}
