package models

// Gradient readiness for overlapping communication with backward (DDP's
// bucket hooks): Backward runs the layers last to first, and once a layer
// is done its parameter gradients are final for the step.

// gradViews appends the gradient views of l (recursively for containers).
func gradViews(dst [][]float32, l Layer) [][]float32 {
	switch l := l.(type) {
	case *Linear:
		return append(dst, l.DW, l.DB)
	case *Conv2D:
		return append(dst, l.DW, l.DB)
	case *DepthwiseConv2D:
		return append(dst, l.DW, l.DB)
	case *SqueezeExcite:
		return append(gradViews(dst, l.FC1), gradViews(nil, l.FC2)...)
	case *MapTokens:
		return append(dst, l.DPos)
	case *ConvMaxPool:
		return gradViews(dst, l.Conv)
	case *BatchNorm2d:
		return append(dst, l.DWeight, l.DBias)
	case *LayerNorm:
		return append(dst, l.DWeight, l.DBias)
	case *SelfAttention:
		return append(gradViews(dst, l.In), gradViews(nil, l.Out)...)
	case *PatchEmbed:
		return append(gradViews(dst, l.Proj), l.DCls, l.DPos)
	case *Tokenwise:
		return gradViews(dst, l.Layer)
	case *Residual:
		for _, b := range l.Body {
			dst = gradViews(dst, b)
		}
		for _, s := range l.Shortcut {
			dst = gradViews(dst, s)
		}
		return dst
	}
	return dst
}

// readyOffsets computes, for each layer i, the lowest flat offset among
// the parameters of layers i…end: once Backward has run layer i, the
// gradient buffer is final from that offset on. It panics if a layer's
// gradient view is not one of the network's segments (a layer type
// gradViews does not know would make overlap unsafe, so it is caught in
// tests of every architecture).
func (n *Network) readyOffsets() []int {
	first := make(map[*float32]int, len(n.segs))
	for _, s := range n.segs {
		if s.Len > 0 {
			first[&n.grads[s.Offset]] = s.Offset
		}
	}
	covered := 0
	out := make([]int, len(n.layers))
	low := len(n.grads)
	for i := len(n.layers) - 1; i >= 0; i-- {
		for _, v := range gradViews(nil, n.layers[i]) {
			if len(v) == 0 {
				continue
			}
			off, ok := first[&v[0]]
			if !ok {
				panic("models: " + n.name + ": a layer's gradient view is not a parameter segment")
			}
			covered += len(v)
			low = min(low, off)
		}
		out[i] = low
	}
	if covered != len(n.grads) {
		panic("models: " + n.name + ": the layers' gradient views do not cover the gradient buffer")
	}
	return out
}

// BackwardNotify is Backward that calls ready(from) whenever more of the
// gradient buffer is final: grads[from:] will not change again in this
// call. from only decreases, and the last call has from = 0. ready runs
// on the caller's goroutine between layers and must be quick (hand off
// to another goroutine). A nil ready is plain Backward.
func (n *Network) BackwardNotify(dlogits []float32, ready func(from int)) {
	if ready == nil {
		n.Backward(dlogits)
		return
	}
	if n.reps != nil {
		n.checkDlogits(dlogits)
		n.backwardSplit(dlogits, ready)
		return
	}
	if n.ready == nil {
		n.ready = n.readyOffsets()
	}
	n.backward(dlogits, func(i int) {
		if i < 0 {
			ready(0)
			return
		}
		ready(n.ready[i])
	})
}
