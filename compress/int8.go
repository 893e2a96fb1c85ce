package compress

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/models"
)

// Int8Config configures int8 stochastic quantisation. The zero value is
// usable: chunks of 512 elements, compression from step 0.
type Int8Config struct {
	// ChunkSize is how many consecutive elements share one float32 scale.
	// 0 means DefaultInt8Chunk; it must be a multiple of 4.
	ChunkSize int
	// StartIter is the first compressed step; earlier steps use the plain
	// bucketed all-reduce.
	StartIter int64
	// Seed seeds the rounding: rank r at step s draws from a stream that is
	// a pure function of (Seed, r, s).
	Seed int64
}

// DefaultInt8Chunk is the default number of elements per scale (QSGD's
// bucket size).
const DefaultInt8Chunk = 512

// int8Levels is the largest quantised magnitude: a chunk's largest element
// maps to ±127.
const int8Levels = 127

// Int8 is QSGD-style stochastic quantisation with 127 levels per sign and a
// float32 scale (the largest magnitude) per chunk: x becomes
// sign(x)·scale·l/127 with l = ⌊|x|·127/scale⌋ + 1 with probability equal
// to the fractional part, else ⌊|x|·127/scale⌋, which is unbiased. Each
// rank's message (scales, then the int8 values packed four to a float32
// word) is all-gathered and dequantised and summed locally in rank order,
// so every rank ends bit-identical.
type Int8 struct {
	*base
	stateless // no state to snapshot
	cfg       Int8Config
	total     int
	nchunks   int
	plain     *Plain
	msg       []float32 // nchunks scales, then ⌈total/4⌉ packed words
	all       []float32
}

var (
	_ Reducer  = (*Int8)(nil)
	_ Stateful = (*Int8)(nil)
)

// NewInt8 returns an int8 reducer for a gradient laid out as segs; the
// plain all-reduce before cfg.StartIter uses buckets of bucketCapBytes.
func NewInt8(ring aggregator.Ring, opts aggregator.Options, segs []models.Segment, bucketCapBytes int, cfg Int8Config) (*Int8, error) {
	total, err := cfg.resolve(segs)
	if err != nil {
		return nil, err
	}
	b := newBase(ring, opts)
	q := &Int8{base: b, cfg: cfg, total: total, plain: newPlain(b, segs, bucketCapBytes)}
	q.nchunks = (total + cfg.ChunkSize - 1) / cfg.ChunkSize
	q.msg = make([]float32, q.nchunks+(total+3)/4)
	q.all = make([]float32, len(q.msg)*b.n)
	return q, nil
}

// Reduce implements Reducer.
func (q *Int8) Reduce(ctx context.Context, grads []float32, step int64) error {
	c, err := q.begin(grads, q.total, step)
	if err != nil {
		return err
	}
	raw := 4 * int64(len(grads))
	if before, err := c.beforeStart(ctx, q.plain, grads, step, q.cfg.StartIter); before {
		return err
	}
	quantize(q.msg, grads, q.cfg.ChunkSize, NewInt8Rounder(q.cfg.Seed, q.ring.Rank(), step).rng)
	if err := c.allGather(ctx, q.all, q.msg); err != nil {
		return err
	}
	clear(grads)
	m := len(q.msg)
	for r := range q.n {
		dequantizeAdd(grads, q.all[r*m:(r+1)*m], q.cfg.ChunkSize)
	}
	scale(grads, q.inv)
	c.done(raw, 4*int64(len(q.msg)))
	return nil
}

// resolve replaces zero values by the defaults, checks the ranges and
// returns the length of the gradient segs lay out.
func (cfg *Int8Config) resolve(segs []models.Segment) (int, error) {
	if cfg.ChunkSize == 0 {
		cfg.ChunkSize = DefaultInt8Chunk
	}
	if cfg.ChunkSize < 0 || cfg.ChunkSize%4 != 0 {
		return 0, fmt.Errorf("compress: int8 chunk size %d: want a positive multiple of 4", cfg.ChunkSize)
	}
	if cfg.StartIter < 0 {
		return 0, fmt.Errorf("compress: int8 start_iter %d: want ≥ 0", cfg.StartIter)
	}
	return checkSegments(segs)
}

// quantize encodes x into msg: one scale per chunk of size elements, then
// the quantised values, four int8 (two's complement) per word, element
// 4w+j in byte j of word w (QuantizeInt8's bytes, little-endian words).
func quantize(msg, x []float32, size int, rng *rand.PCG) {
	nchunks := (len(x) + size - 1) / size
	scales, words := msg[:nchunks], msg[nchunks:]
	r := Int8Rounder{rng: rng}
	q := make([]byte, size)
	for c := range nchunks {
		chunk := x[c*size : min((c+1)*size, len(x))]
		scales[c] = r.quantizeChunk(q[:len(chunk)], chunk)
		w := words[c*size/4:]
		for i := 0; i < len(chunk); i += 4 {
			var word uint32
			for j := range min(4, len(chunk)-i) {
				word |= uint32(q[i+j]) << (8 * j)
			}
			w[i/4] = math.Float32frombits(word)
		}
	}
}

