package models

import (
	"fmt"
	"math/rand/v2"
	"reflect"
)

// This file builds a network that holds one pipeline stage alone
// (NewStage): the worker of a pipeline stage allocates that stage's
// parameters, gradients and buffers, not the whole model's.

// stagePart is what a network built by NewStage keeps of the whole
// network it is a stage of.
type stagePart struct {
	index int
	stage Stage // in the whole network's offsets
	// blocks, segs and bufSegs are the whole network's (Blocks,
	// Segments and BufferSegments of New's network).
	blocks        []Block
	segs, bufSegs []Segment
	// scratch is what the other stages' layers' views point into (every
	// one of them at its start; their values are meaningless): it is as
	// long as the largest of their tensors. Their initialisers write it,
	// so that the random stream reaches this stage's layers as in New.
	scratch []float32
}

// NewStage builds stage s of the named architecture cut into stages as
// Partition(New(name, opt), stages, bal) cuts it, and returns it with the
// whole partition. The network's flat buffers (Params, Grads, Buffers)
// hold that stage alone, in the whole network's order, and its
// parameters are bit for bit the whole network's initial values of that
// stage (the same seed's random stream runs through every layer's
// initialiser). Segments and BufferSegments are the stage's tensors, with
// offsets into the stage's buffers; Blocks and Partition are the whole
// network's, so Stage offsets stay the whole network's: the network holds
// elements [ParamOffset, ParamOffset+ParamLen) of the whole Params.
//
// Only the stage's layers run: ForwardStage and BackwardStage of its own
// stage as on a whole network. Another stage's layers point at one
// scratch tensor (as long as the largest of them), so ForwardStage of an
// earlier stage in evaluation mode gives outputs of the right shape and
// meaningless values (a way to find the shapes at the stage's
// boundaries); training through another stage, Forward and Backward
// panic. A stage runs on one thread (SetThreads accepts any count and
// starts none: ForwardStage never used them).
func NewStage(name string, opt Options, stages int, bal Balance, s int) (*Network, []Stage, error) {
	a, ok := archs[name]
	if !ok {
		return nil, nil, fmt.Errorf("models: unknown architecture %q", name)
	}
	opt = opt.withDefaults()
	if opt.Channels < 0 || opt.Height < 0 || opt.Width < 0 || opt.Classes < 0 {
		return nil, nil, fmt.Errorf("models: negative dimension in %+v", opt)
	}
	b := builder{seed: uint64(opt.Seed)}
	layers, init, err := build(a, &b, name, opt)
	if err != nil {
		return nil, nil, err
	}
	blocks := identifyBlocks(name, layers, &b)
	parts, err := partition(name, blocks, b.segs, stages, bal)
	if err != nil {
		return nil, nil, err
	}
	if s < 0 || s >= stages {
		return nil, nil, fmt.Errorf("models: stage %d out of [0, %d)", s, stages)
	}
	st := parts[s]
	p := &stagePart{index: s, stage: st, blocks: blocks, segs: b.segs, bufSegs: b.bufSegs}
	largest := 0
	var segs, bufSegs []Segment
	for _, g := range b.segs {
		if p.ownsParam(g) {
			g.Offset -= st.ParamOffset
			segs = append(segs, g)
		} else {
			largest = max(largest, g.Len)
		}
	}
	for _, g := range b.bufSegs {
		if p.ownsBuffer(g) {
			g.Offset -= st.BufferOffset
			bufSegs = append(bufSegs, g)
		} else {
			largest = max(largest, g.Len)
		}
	}
	p.scratch = make([]float32, largest)
	n := &Network{
		name:     name,
		opt:      opt,
		layers:   layers,
		params:   make([]float32, st.ParamLen),
		grads:    make([]float32, st.ParamLen),
		segs:     segs,
		bufs:     make([]float32, st.BufferLen),
		bufSegs:  bufSegs,
		dropouts: b.dropouts,
		bns:      b.bns,
		part:     p,
	}
	p.bind(&b, n.params, n.grads, n.bufs)
	init(rand.New(rand.NewPCG(uint64(opt.Seed), 0)))
	return n, parts, nil
}

