package compress

import (
	"context"
	"fmt"
	"math"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/models"
)

// Format is a 16-bit floating-point format for Cast.
type Format uint8

// The formats Cast can send.
const (
	// FP16 is IEEE 754 binary16: 5 exponent bits, 10 fraction bits; values
	// above 65504 (after rounding) become ±Inf.
	FP16 Format = iota + 1
	// BF16 is bfloat16: float32's 8 exponent bits, 7 fraction bits.
	BF16
)

func (f Format) String() string {
	switch f {
	case FP16:
		return "fp16"
	case BF16:
		return "bf16"
	}
	return fmt.Sprintf("format(%d)", uint8(f))
}

// CastConfig configures Cast. The zero value casts from step 0.
type CastConfig struct {
	// StartIter is the first compressed step; earlier steps use the plain
	// bucketed all-reduce.
	StartIter int64
}

// Cast rounds each rank's gradient to a 16-bit format (round to nearest,
// ties to even), all-gathers the halves (two per float32 word, element 2w
// in the low half of word w), and sums them in float32 in rank order, then
// divides by n. Unlike PyTorch's fp16_compress_hook, which sums in fp16,
// only the rounding of each rank's contribution is lost.
type Cast struct {
	*base
	stateless // no state to snapshot
	format    Format
	cfg       CastConfig
	total     int
	plain     *Plain
	msg       []float32
	all       []float32
}

var (
	_ Reducer  = (*Cast)(nil)
	_ Stateful = (*Cast)(nil)
)

// NewCast returns a 16-bit casting reducer for a gradient laid out as segs;
// the plain all-reduce before cfg.StartIter uses buckets of bucketCapBytes.
func NewCast(ring aggregator.Ring, opts aggregator.Options, segs []models.Segment, bucketCapBytes int, format Format, cfg CastConfig) (*Cast, error) {
	if format != FP16 && format != BF16 {
		return nil, fmt.Errorf("compress: unknown cast format %v", format)
	}
	if cfg.StartIter < 0 {
		return nil, fmt.Errorf("compress: %v start_iter %d: want ≥ 0", format, cfg.StartIter)
	}
	total, err := checkSegments(segs)
	if err != nil {
		return nil, err
	}
	b := newBase(ring, opts)
	c := &Cast{base: b, format: format, cfg: cfg, total: total, plain: newPlain(b, segs, bucketCapBytes)}
	c.msg = make([]float32, (total+1)/2)
	c.all = make([]float32, len(c.msg)*b.n)
	return c, nil
}

// Reduce implements Reducer.
func (c *Cast) Reduce(ctx context.Context, grads []float32, step int64) error {
	cl, err := c.begin(grads, c.total, step)
	if err != nil {
		return err
	}
	raw := 4 * int64(len(grads))
	if before, err := cl.beforeStart(ctx, c.plain, grads, step, c.cfg.StartIter); before {
		return err
	}
	// The loops are written out per format so that the conversions inline.
	if c.format == FP16 {
		for w := range c.msg {
			lo, hi := uint32(F32ToF16(grads[2*w])), uint32(0)
			if 2*w+1 < len(grads) {
				hi = uint32(F32ToF16(grads[2*w+1]))
			}
			c.msg[w] = math.Float32frombits(lo | hi<<16)
		}
	} else {
		for w := range c.msg {
			lo, hi := uint32(F32ToBF16(grads[2*w])), uint32(0)
			if 2*w+1 < len(grads) {
				hi = uint32(F32ToBF16(grads[2*w+1]))
			}
			c.msg[w] = math.Float32frombits(lo | hi<<16)
		}
	}
	if err := cl.allGather(ctx, c.all, c.msg); err != nil {
		return err
	}
	clear(grads)
	m := len(c.msg)
	for r := range c.n {
		words := c.all[r*m : (r+1)*m]
		even := len(grads) &^ 1
		if c.format == FP16 {
			for w, x := range words[:even/2] {
				u := math.Float32bits(x)
				grads[2*w] += F16ToF32(uint16(u))
				grads[2*w+1] += F16ToF32(uint16(u >> 16))
			}
			if even < len(grads) {
				grads[even] += F16ToF32(uint16(math.Float32bits(words[even/2])))
			}
		} else {
			for w, x := range words[:even/2] {
				u := math.Float32bits(x)
				grads[2*w] += BF16ToF32(uint16(u))
				grads[2*w+1] += BF16ToF32(uint16(u >> 16))
			}
			if even < len(grads) {
				grads[even] += BF16ToF32(uint16(math.Float32bits(words[even/2])))
			}
		}
	}
	scale(grads, c.inv)
	cl.done(raw, 4*int64(len(c.msg)))
	return nil
}

// F32ToF16 rounds f to the nearest IEEE binary16 value, ties to even;
// overflow gives ±Inf, NaN stays NaN (quiet).
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b >> 23 & 0xff)
	mant := b & 0x7fffff
	switch {
	case exp == 0xff:
		if mant == 0 {
			return sign | 0x7c00
		}
		return sign | 0x7e00 | uint16(mant>>13)
	case exp == 0: // float32 zero or subnormal: far below fp16's range
		return sign
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// fp16 subnormal: the value in units of 2^-24 is m·2^(exp−126).
		shift := uint(14 - e)
		if shift > 24 {
			return sign
		}
		m := mant | 0x800000
		q := m >> shift
		rem, half := m&(1<<shift-1), uint32(1)<<(shift-1)
		if rem > half || rem == half && q&1 == 1 {
			q++ // may carry into the smallest normal, which is correct
		}
		return sign | uint16(q)
	}
	h := uint32(e)<<10 | mant>>13
	if rem := mant & 0x1fff; rem > 0x1000 || rem == 0x1000 && h&1 == 1 {
		h++ // may carry into the exponent, up to Inf, which is correct
	}
	return sign | uint16(h)
}

// F16ToF32 converts an IEEE binary16 value to float32, exactly.
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	e := uint32(h>>10) & 0x1f
	m := uint32(h & 0x3ff)
	switch {
	case e == 0:
		v := float32(m) * 0x1p-24 // exact: m < 2^10
		return math.Float32frombits(math.Float32bits(v) | sign)
	case e == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | m<<13)
	}
	return math.Float32frombits(sign | (e+112)<<23 | m<<13)
}

// F32ToBF16 rounds f to the nearest bfloat16 value, ties to even; NaN
// stays NaN (quiet).
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b >> 16 & 1)
	return uint16(b >> 16)
}

// BF16ToF32 converts a bfloat16 value to float32, exactly.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// State implements Stateful: Cast has none.
func (c *Cast) State() map[string]models.Tensor { return map[string]models.Tensor{} }

// SetState implements Stateful: only an empty state is accepted.
func (c *Cast) SetState(st map[string]models.Tensor) error { return checkStateNames(st, nil) }
