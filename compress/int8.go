package compress

import (
	"context"
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
	if cfg.ChunkSize == 0 {
		cfg.ChunkSize = DefaultInt8Chunk
	}
	if cfg.ChunkSize < 0 || cfg.ChunkSize%4 != 0 {
		return nil, fmt.Errorf("compress: int8 chunk size %d: want a positive multiple of 4", cfg.ChunkSize)
	}
	if cfg.StartIter < 0 {
		return nil, fmt.Errorf("compress: int8 start_iter %d: want ≥ 0", cfg.StartIter)
	}
	total, err := checkSegments(segs)
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
	rng := rand.NewPCG(uint64(q.cfg.Seed), uint64(q.ring.Rank())<<48^uint64(step))
	quantize(q.msg, grads, q.cfg.ChunkSize, rng)
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

// quantize encodes x into msg: one scale per chunk of size elements, then
// the quantised values, four int8 (two's complement) per word, element
// 4w+j in byte j of word w. Rounding up happens with probability equal to
// the fractional part, drawn at 32-bit resolution from rng.
func quantize(msg, x []float32, size int, rng *rand.PCG) {
	nchunks := (len(x) + size - 1) / size
	scales, words := msg[:nchunks], msg[nchunks:]
	var bits uint64 // random bits not used yet; nbits of them
	nbits := 0
	for c := range nchunks {
		chunk := x[c*size : min((c+1)*size, len(x))]
		var s float32
		for _, v := range chunk {
			s = max(s, abs32(v))
		}
		scales[c] = s
		var inv float32
		if s > 0 && !math.IsInf(float64(s), 0) {
			inv = float32(int8Levels / float64(s))
		}
		w := words[c*size/4:]
		for i := 0; i < len(chunk); i += 4 {
			var word uint32
			for j := range min(4, len(chunk)-i) {
				v := chunk[i+j]
				y := abs32(v) * inv
				l := int32(y) // y ≥ 0: truncation is the floor
				if nbits == 0 {
					bits, nbits = rng.Uint64(), 64
				}
				u := uint32(bits)
				bits >>= 32
				nbits -= 32
				if float64(u) < float64(y-float32(l))*0x1p32 {
					l++
				}
				l = min(l, int8Levels) // y can exceed 127 by a rounding error
				b := int8(l)
				if v < 0 {
					b = -b
				}
				word |= uint32(uint8(b)) << (8 * j)
			}
			w[i/4] = math.Float32frombits(word)
		}
	}
}

// dequantizeAdd adds the values encoded in msg to dst.
func dequantizeAdd(dst, msg []float32, size int) {
	nchunks := (len(dst) + size - 1) / size
	scales, words := msg[:nchunks], msg[nchunks:]
	for c := range nchunks {
		chunk := dst[c*size : min((c+1)*size, len(dst))]
		f := scales[c] / int8Levels
		w := words[c*size/4:]
		for i := range chunk {
			b := int8(math.Float32bits(w[i/4]) >> (8 * (i % 4)))
			chunk[i] += float32(b) * f
		}
	}
}

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }

// State implements Stateful: Int8 has none (its randomness is a function of
// the seed, rank and step).
func (q *Int8) State() map[string]models.Tensor { return map[string]models.Tensor{} }

// SetState implements Stateful: only an empty state is accepted.
func (q *Int8) SetState(st map[string]models.Tensor) error { return checkStateNames(st, nil) }
