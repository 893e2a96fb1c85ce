package models

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
)

// Options shapes a network's input and output. The zero value means
// 1×28×28 inputs, 10 classes and seed 0 (MNIST).
type Options struct {
	Channels, Height, Width, Classes int
	Seed                             int64 // initial parameters are a pure function of Seed
}

func (o Options) withDefaults() Options {
	if o.Channels == 0 {
		o.Channels = 1
	}
	if o.Height == 0 {
		o.Height = 28
	}
	if o.Width == 0 {
		o.Width = 28
	}
	if o.Classes == 0 {
		o.Classes = 10
	}
	return o
}

// Segment is a named view of the flat parameter and gradient buffers:
// elements [Offset, Offset+Len) hold the PyTorch parameter Name with shape
// Shape (row-major, PyTorch layout).
type Segment struct {
	Name        string
	Shape       []int
	Offset, Len int
}

// Network is a named architecture: a stack of layers over one flat
// parameter buffer and one flat gradient buffer. It is not safe for
// concurrent use; each worker owns its own.
type Network struct {
	name     string
	opt      Options
	layers   []Layer
	params   []float32
	grads    []float32
	segs     []Segment
	bufs     []float32 // non-trainable state (batch-norm running statistics)
	bufSegs  []Segment
	dropouts []*Dropout
	bns      []*BatchNorm2d
	batch    int   // batch of the last Forward
	ready    []int // BackwardNotify's offsets per layer, computed on first use

	// SetThreads' replicas (threads 1…T−1; none with one thread), the
	// last Forward's slices of the batch and the active threads, and the
	// logits gathered from the threads.
	reps   []*replica
	split  []int
	active int
	logits []float32
	// bnGroups are shared by the threads' copies of each batch norm.
	bnGroups []*bnGroup

	// ckMode is SetCheckpointing's mode and ck thread 0's checkpointing
	// state (nil without checkpointing); lastInput is the last Forward's
	// input, borrowed (ActivationBytes leaves it out).
	ckMode    Checkpointing
	ck        *stackCk
	lastInput []float32
	// prec is SetPrecision's precision.
	prec Precision
	// forwardHook is SetForwardHook's (nil: none).
	forwardHook func(layer int, done bool)
	// part is the pipeline stage a network built by NewStage holds (nil:
	// the whole network).
	part *stagePart
}

// builder lays out the flat buffers: layers declare their parameters, then
// bind points every declared view into the allocated buffers.
type builder struct {
	segs  []Segment
	views []*[]float32 // per segment: parameter view, then gradient view
	n     int

	bufSegs  []Segment
	bufViews []*[]float32 // per buffer segment: its view
	nbuf     int

	seed     uint64
	dropouts []*Dropout
	bns      []*BatchNorm2d     // in declaration order, for SetThreads
	chain    bool               // conv sets Conv2D.Chain (the batch-norm architectures: chainConvs)
	inits    []func(*rand.Rand) // in declaration order
}

// param declares a parameter; *p and *g are set to its views by bind.
func (b *builder) param(name string, p, g *[]float32, shape ...int) {
	size := 1
	for _, d := range shape {
		size *= d
	}
	b.segs = append(b.segs, Segment{Name: name, Shape: shape, Offset: b.n, Len: size})
	b.views = append(b.views, p, g)
	b.n += size
}

// linear declares a Linear layer's weight and bias as prefix.weight and
// prefix.bias.
func (b *builder) linear(prefix string, in, out int) *Linear {
	l := NewLinear(in, out)
	b.param(prefix+".weight", &l.W, &l.DW, out, in)
	b.param(prefix+".bias", &l.B, &l.DB, out)
	return l
}

func (b *builder) bind(params, grads, bufs []float32) {
	for i, s := range b.segs {
		end := s.Offset + s.Len
		*b.views[2*i] = params[s.Offset:end:end] // capped: an append cannot spill into a neighbour
		*b.views[2*i+1] = grads[s.Offset:end:end]
	}
	for i, s := range b.bufSegs {
		end := s.Offset + s.Len
		*b.bufViews[i] = bufs[s.Offset:end:end]
	}
}

// buffer declares a non-trainable tensor (not in the gradient buffer);
// *p is set to its view by bind.
func (b *builder) buffer(name string, p *[]float32, shape ...int) {
	size := 1
	for _, d := range shape {
		size *= d
	}
	b.bufSegs = append(b.bufSegs, Segment{Name: name, Shape: shape, Offset: b.nbuf, Len: size})
	b.bufViews = append(b.bufViews, p)
	b.nbuf += size
}

// onInit queues an initialiser; initAll runs them in declaration order.
func (b *builder) onInit(f func(*rand.Rand)) { b.inits = append(b.inits, f) }

func (b *builder) initAll(r *rand.Rand) {
	for _, f := range b.inits {
		f(r)
	}
}