// identifyBlocks finds the blocks of layers, just declared on b, without
// allocating the whole network's buffers: it points each parameter's
// view at its own element of a small buffer (views overlap, but no two
// start at the same address, and a freshly bound layer holds nothing but
// its views), which is all the blocks' walk needs.
func identifyBlocks(name string, layers []Layer, b *builder) []Block {
	longest := 0
	for _, g := range b.segs {
		longest = max(longest, g.Len)
	}
	for _, g := range b.bufSegs {
		longest = max(longest, g.Len)
	}
	pid := make([]float32, len(b.segs)+longest)
	bid := make([]float32, len(b.bufSegs)+longest)
	grads := make([]float32, longest)
	params := make(map[uintptr]int, len(b.segs))
	bufs := make(map[uintptr]int, len(b.bufSegs))
	for i, g := range b.segs {
		v := pid[i : i+g.Len : i+g.Len]
		*b.views[2*i] = v
		*b.views[2*i+1] = grads[:g.Len:g.Len]
		if g.Len > 0 {
			params[reflect.ValueOf(v).Pointer()] = i
		}
	}
	for i, g := range b.bufSegs {
		v := bid[i : i+g.Len : i+g.Len]
		*b.bufViews[i] = v
		if g.Len > 0 {
			bufs[reflect.ValueOf(v).Pointer()] = i
		}
	}
	return blocksOf(name, layers, b.segs, b.bufSegs, params, bufs)
}

func (p *stagePart) ownsParam(g Segment) bool {
	return g.Offset >= p.stage.ParamOffset && g.Offset+g.Len <= p.stage.ParamOffset+p.stage.ParamLen
}

func (p *stagePart) ownsBuffer(g Segment) bool {
	return g.Offset >= p.stage.BufferOffset && g.Offset+g.Len <= p.stage.BufferOffset+p.stage.BufferLen
}

// bind points the views declared on b (in the whole network's layout)
// into the stage's buffers, and the other stages' into the scratch.
func (p *stagePart) bind(b *builder, params, grads, bufs []float32) {
	for i, g := range b.segs {
		if !p.ownsParam(g) {
			*b.views[2*i] = p.scratch[:g.Len:g.Len]
			*b.views[2*i+1] = p.scratch[:g.Len:g.Len]
			continue
		}
		lo := g.Offset - p.stage.ParamOffset
		*b.views[2*i] = params[lo : lo+g.Len : lo+g.Len]
		*b.views[2*i+1] = grads[lo : lo+g.Len : lo+g.Len]
	}
	for i, g := range b.bufSegs {
		if !p.ownsBuffer(g) {
			*b.bufViews[i] = p.scratch[:g.Len:g.Len]
			continue
		}
		lo := g.Offset - p.stage.BufferOffset
		*b.bufViews[i] = bufs[lo : lo+g.Len : lo+g.Len]
	}
}

// holds panics unless the network holds st's parameters (a whole network
// holds every stage's).
func (p *stagePart) holds(what string, st Stage) {
	if p == nil || st.First == p.stage.First && st.End == p.stage.End {
		return
	}
	panic(fmt.Sprintf("models: %s of layers [%d, %d) on a network that holds stage %d alone (layers [%d, %d))",
		what, st.First, st.End, p.index, p.stage.First, p.stage.End))
}

// HeldStage reports the stage a network built by NewStage holds (its
// index, and its ranges in the whole network's buffers); ok is false for
// a whole network.
func (n *Network) HeldStage() (index int, st Stage, ok bool) {
	if n.part == nil {
		return 0, Stage{}, false
	}
	return n.part.index, n.part.stage, true
}

// WholeParams is the parameter count of the whole network: NumParams, or
// for a network built by NewStage that of the network it is a stage of.
func (n *Network) WholeParams() int {
	if n.part == nil {
		return len(n.params)
	}
	last := n.part.segs[len(n.part.segs)-1]
	return last.Offset + last.Len
}

// WholeSegments and WholeBufferSegments are the whole network's
// Segments and BufferSegments (for a network built by NewStage, those of
// the network it is a stage of, offsets into the whole buffers).
func (n *Network) WholeSegments() []Segment {
	if n.part == nil {
		return n.segs
	}
	return n.part.segs
}

// WholeBufferSegments: see WholeSegments.
func (n *Network) WholeBufferSegments() []Segment {
	if n.part == nil {
		return n.bufSegs
	}
	return n.part.bufSegs
}

// ScratchLen is the length of the one scratch tensor a network built by
// NewStage points the other stages' layers at (0 for a whole network).
func (n *Network) ScratchLen() int {
	if n.part == nil {
		return 0
	}
	return len(n.part.scratch)
}
