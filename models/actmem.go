package models

import (
	"reflect"
	"slices"
)

// This file lists each layer type's activation buffers for activation
// checkpointing (actBufs: fields that are resized with grow and written
// before they are read in every use, so that they can be lent out of an
// arena; fwd those that Forward uses, bwd those that only Backward
// does), and measures the activation memory a network holds
// (ActivationBytes). Buffers whose content must outlive one use (batch
// norm's running statistics, Winograd's or ConvSmall's persistent
// scratch) and the byte masks (dropout's bits, max pool's argmax) are
// not listed: they stay with their layer, and ActivationBytes counts them.

func (l *Linear) actBufs() (fwd, bwd []*[]float32)    { return []*[]float32{&l.y}, []*[]float32{&l.dx} }
func (l *ReLU) actBufs() (fwd, bwd []*[]float32)      { return []*[]float32{&l.y}, []*[]float32{&l.dx} }
func (l *GELU) actBufs() (fwd, bwd []*[]float32)      { return []*[]float32{&l.y}, []*[]float32{&l.dx} }
func (l *Dropout) actBufs() (fwd, bwd []*[]float32)   { return []*[]float32{&l.y}, []*[]float32{&l.dx} }
func (l *Residual) actBufs() (fwd, bwd []*[]float32)  { return []*[]float32{&l.y}, []*[]float32{&l.dx} }
func (l *MaxPool2D) actBufs() (fwd, bwd []*[]float32) { return []*[]float32{&l.y}, []*[]float32{&l.dx} }
func (l *AvgPool2D) actBufs() (fwd, bwd []*[]float32) { return []*[]float32{&l.y}, []*[]float32{&l.dx} }
func (l *GlobalAvgPool) actBufs() (fwd, bwd []*[]float32) {
	return []*[]float32{&l.y}, []*[]float32{&l.dx}
}
func (l *ClassToken) actBufs() (fwd, bwd []*[]float32) {
	return []*[]float32{&l.y}, []*[]float32{&l.dx}
}
func (l *BatchNorm2d) actBufs() (fwd, bwd []*[]float32) {
	return []*[]float32{&l.y, &l.xhat, &l.invStd}, []*[]float32{&l.dx}
}
func (l *LayerNorm) actBufs() (fwd, bwd []*[]float32) {
	return []*[]float32{&l.y, &l.xhat, &l.invStd}, []*[]float32{&l.dx}
}
func (l *SelfAttention) actBufs() (fwd, bwd []*[]float32) {
	return []*[]float32{&l.probs, &l.o}, []*[]float32{&l.dqkv, &l.dp}
}
func (l *PatchEmbed) actBufs() (fwd, bwd []*[]float32) {
	return []*[]float32{&l.patches, &l.y}, []*[]float32{&l.demb}
}
func (l *Conv2D) actBufs() (fwd, bwd []*[]float32) {
	return []*[]float32{&l.y, &l.col, &l.wu, &l.wv, &l.wm, &l.wt, &l.gx, &l.gy},
		[]*[]float32{&l.dx, &l.dcol, &l.dmask, &l.dwt, &l.wdu, &l.wvt, &l.wdv}
}

// ActivationBytes is the memory, in bytes, that the network holds for
// activations over all its threads: every buffer its layers keep for
// their outputs, input gradients and scratch (float32 values and byte
// masks alike, found by walking the layers), with checkpointing the
// kept segment outputs and the arenas, and the threads' gathered
// logits. Parameters, gradients, batch-norm statistics and the caller's
// input are not counted. Buffers are kept from step to step and only
// grow, so after a step this is that step's peak; it is what checkpointing
// lowers. It walks every layer: call it between steps, not in them.
func (n *Network) ActivationBytes() int64 {
	var spans []span
	stacks := []struct {
		layers []Layer
		ck     *stackCk
	}{{n.layers, n.ck}}
	for _, r := range n.reps {
		stacks = append(stacks, struct {
			layers []Layer
			ck     *stackCk
		}{r.layers, r.ck})
	}
	for _, s := range stacks {
		spans = appendSpans(spans, reflect.ValueOf(s.layers), map[uintptr]bool{})
		if s.ck != nil {
			for _, a := range []*arena{&s.ck.fwd, &s.ck.bwd[0], &s.ck.bwd[1]} {
				spans = appendSpans(spans, reflect.ValueOf(a.buf), nil)
			}
			for _, sl := range s.ck.slots {
				spans = appendSpans(spans, reflect.ValueOf(sl), nil)
			}
		}
	}
	spans = appendSpans(spans, reflect.ValueOf(n.logits), nil)
	// not activations: the flat buffers (and the replicas' gradients)
	// and the caller's input, which layers borrow
	var not []span
	for _, b := range [][]float32{n.params, n.grads, n.bufs, n.lastInput} {
		not = appendSpans(not, reflect.ValueOf(b), nil)
	}
	for _, r := range n.reps {
		not = appendSpans(not, reflect.ValueOf(r.grads), nil)
	}
	return unionBytes(spans) - overlapBytes(spans, not)
}

// span is the memory [lo, hi) of a slice's backing array up to its
// capacity.
type span struct{ lo, hi uintptr }

// appendSpans appends the spans of every numeric slice reachable from v
// (seen guards against pointer cycles; nil for a plain slice).
func appendSpans(dst []span, v reflect.Value, seen map[uintptr]bool) []span {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() || seen[v.Pointer()] {
			return dst
		}
		seen[v.Pointer()] = true
		return appendSpans(dst, v.Elem(), seen)
	case reflect.Interface:
		if !v.IsNil() {
			return appendSpans(dst, v.Elem(), seen)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			dst = appendSpans(dst, v.Field(i), seen)
		}
	case reflect.Slice:
		if v.Cap() == 0 {
			return dst
		}
		switch e := v.Type().Elem(); e.Kind() {
		case reflect.Float32, reflect.Float64, reflect.Int, reflect.Int32, reflect.Int64,
			reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			lo := v.Pointer()
			return append(dst, span{lo, lo + uintptr(v.Cap())*e.Size()})
		}
		for i := range v.Len() {
			dst = appendSpans(dst, v.Index(i), seen)
		}
	}
	return dst
}

// merge sorts spans and merges the overlapping ones.
func merge(s []span) []span {
	s = slices.Clone(s)
	slices.SortFunc(s, func(a, b span) int {
		switch {
		case a.lo < b.lo:
			return -1
		case a.lo > b.lo:
			return 1
		}
		return 0
	})
	var out []span
	for _, x := range s {
		if len(out) > 0 && x.lo <= out[len(out)-1].hi {
			out[len(out)-1].hi = max(out[len(out)-1].hi, x.hi)
			continue
		}
		out = append(out, x)
	}
	return out
}

// unionBytes is the size of the union of s.
func unionBytes(s []span) int64 {
	var b int64
	for _, x := range merge(s) {
		b += int64(x.hi - x.lo)
	}
	return b
}

// overlapBytes is the size of (∪a) ∩ (∪b).
func overlapBytes(a, b []span) int64 {
	ma, mb := merge(a), merge(b)
	var total int64
	i, j := 0, 0
	for i < len(ma) && j < len(mb) {
		lo, hi := max(ma[i].lo, mb[j].lo), min(ma[i].hi, mb[j].hi)
		if lo < hi {
			total += int64(hi - lo)
		}
		if ma[i].hi < mb[j].hi {
			i++
		} else {
			j++
		}
	}
	return total
}
