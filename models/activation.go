package models

import (
	"fmt"
	"math"
	"math/bits"
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
// evaluation mode it is the identity. Masks are drawn from a wyrand
// stream (a 64-bit counter through a 64×64→128-bit multiply, hi ⊕ lo)
// started from (Seed, number of training Forwards so far), so a run is
// reproducible from the network seed and the step count, independent of
// batch history. Each 64-bit draw decides two values from its 32-bit
// halves (a value is dropped when its half is below P·2³²: 32 bits of
// resolution in P), and the mask is kept as one bit per value.
type Dropout struct {
	P    float32
	Seed uint64

	calls uint64    // training Forwards so far
	first int       // the first sample of Forward's x in the whole batch (a thread's slice: SetThreads)
	on    bool      // the last Forward was in training mode with P > 0
	bits  []uint64  // owned: bit i%64 of word i/64 set when value i of the last training Forward was kept
	tbl   dropTable // the multipliers for P, set by each training Forward
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

// wyrand's increment and multiplier constants.
const (
	wyP0 = 0xa0761d6478bd642f
	wyP1 = 0xe7037ed1a0b428db
)

// splitmix64 is SplitMix64's output function: a bijective 64-bit mix.
func splitmix64(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// dropoutState is the wyrand counter that starts the mask stream of
// training Forward number calls of a layer seeded with seed.
func dropoutState(seed, calls uint64) uint64 {
	return splitmix64(seed ^ splitmix64(calls+0x9e3779b97f4a7c15))
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
	s := dropoutState(l.Seed, l.calls)
	l.calls++
	words := (len(x) + 63) / 64
	if cap(l.bits) < words {
		l.bits = make([]uint64, words)
	}
	l.bits = l.bits[:words]
	l.y = grow(l.y, len(x))
	thresh := uint64(float64(l.P) * (1 << 32))
	l.tbl.set(1 / (1 - l.P))
	if l.first != 0 {
		l.dropSlice(x, s, thresh, l.first*(len(x)/batch))
		return l.y
	}
	full := len(x) / 64
	for w := range full {
		l.bits[w] = dropWord((*[64]float32)(l.y[w*64:]), (*[64]float32)(x[w*64:]), &s, thresh, &l.tbl)
	}
	if full < words {
		// the tail: through a zero-padded word, so that the draws are
		// those of a full word
		var xt, yt [64]float32
		n := copy(xt[:], x[full*64:])
		l.bits[full] = dropWord(&yt, &xt, &s, thresh, &l.tbl) & (1<<n - 1)
		copy(l.y[full*64:], yt[:n])
	}
	return l.y
}

// dropWord draws the mask of 64 values from the wyrand counter *s (two
// values per draw, from its low then high 32-bit half: a value is kept
// when its half is ≥ thresh), sets y = x·(0 or the scale) and returns the
// mask, bit j set when value j was kept.
func dropWord(y, x *[64]float32, s *uint64, thresh uint64, t *dropTable) uint64 {
	var m uint64
	st := *s
	tm := thresh - 1 // (tm − h)>>63 is 1 when h ≥ thresh, for h < 2³² (tm wraps when thresh is 0)
	for range 16 {
		st += wyP0
		hi, lo := bits.Mul64(st, st^wyP1)
		u := hi ^ lo
		st += wyP0
		hi, lo = bits.Mul64(st, st^wyP1)
		v := hi ^ lo
		k := (tm-u&0xffffffff)>>63 | (tm-u>>32)>>63<<1 | (tm-v&0xffffffff)>>63<<2 | (tm-v>>32)>>63<<3
		m = m>>4 | k<<60 // after 16 rounds, the first draw's bits are bits 0 and 1
	}
	*s = st
	undropWord(y, x, m, t)
	return m
}

// maskWord is dropWord's mask alone: the next 64 values' mask from the
// wyrand counter *s, with tm = thresh − 1.
func maskWord(s *uint64, tm uint64) uint64 {
	var m uint64
	st := *s
	for range 16 {
		st += wyP0
		hi, lo := bits.Mul64(st, st^wyP1)
		u := hi ^ lo
		st += wyP0
		hi, lo = bits.Mul64(st, st^wyP1)
		v := hi ^ lo
		k := (tm-u&0xffffffff)>>63 | (tm-u>>32)>>63<<1 | (tm-v&0xffffffff)>>63<<2 | (tm-v>>32)>>63<<3
		m = m>>4 | k<<60
	}
	*s = st
	return m
}

// dropSlice is Forward's masking for x, a slice of a batch that starts
// at value off of the whole batch (one thread's share, SetThreads): it
// applies the masks the whole batch would have drawn for these values,
// so that a sample's mask does not depend on the thread count. The
// counter jumps straight to the whole batch's word off/64 (32 draws per
// word), and each of x's words is cut from two of the batch's words
// when off is not a multiple of 64.
func (l *Dropout) dropSlice(x []float32, s, thresh uint64, off int) {
	tm := thresh - 1
	st := s + uint64(off/64)*32*wyP0
	sh := uint(off % 64)
	cur := maskWord(&st, tm)
	next := func() uint64 {
		if sh == 0 {
			m := cur
			cur = maskWord(&st, tm)
			return m
		}
		nx := maskWord(&st, tm)
		m := cur>>sh | nx<<(64-sh)
		cur = nx
		return m
	}
	full := len(x) / 64
	for w := range full {
		m := next()
		l.bits[w] = m
		undropWord((*[64]float32)(l.y[w*64:]), (*[64]float32)(x[w*64:]), m, &l.tbl)
	}
	if full < len(l.bits) {
		var xt, yt [64]float32
		n := copy(xt[:], x[full*64:])
		m := next() & (1<<n - 1)
		l.bits[full] = m
		undropWord(&yt, &xt, m, &l.tbl)
		copy(l.y[full*64:], yt[:n])
	}
}

// dropTable holds, for each 4-bit mask, the four multipliers it stands
// for: 0 or the scale.
type dropTable [16][4]float32

// set fills the table for the given scale.
func (t *dropTable) set(scale float32) {
	for m := range t {
		for j := range 4 {
			t[m][j] = 0
			if m>>j&1 != 0 {
				t[m][j] = scale
			}
		}
	}
}

// undropWord sets dx = dy·(0 or the scale) over 64 values as mask bit j
// says, four values per table row (Forward uses it for y = x·mask too).
func undropWord(dx, dy *[64]float32, m uint64, t *dropTable) {
	for j := 0; j < 64; j += 4 {
		r := &t[m&15]
		dx[j] = dy[j] * r[0]
		dx[j+1] = dy[j+1] * r[1]
		dx[j+2] = dy[j+2] * r[2]
		dx[j+3] = dy[j+3] * r[3]
		m >>= 4
	}
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
	full := len(dy) / 64
	for w, m := range l.bits[:full] {
		undropWord((*[64]float32)(l.dx[w*64:]), (*[64]float32)(dy[w*64:]), m, &l.tbl)
	}
	if full < len(l.bits) {
		var dt, xt [64]float32
		n := copy(dt[:], dy[full*64:])
		undropWord(&xt, &dt, l.bits[full], &l.tbl)
		copy(l.dx[full*64:], xt[:n])
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
