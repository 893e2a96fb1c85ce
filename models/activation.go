package models

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// GELU is torch.nn.GELU() (the exact erf form): y = x·Φ(x) with Φ the
// standard normal CDF, elementwise over any shape.
type GELU struct {
	x     []float32 // borrowed input of the last Forward
	y, dx []float32 // owned
}

// Forward returns x·Φ(x).
func (l *GELU) Forward(x []float32, batch int, train bool) []float32 {
	if batch < 1 || len(x)%batch != 0 {
		panic(fmt.Sprintf("models: GELU.Forward: len(x)=%d is not a multiple of batch %d", len(x), batch))
	}
	l.x = x
	l.y = grow(l.y, len(x))
	for i, v := range x {
		f := float64(v)
		l.y[i] = float32(0.5 * f * (1 + math.Erf(f/math.Sqrt2)))
	}
	return l.y
}

// Backward returns dy·(Φ(x) + x·φ(x)).
func (l *GELU) Backward(dy []float32) []float32 {
	if len(dy) != len(l.x) || l.x == nil {
		panic(fmt.Sprintf("models: GELU.Backward: len(dy)=%d, want %d (after Forward)", len(dy), len(l.x)))
	}
	l.dx = grow(l.dx, len(dy))
	const invSqrt2Pi = 0.3989422804014327
	for i, v := range l.x {
		f := float64(v)
		cdf := 0.5 * (1 + math.Erf(f/math.Sqrt2))
		pdf := invSqrt2Pi * math.Exp(-0.5*f*f)
		l.dx[i] = float32(float64(dy[i]) * (cdf + f*pdf))
	}
	return l.dx
}

// Dropout is torch.nn.Dropout(P): in training mode each value is zeroed
// with probability P and the survivors are scaled by 1/(1−P); in
// evaluation mode it is the identity. Masks are drawn from a PCG stream
// seeded by (Seed, number of training Forwards so far), so a run is
// reproducible from the network seed and the step count, independent of
// batch history.
type Dropout struct {
	P    float32
	Seed uint64

	calls uint64    // training Forwards so far
	rng   rand.PCG  // reseeded per call
	on    bool      // the last Forward was in training mode with P > 0
	mask  []float32 // owned: 0 or 1/(1−P) per value of the last training Forward
	y, dx []float32 // owned
	n     int
}

// NewDropout returns a dropout layer with drop probability p in [0, 1).
func NewDropout(p float32, seed uint64) *Dropout {
	if !(p >= 0 && p < 1) {
		panic(fmt.Sprintf("models: NewDropout(%v): probability must be in [0, 1)", p))
	}
	return &Dropout{P: p, Seed: seed}
}

// Forward applies a fresh mask in training mode and returns x itself
// (borrowed) in evaluation mode.
func (l *Dropout) Forward(x []float32, batch int, train bool) []float32 {
	if batch < 1 || len(x)%batch != 0 {
		panic(fmt.Sprintf("models: Dropout.Forward: len(x)=%d is not a multiple of batch %d", len(x), batch))
	}
	l.n = len(x)
	l.on = train && l.P > 0
	if !l.on {
		return x
	}
	l.rng.Seed(l.Seed, l.calls)
	l.calls++
	l.mask = grow(l.mask, len(x))
	l.y = grow(l.y, len(x))
	// Each 64-bit draw decides two values from its 32-bit halves.
	thresh := uint64(float64(l.P) * (1 << 32))
	scale := math.Float32bits(1 / (1 - l.P))
	mask, y := l.mask, l.y
	i := 0
	for ; i+2 <= len(x); i += 2 {
		u := l.rng.Uint64()
		mask[i] = keep(u&0xffffffff, thresh, scale)
		mask[i+1] = keep(u>>32, thresh, scale)
	}
	if i < len(x) {
		mask[i] = keep(l.rng.Uint64()&0xffffffff, thresh, scale)
	}
	for i, v := range x {
		y[i] = v * mask[i]
	}
	return y
}

// keep returns the mask value for a 32-bit uniform u: 0 when u < thresh
// (dropped), else the float whose bits are scale. It is branch-free: the
// outcome is random by design, so a branch would mispredict often.
func keep(u, thresh uint64, scale uint32) float32 {
	dropped := (u - thresh) >> 63 // 1 when u < thresh: both are below 2³², so the difference wraps
	return math.Float32frombits(scale & uint32(dropped-1))
}

// Backward returns dy·mask in training mode and dy itself otherwise.
func (l *Dropout) Backward(dy []float32) []float32 {
	if len(dy) != l.n || l.n == 0 {
		panic(fmt.Sprintf("models: Dropout.Backward: len(dy)=%d, want %d (after Forward)", len(dy), l.n))
	}
	if !l.on {
		return dy
	}
	l.dx = grow(l.dx, len(dy))
	for i, v := range dy {
		l.dx[i] = v * l.mask[i]
	}
	return l.dx
}

// Residual is y = Body(x) + Shortcut(x), with Shortcut the identity when
// empty: the skip connection of a residual block. Body and Shortcut are
// stacks of layers run in order on the same input.
type Residual struct {
	Body, Shortcut []Layer

	n     int
	y, dx []float32 // owned
}

// Forward runs both branches and returns their sum.
func (l *Residual) Forward(x []float32, batch int, train bool) []float32 {
	b := x
	for _, s := range l.Body {
		b = s.Forward(b, batch, train)
	}
	sc := x
	for _, s := range l.Shortcut {
		sc = s.Forward(sc, batch, train)
	}
	if len(b) != len(sc) {
		panic(fmt.Sprintf("models: Residual.Forward: body gives %d values, shortcut %d", len(b), len(sc)))
	}
	l.n = len(x)
	l.y = grow(l.y, len(b))
	for i, v := range b {
		l.y[i] = v + sc[i]
	}
	return l.y
}

// Backward sends dy through both branches and returns the sum of their
// input gradients.
func (l *Residual) Backward(dy []float32) []float32 {
	if len(dy) != len(l.y) || l.n == 0 {
		panic(fmt.Sprintf("models: Residual.Backward: len(dy)=%d, want %d (after Forward)", len(dy), len(l.y)))
	}
	db := dy
	for i := len(l.Body) - 1; i >= 0; i-- {
		db = l.Body[i].Backward(db)
	}
	ds := dy
	for i := len(l.Shortcut) - 1; i >= 0; i-- {
		ds = l.Shortcut[i].Backward(ds)
	}
	if len(db) != l.n || len(ds) != l.n {
		panic(fmt.Sprintf("models: Residual.Backward: branch input gradients have %d and %d values, want %d", len(db), len(ds), l.n))
	}
	l.dx = grow(l.dx, l.n)
	for i, v := range db {
		l.dx[i] = v + ds[i]
	}
	return l.dx
}

// Tokenwise applies a per-row layer (such as Linear) to every token of a
// (batch, Tokens, D) input by running it on batch·Tokens rows.
type Tokenwise struct {
	Layer  Layer
	Tokens int
}

// Forward runs Layer on batch·Tokens rows.
func (l *Tokenwise) Forward(x []float32, batch int, train bool) []float32 {
	return l.Layer.Forward(x, batch*l.Tokens, train)
}

// Backward is Layer's Backward.
func (l *Tokenwise) Backward(dy []float32) []float32 { return l.Layer.Backward(dy) }