// Int8Rounder draws the stochastic rounding of int8 quantisation: rank's
// stream at step is a pure function of (seed, rank, step), the same in
// ring and ps mode.
type Int8Rounder struct {
	rng   *rand.PCG
	bits  uint64 // random bits not used yet; nbits of them
	nbits int
}

// NewInt8Rounder returns the rounding stream of rank at step.
func NewInt8Rounder(seed int64, rank int, step int64) *Int8Rounder {
	return &Int8Rounder{rng: rand.NewPCG(uint64(seed), uint64(rank)<<48^uint64(step))}
}

// QuantizeInt8 encodes x as int8 values in q (len(x) bytes, two's
// complement) and one scale per chunk of size elements in scales
// (⌈len(x)/size⌉ of them), continuing r's stream: encoding a tensor in
// pieces that start at multiples of size gives the same values as in one
// go.
func (r *Int8Rounder) QuantizeInt8(q []byte, scales, x []float32, size int) {
	nchunks := (len(x) + size - 1) / size
	for c := range nchunks {
		lo, hi := c*size, min((c+1)*size, len(x))
		scales[c] = r.quantizeChunk(q[lo:hi], x[lo:hi])
	}
}

// quantizeChunk encodes chunk into q (one byte per element) and returns
// its scale, the largest magnitude. Rounding up happens with probability
// equal to the fractional part, drawn at 32-bit resolution.
func (r *Int8Rounder) quantizeChunk(q []byte, chunk []float32) float32 {
	var s float32
	for _, v := range chunk {
		s = max(s, abs32(v))
	}
	var inv float32
	if s > 0 && !math.IsInf(float64(s), 0) {
		inv = float32(int8Levels / float64(s))
	}
	for i, v := range chunk {
		y := abs32(v) * inv
		l := int32(y) // y ≥ 0: truncation is the floor
		if r.nbits == 0 {
			r.bits, r.nbits = r.rng.Uint64(), 64
		}
		u := uint32(r.bits)
		r.bits >>= 32
		r.nbits -= 32
		if float64(u) < float64(y-float32(l))*0x1p32 {
			l++
		}
		l = min(l, int8Levels) // y can exceed 127 by a rounding error
		b := int8(l)
		if v < 0 {
			b = -b
		}
		q[i] = uint8(b)
	}
	return s
}

// int8Value is the value an int8 level b of a chunk with scale stands for.
func int8Value(b int8, scale float32) float32 { return float32(b) * (scale / int8Levels) }

// dequantizeAdd adds the values encoded in msg to dst.
func dequantizeAdd(dst, msg []float32, size int) {
	nchunks := (len(dst) + size - 1) / size
	scales, words := msg[:nchunks], msg[nchunks:]
	for c := range nchunks {
		chunk := dst[c*size : min((c+1)*size, len(dst))]
		w := words[c*size/4:]
		for i := range chunk {
			b := int8(math.Float32bits(w[i/4]) >> (8 * (i % 4)))
			chunk[i] += int8Value(b, scales[c])
		}
	}
}

// DequantizeInt8Add adds the values QuantizeInt8 encoded to dst: q holds
// the int8 levels (len(dst) bytes), scales the chunks' scales as
// little-endian float32 (⌈len(dst)/size⌉ of them), size ≥ 1. Lengths that
// do not match are an error (the input may come from the network).
func DequantizeInt8Add(dst []float32, q, scales []byte, size int) error {
	if size < 1 {
		return fmt.Errorf("compress: int8 chunk size %d: want ≥ 1", size)
	}
	if len(q) != len(dst) {
		return fmt.Errorf("compress: %d int8 values for %d elements", len(q), len(dst))
	}
	if n := (len(dst) + size - 1) / size; len(scales) != 4*n {
		return fmt.Errorf("compress: %d bytes of int8 scales for %d elements in chunks of %d (want %d)", len(scales), len(dst), size, 4*n)
	}
	for c := 0; 4*c < len(scales); c++ {
		s := math.Float32frombits(binary.LittleEndian.Uint32(scales[4*c:]))
		lo, hi := c*size, min((c+1)*size, len(dst))
		for i, b := range q[lo:hi] {
			dst[lo+i] += int8Value(int8(b), s)
		}
	}
	return nil
}

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }

// State implements Stateful: Int8 has none (its randomness is a function of
// the seed, rank and step).
func (q *Int8) State() map[string]models.Tensor { return map[string]models.Tensor{} }

// SetState implements Stateful: only an empty state is accepted.
func (q *Int8) SetState(st map[string]models.Tensor) error { return checkStateNames(st, nil) }
