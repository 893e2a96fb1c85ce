package models

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"unsafe"
)

// Activation checkpointing (Chen et al. 2016, torch.utils.checkpoint):
// a training Forward runs the network's layers in segments and keeps only
// each segment's output, the next one's input; Backward runs the segments
// last to first and recomputes each one's Forward, from its kept input,
// just before back-propagating through it. The last segment is never
// discarded (its Backward comes right after Forward), as in PyTorch's
// checkpoint_sequential.
//
// Discarding is real: the activation buffers of a checkpointed segment's
// layers (their outputs, input gradients and scratch, listed by each
// layer type's actBufs) are lent, for the span of one use, out of one of
// two arenas the segments take in turn (ping-pong: segment k's input
// gradient, in arena k mod 2, is read while segment k−1 runs in the other
// one), so the memory they take is two segments' worth instead of the
// whole network's. The arenas are sized by the first steps and then
// reused: warm steps do not allocate.
//
// Recomputation replays the first Forward exactly, so the gradients are
// bit-identical to those without checkpointing: each dropout layer of the
// segment is rewound to the mask stream of its first Forward, and batch
// norm replays the batch statistics of its first Forward (kept per
// channel outside the arenas) instead of computing them again: the same
// values, a recomputation about a third of batch norm's Forward cheaper,
// and the running statistics move once per step.

// Checkpointing says which activations a training step keeps.
type Checkpointing int

// The checkpointing modes.
const (
	// CheckpointNone keeps every layer's activations (the default).
	CheckpointNone Checkpointing = iota
	// CheckpointBlocks makes every block (Blocks) a segment.
	CheckpointBlocks
	// CheckpointSqrt cuts the blocks into ⌈√n⌉ runs of as equal length as
	// possible, Chen et al.'s O(√n) memory for about one more Forward.
	CheckpointSqrt
)

var checkpointNames = []string{"none", "blocks", "sqrt"}

// String returns the mode's name as ParseCheckpointing accepts it.
func (c Checkpointing) String() string {
	if c < 0 || int(c) >= len(checkpointNames) {
		return fmt.Sprintf("Checkpointing(%d)", int(c))
	}
	return checkpointNames[c]
}

// ParseCheckpointing maps a spec's activation_checkpointing ("", none,
// blocks, sqrt) to its mode.
func ParseCheckpointing(s string) (Checkpointing, error) {
	if s == "" {
		return CheckpointNone, nil
	}
	for i, n := range checkpointNames {
		if s == n {
			return Checkpointing(i), nil
		}
	}
	return 0, fmt.Errorf("models: unknown activation checkpointing %q (want %s)", s, strings.Join(checkpointNames, ", "))
}

// SetCheckpointing selects the activation checkpointing of the following
// steps (default CheckpointNone). It must not be called during a step
// (between Forward and Backward). ForwardStage and BackwardStage (a
// pipeline stage's layers) do not checkpoint and panic on a network
// that does.
func (n *Network) SetCheckpointing(c Checkpointing) error {
	if c < CheckpointNone || c > CheckpointSqrt {
		return fmt.Errorf("models: %s: unknown checkpointing mode %d", n.name, int(c))
	}
	n.ckMode = c
	n.ck = n.newStackCk(n.layers)
	for _, r := range n.reps {
		r.ck = n.newStackCk(r.layers)
	}
	return nil
}

// noCheckpointing panics when checkpointing is set: what runs layers
// directly (ForwardStage, BackwardStage) would find the buffers of
// different segments lent out of the same arena.
func (n *Network) noCheckpointing(what string) {
	if n.ck != nil {
		panic(fmt.Sprintf("models: %s.%s: the network has activation checkpointing %s; stages run without it", n.name, what, n.ckMode))
	}
}

// Checkpointing reports the mode set by SetCheckpointing.
func (n *Network) Checkpointing() Checkpointing { return n.ckMode }