// arch builds the layers of an architecture, declaring parameters on b,
// and returns them with an initialiser to run once the views are bound.
type arch func(b *builder, opt Options) (layers []Layer, init func(*rand.Rand))

var archs = map[string]arch{
	"logreg": func(b *builder, opt Options) ([]Layer, func(*rand.Rand)) {
		fc := b.linear("fc", opt.Channels*opt.Height*opt.Width, opt.Classes)
		fc.SkipInputGrad = true
		return []Layer{&Flatten{}, fc}, fc.Init
	},
	"mlp": func(b *builder, opt Options) ([]Layer, func(*rand.Rand)) {
		fc1 := b.linear("fc1", opt.Channels*opt.Height*opt.Width, 256)
		fc2 := b.linear("fc2", 256, 128)
		fc3 := b.linear("fc3", 128, opt.Classes)
		fc1.SkipInputGrad = true
		init := func(r *rand.Rand) {
			fc1.Init(r)
			fc2.Init(r)
			fc3.Init(r)
		}
		return []Layer{&Flatten{}, fc1, &ReLU{}, fc2, &ReLU{}, fc3}, init
	},
}

// Names returns the known architecture names, sorted.
func Names() []string {
	names := make([]string, 0, len(archs))
	for n := range archs {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// New builds the named architecture with parameters initialised
// deterministically from opt.Seed (PCG, PyTorch's default init
// distributions), and zero gradients.
func New(name string, opt Options) (*Network, error) {
	a, ok := archs[name]
	if !ok {
		return nil, fmt.Errorf("models: unknown architecture %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	opt = opt.withDefaults()
	if opt.Channels < 0 || opt.Height < 0 || opt.Width < 0 || opt.Classes < 0 {
		return nil, fmt.Errorf("models: negative dimension in %+v", opt)
	}
	var b builder
	b.seed = uint64(opt.Seed)
	layers, init, err := build(a, &b, name, opt)
	if err != nil {
		return nil, err
	}
	n := &Network{
		name:     name,
		opt:      opt,
		layers:   layers,
		params:   make([]float32, b.n),
		grads:    make([]float32, b.n),
		segs:     b.segs,
		bufs:     make([]float32, b.nbuf),
		bufSegs:  b.bufSegs,
		dropouts: b.dropouts,
		bns:      b.bns,
	}
	b.bind(n.params, n.grads, n.bufs)
	init(rand.New(rand.NewPCG(uint64(opt.Seed), 0)))
	return n, nil
}

// Name returns the architecture name the network was built with.
func (n *Network) Name() string { return n.name }

// Options returns the options with defaults filled in.
func (n *Network) Options() Options { return n.opt }

// NumParams is the length of Params and Grads.
func (n *Network) NumParams() int { return len(n.params) }

// Params returns the flat parameter buffer. It is owned by the network and
// the layers read it directly: writes by the caller (optimiser steps,
// broadcasts, checkpoint loads) are seen by the next Forward.
func (n *Network) Params() []float32 { return n.params }

// Grads returns the flat gradient buffer, same length and layout as
// Params. Backward accumulates into it; the caller clears it (ZeroGrad)
// and may read, reduce or overwrite it between Backward and the optimiser.
func (n *Network) Grads() []float32 { return n.grads }

// Segments lists the named parameter views in buffer order. The caller
// must not modify the returned slice's elements.
func (n *Network) Segments() []Segment { return n.segs }

// Buffers returns the flat buffer of non-trainable state, such as batch
// norm's running statistics (empty for networks without any). Like
// Params it is owned by the network and live: Forward in training mode
// updates it, and writes by the caller (checkpoint loads, broadcasts) are
// seen by the next Forward. It is not part of Grads.
func (n *Network) Buffers() []float32 { return n.bufs }

// BufferSegments names the views of Buffers with their PyTorch names
// (bn1.running_mean, …) and shapes, in buffer order. The caller must not
// modify the returned slice's elements.
func (n *Network) BufferSegments() []Segment { return n.bufSegs }

// ZeroGrad sets every gradient to 0.
func (n *Network) ZeroGrad() { clear(n.grads) }

// InputSize is the number of values per sample: Channels·Height·Width.
func (n *Network) InputSize() int { return n.opt.Channels * n.opt.Height * n.opt.Width }

// Forward runs the network on x, a (batch, C, H, W) row-major batch, and
// returns the logits (batch, Classes). x is borrowed until Backward; the
// logits are owned by the network and valid until the next Forward.
// train selects training behaviour for layers that have it (dropout,
// batch norm).
func (n *Network) Forward(x []float32, batch int, train bool) []float32 {
	if batch < 1 || len(x) != batch*n.InputSize() {
		panic(fmt.Sprintf("models: %s.Forward: len(x)=%d, want batch %d × %d×%d×%d",
			n.name, len(x), batch, n.opt.Channels, n.opt.Height, n.opt.Width))
	}
	if n.part != nil {
		panic(fmt.Sprintf("models: %s.Forward on a network that holds stage %d alone (use ForwardStage)", n.name, n.part.index))
	}
	n.batch, n.lastInput = batch, x
	if n.reps != nil {
		return n.forwardSplit(x, batch, train)
	}
	if n.forwardHook != nil && n.ck == nil {
		for i, l := range n.layers {
			n.forwardHook(i, false)
			x = l.Forward(x, batch, train)
			n.forwardHook(i, true)
		}
		return x
	}
	return forwardLayers(n.layers, n.ck, x, batch, train)
}

// SetForwardHook makes Forward call hook(i, false) before and hook(i, true)
// after layer i (LayerKinds names it) whenever the network runs its
// layers one after the other on the caller's goroutine — one thread, no
// activation checkpointing; otherwise it is not called. It computes
// nothing: a tracer reads its clock there. nil removes it.
func (n *Network) SetForwardHook(hook func(layer int, done bool)) { n.forwardHook = hook }

// LayerKinds returns each layer's kind (its Go type: Conv2D, ReLU, …) in
// Forward's order, for SetForwardHook's indices.
func (n *Network) LayerKinds() []string {
	kinds := make([]string, len(n.layers))
	for i, l := range n.layers {
		kinds[i] = strings.TrimPrefix(fmt.Sprintf("%T", l), "*models.")
	}
	return kinds
}

// forwardLayers runs layers on x, through ck when checkpointing.
func forwardLayers(layers []Layer, ck *stackCk, x []float32, batch int, train bool) []float32 {
	if ck != nil {
		return ck.forward(x, batch, train)
	}
	for _, l := range layers {
		x = l.Forward(x, batch, train)
	}
	return x
}

// backwardLayers back-propagates d through layers last to first (through
// ck when checkpointing), calling done(i) (if set) once layer i's
// gradients are final; a layer that returns nil (no input gradient) ends it.
func backwardLayers(layers []Layer, ck *stackCk, d []float32, done func(i int)) {
	if ck != nil {
		ck.backward(d, done)
		return
	}
	for i := len(layers) - 1; i >= 0; i-- {
		d = layers[i].Backward(d)
		if d == nil {
			return
		}
		if done != nil {
			done(i)
		}
	}
}

// Backward back-propagates dlogits (batch, Classes) through the last
// Forward's batch, adding (+=) every parameter gradient into Grads, last
// layer first. dlogits is borrowed for the duration of the call.
func (n *Network) Backward(dlogits []float32) {
	if n.reps != nil {
		n.checkDlogits(dlogits)
		n.backwardSplit(dlogits, nil)
		return
	}
	n.backward(dlogits, nil)
}

func (n *Network) checkDlogits(dlogits []float32) {
	if n.batch == 0 || len(dlogits) != n.batch*n.opt.Classes {
		panic(fmt.Sprintf("models: %s.Backward: len(dlogits)=%d, want batch %d × %d classes (after Forward)",
			n.name, len(dlogits), n.batch, n.opt.Classes))
	}
}

// backward runs the layers last to first; after each it calls done(i)
// (if set) when layer i's gradients are final, and done(-1) at the end.
func (n *Network) backward(dlogits []float32, done func(i int)) {
	n.checkDlogits(dlogits)
	backwardLayers(n.layers, n.ck, dlogits, done)
	if done != nil {
		done(-1)
	}
}

// SetDropoutStream makes every dropout layer draw its next masks from
// stream (and the layer's own seed) instead of continuing where its last
// training Forward left off. Callers that train one network for several
// independent tasks (federated clients) use it so that each task's masks
// depend only on the task, not on what ran before it on this network.
func (n *Network) SetDropoutStream(stream uint64) {
	for _, d := range n.dropouts {
		d.calls = stream << 32
	}
	for _, r := range n.reps {
		for _, d := range r.dropouts {
			d.calls = stream << 32
		}
	}
}

// SetDropoutCalls makes every dropout layer draw its next masks as after
// calls training Forwards: a job resumed after s steps of k forward passes
// sets s·k, so that its masks are those of a run that never stopped.
func (n *Network) SetDropoutCalls(calls uint64) {
	for _, d := range n.dropouts {
		d.calls = calls
	}
	for _, r := range n.reps {
		for _, d := range r.dropouts {
			d.calls = calls
		}
	}
}

// rewindDropout makes every dropout layer draw its next masks as on the
// first training step again (tests use it to hold masks fixed).
func (n *Network) rewindDropout() {
	for _, d := range n.dropouts {
		d.calls = 0
	}
	for _, r := range n.reps {
		for _, d := range r.dropouts {
			d.calls = 0
		}
	}
}
