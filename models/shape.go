package models

import (
	"fmt"
	"math/rand/v2"

	"github.com/gradsync/gradsync/internal/kernels"
)

// Inputs too small for an architecture. An architecture's layers are
// sized from the previous layer's output, so a shape that cannot work
// shows up as a window (kernel, pool, patch) larger than what reaches it.
// The builder's helpers check each window as it is declared and, when it
// does not fit, stop the build with a tooSmall panic, which New turns
// into an error (as encoding/gob and text/template do with their own
// error values): the layer constructors' own panics stay for programming
// bugs.

// tooSmall is the panic value of a build stopped by a window that does
// not fit.
type tooSmall struct{ why string }

// tooSmall stops the build: why says what does not fit.
func (b *builder) tooSmall(why string) { panic(tooSmall{why}) }

// fits stops the build unless the k×k window of the convolution named
// name fits its padded input.
func (b *builder) fits(name string, g kernels.ConvGeom) {
	if g.H+2*g.PadH < g.KH || g.W+2*g.PadW < g.KW {
		pad := ""
		if g.PadH > 0 || g.PadW > 0 {
			pad = fmt.Sprintf(" (padded by %d×%d)", g.PadH, g.PadW)
		}
		b.tooSmall(fmt.Sprintf("layer %q, a %d×%d convolution, gets %d×%d planes%s, smaller than its kernel",
			name, g.KH, g.KW, g.H, g.W, pad))
	}
}

// maxPool returns a MaxPool2D, stopping the build unless its window fits
// its input; name is the pool's module name.
func (b *builder) maxPool(name string, g PoolGeom) *MaxPool2D {
	if g.H < g.K || g.W < g.K {
		b.tooSmall(fmt.Sprintf("layer %q, a %d×%d max pool, gets %d×%d planes", name, g.K, g.K, g.H, g.W))
	}
	return NewMaxPool2D(g)
}

// build runs arch a on b, returning an error for inputs a cannot take.
func build(a arch, b *builder, name string, opt Options) (layers []Layer, init func(*rand.Rand), err error) {
	defer func() {
		if r := recover(); r != nil {
			ts, ok := r.(tooSmall)
			if !ok {
				panic(r)
			}
			err = fmt.Errorf("models: %s cannot take %d×%d×%d inputs: %s%s", name, opt.Channels, opt.Height, opt.Width, ts.why, smallestHint(a, opt))
		}
	}()
	layers, init = a(b, opt)
	return layers, init, nil
}

// smallestHint names the smallest square input a takes with opt's
// channels and classes (searched up to 1024×1024), for the error message.
func smallestHint(a arch, opt Options) string {
	ok := func(s int) (fits bool) {
		defer func() {
			if r := recover(); r != nil {
				if _, small := r.(tooSmall); !small {
					panic(r)
				}
				fits = false
			}
		}()
		o := opt
		o.Height, o.Width = s, s
		a(&builder{}, o)
		return true
	}
	lo, hi := 1, 1024 // the answer is in [lo, hi] when hi fits
	if !ok(hi) {
		return ""
	}
	for lo < hi {
		if m := (lo + hi) / 2; ok(m) {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return fmt.Sprintf("; the smallest square input it takes is %d×%d", lo, lo)
}