// segmentBounds returns the top-level layer indices where the segments
// of mode c start, followed by len(n.layers); nil for CheckpointNone.
func (n *Network) segmentBounds(c Checkpointing) []int {
	if c == CheckpointNone {
		return nil
	}
	blocks := n.Blocks()
	var starts []int
	switch c {
	case CheckpointBlocks:
		for _, b := range blocks {
			starts = append(starts, b.First)
		}
	case CheckpointSqrt:
		s := int(math.Ceil(math.Sqrt(float64(len(blocks)))))
		q, rem := len(blocks)/s, len(blocks)%s
		at := 0
		for k := range s {
			starts = append(starts, blocks[at].First)
			at += q
			if k < rem {
				at++
			}
		}
	}
	return append(starts, len(n.layers))
}

// stackCk is the checkpointing state of one thread's copy of the layers.
type stackCk struct {
	layers []Layer
	segs   []ckSegment
	// fwd lends the buffers Forward uses to one segment at a time; bwd
	// those only Backward uses to one top-level layer (of a checkpointed
	// segment) at a time, the arenas taking turns so that the gradient a
	// layer reads is never in the one it writes.
	fwd arena
	bwd [2]arena
	// lay[i] are top-level layer i's Backward-only buffers.
	lay []lent
	// slots[k] is segment k's output kept by Forward (segments 0…len−2).
	slots [][]float32
	// input is the last Forward's input of segment 0 (borrowed).
	input []float32
	batch int
	train bool
}

// ckSegment is one segment: top-level layers [first, end).
type ckSegment struct {
	first, end int
	fwd        lent // the Forward buffers of its layers
	drops      []*Dropout
	calls      []uint64 // each dropout's counter at the segment's Forward
	bns        []*BatchNorm2d
}

// lent is a set of lendable buffers with the capacities they reached.
type lent struct {
	bufs []*[]float32
	caps []int
}

// arena is a bump allocator over one buffer, reset for every use.
type arena struct {
	buf []float32
	off int
}

// lend points l's buffers into a, reset and grown first if the recorded
// capacities no longer fit. A buffer never used yet (capacity 0) is left
// to its layer, which allocates it; reclaim then records its size.
func (a *arena) lend(l *lent) {
	need := 0
	for _, c := range l.caps {
		need += (c + 15) &^ 15
	}
	if len(a.buf) < need {
		a.buf = make([]float32, need)
	}
	a.off = 0
	for i, p := range l.bufs {
		if c := l.caps[i]; c > 0 {
			*p = a.buf[a.off : a.off : a.off+c]
			a.off += (c + 15) &^ 15 // 64-byte steps keep every buffer aligned as the first
		}
	}
}

// within reports whether s starts inside buf's memory.
func within(s, buf []float32) bool {
	if len(s) == 0 || len(buf) == 0 {
		return false
	}
	p, lo := uintptr(unsafe.Pointer(unsafe.SliceData(s))), uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	return p >= lo && p < lo+uintptr(len(buf))*4
}

// reclaim records the capacities l's buffers reached in their last use.
func (l *lent) reclaim() {
	for i, p := range l.bufs {
		l.caps[i] = max(l.caps[i], cap(*p))
	}
}

// actBufs is implemented by layers whose activation buffers the
// checkpointer may lend out of an arena: each listed field must be
// resized with grow before every use and be written before it is read in
// that use (no content survives from one Forward, or one Backward, to the
// next); bwd lists those Forward does not touch. Layers without it keep
// their own buffers.
type actBufs interface {
	actBufs() (fwd, bwd []*[]float32)
}

// newStackCk prepares the checkpointing of layers (one thread's copy) for
// n's mode; nil for CheckpointNone.
func (n *Network) newStackCk(layers []Layer) *stackCk {
	bounds := n.segmentBounds(n.ckMode)
	if bounds == nil {
		return nil
	}
	ck := &stackCk{layers: layers, slots: make([][]float32, len(bounds)-2),
		lay: make([]lent, len(layers))}
	for k := range len(bounds) - 1 {
		s := ckSegment{first: bounds[k], end: bounds[k+1]}
		for i := s.first; i < s.end; i++ {
			for _, l := range nestedLayers(layers[i : i+1]) {
				if a, ok := l.(actBufs); ok {
					f, b := a.actBufs()
					s.fwd.bufs = append(s.fwd.bufs, f...)
					ck.lay[i].bufs = append(ck.lay[i].bufs, b...)
				}
				switch l := l.(type) {
				case *Dropout:
					s.drops = append(s.drops, l)
				case *BatchNorm2d:
					s.bns = append(s.bns, l)
				}
			}
			ck.lay[i].caps = make([]int, len(ck.lay[i].bufs))
		}
		s.fwd.caps = make([]int, len(s.fwd.bufs))
		s.calls = make([]uint64, len(s.drops))
		ck.segs = append(ck.segs, s)
	}
	return ck
}

// nestedLayers returns every layer reachable from top (the layers
// themselves and, recursively, the layers held in their fields: a
// residual block's branches, a fused pair, a token-wise wrapper), each
// once, found by walking the fields read-only so that container types
// added later are covered too. A layer held only in an unexported field
// is not found (reflect does not hand it out): its buffers stay its own,
// and a dropout or batch norm so held would break the replay, so every
// architecture's test would catch it.
func nestedLayers(top []Layer) []Layer {
	layerType := reflect.TypeFor[Layer]()
	seen := map[uintptr]bool{}
	var out []Layer
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		switch v.Kind() {
		case reflect.Pointer:
			if v.IsNil() || seen[v.Pointer()] {
				return
			}
			seen[v.Pointer()] = true
			if v.Type().Implements(layerType) && v.CanInterface() {
				out = append(out, v.Interface().(Layer))
			}
			walk(v.Elem())
		case reflect.Interface:
			if !v.IsNil() {
				walk(v.Elem())
			}
		case reflect.Struct:
			for i := range v.NumField() {
				walk(v.Field(i))
			}
		case reflect.Slice:
			switch v.Type().Elem().Kind() {
			case reflect.Pointer, reflect.Interface, reflect.Struct, reflect.Slice:
				for i := range v.Len() {
					walk(v.Index(i))
				}
			}
		}
	}
	for _, l := range top {
		walk(reflect.ValueOf(l))
	}
	return out
}

// forward runs the layers on x, keeping only the segments' outputs.
func (ck *stackCk) forward(x []float32, batch int, train bool) []float32 {
	ck.input, ck.batch, ck.train = x, batch, train
	last := len(ck.segs) - 1
	for k := range ck.segs[:last] {
		s := &ck.segs[k]
		for i, d := range s.drops {
			s.calls[i] = d.calls
		}
		ck.fwd.lend(&s.fwd)
		for _, l := range ck.layers[s.first:s.end] {
			x = l.Forward(x, batch, train)
		}
		s.fwd.reclaim()
		ck.slots[k] = grow(ck.slots[k], len(x))
		copy(ck.slots[k], x)
		x = ck.slots[k]
	}
	for _, l := range ck.layers[ck.segs[last].first:] {
		x = l.Forward(x, batch, train)
	}
	return x
}

// recompute runs segment k's Forward again from its kept input, with the
// masks and batch statistics of the first run.
func (ck *stackCk) recompute(k int) {
	s := &ck.segs[k]
	x := ck.input
	if k > 0 {
		x = ck.slots[k-1]
	}
	for i, d := range s.drops {
		d.calls = s.calls[i]
	}
	for _, b := range s.bns {
		b.replay = true
	}
	ck.fwd.lend(&s.fwd)
	for _, l := range ck.layers[s.first:s.end] {
		x = l.Forward(x, ck.batch, ck.train)
	}
	s.fwd.reclaim()
	for _, b := range s.bns {
		b.replay = false
	}
}

// backward back-propagates d through the segments last to first,
// recomputing each checkpointed one first; done(i) as in
// Network.backward (not for a layer that returns nil, which ends it).
func (ck *stackCk) backward(d []float32, done func(i int)) {
	last := len(ck.segs) - 1
	for k := last; k >= 0; k-- {
		s := ck.segs[k]
		if k < last {
			ck.recompute(k)
		}
		for i := s.end - 1; i >= s.first; i-- {
			if k < last {
				// the arena d is not in: d may come from further up
				// than layer i+1 (a layer such as Flatten passes its
				// gradient through)
				j := i % 2
				if within(d, ck.bwd[j].buf) {
					j = 1 - j
				}
				ck.bwd[j].lend(&ck.lay[i])
			}
			d = ck.layers[i].Backward(d)
			if k < last {
				ck.lay[i].reclaim()
			}
			if d == nil {
				return
			}
			if done != nil {
				done(i)
			}
		}
	}
}
