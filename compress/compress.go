package compress

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/models"
)

// Reducer reduces one rank's flat gradient over a ring.
type Reducer interface {
	// Reduce replaces grads, this rank's flat gradient, with the average
	// over all ranks (or the compressor's estimate of it), in place. All
	// ranks must call it with the same step and len(grads); on success
	// every rank holds bit-identical grads. step is the training step
	// (≥ 0): it drives start_iter and seeds per-step randomness, and it
	// tags the frames of the collectives Reduce runs.
	Reduce(ctx context.Context, grads []float32, step int64) error
	// Stats returns cumulative byte and time counters. It may be called
	// concurrently with Reduce.
	Stats() Stats
}

// Stateful is implemented by every Reducer of this package: its state
// (error-feedback residuals, warm-start matrices) as named F32 tensors, so
// a checkpoint can carry it (models.WriteSafetensors writes the map as is).
type Stateful interface {
	// State returns a copy of the reducer's state; empty for stateless
	// reducers.
	State() map[string]models.Tensor
	// SetState replaces the state with one returned by State of a reducer
	// built with the same configuration and segments. On error nothing is
	// changed.
	SetState(map[string]models.Tensor) error
	// FlatLen, CopyState and RestoreState give the same state as flat
	// buffers, for snapshots taken at every step without allocating
	// (worker in-memory recovery): FlatLen is the length of the Shared
	// and Own buffers a Flat must have.
	FlatLen() (shared, own int)
	// CopyState copies the state into dst (buffers of FlatLen's lengths).
	CopyState(dst *Flat)
	// RestoreState replaces the shared part with src.Shared (forgotten
	// when src.SharedSet is false) and the own part with src.Own (zero
	// when src.Own is nil). Wrong lengths are an error and change nothing.
	RestoreState(src *Flat) error
}

// Flat is a reducer's state as two flat buffers.
//
// Shared is identical on every rank of a ring (PowerSGD's warm-start Q
// matrices, concatenated), so any rank's copy serves all: a checkpoint
// stores it once and a new rank may take it from another. SharedSet is
// false while there is none (before PowerSGD's first compressed step).
//
// Own belongs to this rank: error-feedback residuals (PowerSGD's
// per-matrix errors, top-k's residual), the part of this rank's past
// gradients not yet sent. It cannot be rebuilt from other ranks.
type Flat struct {
	Shared    []float32
	SharedSet bool
	Own       []float32
}

// SharedStateName reports whether a State tensor name is part of the
// shared state (identical on every rank) rather than the rank's own.
func SharedStateName(name string) bool { return strings.HasPrefix(name, "powersgd.q.") }

// restoreFlat checks src against the lengths (shared, own) and copies it
// into shared and own; it reports whether the shared part is set.
func restoreFlat(src *Flat, shared, own []float32) (bool, error) {
	if src.SharedSet && len(src.Shared) != len(shared) {
		return false, fmt.Errorf("compress: RestoreState: %d shared values, want %d", len(src.Shared), len(shared))
	}
	if src.Own != nil && len(src.Own) != len(own) {
		return false, fmt.Errorf("compress: RestoreState: %d own values, want %d", len(src.Own), len(own))
	}
	if src.SharedSet {
		copy(shared, src.Shared)
	}
	if src.Own != nil {
		copy(own, src.Own)
	} else {
		clear(own)
	}
	return src.SharedSet, nil
}

// stateless implements the flat half of Stateful for reducers without
// state.
type stateless struct{}

func (stateless) FlatLen() (int, int) { return 0, 0 }
func (stateless) CopyState(*Flat)     {}
func (stateless) RestoreState(src *Flat) error {
	if len(src.Shared) != 0 || len(src.Own) != 0 {
		return errors.New("compress: RestoreState: this reducer has no state")
	}
	return nil
}

// Stats are cumulative counters over the successful Reduce calls.
type Stats struct {
	// Steps counts successful Reduce calls.
	Steps int64
	// RawBytes is what the uncompressed float32 gradient weighs: 4 bytes per
	// element per call.
	RawBytes int64
	// SentBytes is the size of the message this rank contributed: the
	// encoded payload (PowerSGD's P and Q plus the uncompressed tensors;
	// top-k's index/value pairs; int8's packed bytes and scales; fp16/bf16
	// halves), or RawBytes for the plain all-reduce. RawBytes/SentBytes is
	// the compression ratio, independent of the world size.
	SentBytes int64
	// WireBytes counts the payload bytes this rank actually handed to the
	// ring (Ring.SendRight), frame headers excluded. It depends on the world
	// size and on the collective: a ring all-reduce of L bytes sends about
	// 2(n−1)/n·L, an all-gather of an L-byte message (n−1)·L; 0 when n = 1.
	WireBytes int64
	// CompressSeconds is the wall time Reduce spent outside collectives:
	// encoding, decoding, error feedback, orthogonalisation, averaging.
	CompressSeconds float64
}

// Ratio is RawBytes/SentBytes (0 when nothing was sent).
func (s Stats) Ratio() float64 {
	if s.SentBytes == 0 {
		return 0
	}
	return float64(s.RawBytes) / float64(s.SentBytes)
}

// countingRing counts the payload bytes handed to SendRight.
type countingRing struct {
	aggregator.Ring
	sent *atomic.Int64
}

func (c countingRing) SendRight(ctx context.Context, f aggregator.Frame) error {
	c.sent.Add(4 * int64(len(f.Data)))
	return c.Ring.SendRight(ctx, f)
}

// tagBits is how many low bits of a frame's Step number the collectives of
// one Reduce call: the k-th collective of the call at training step s is
// tagged s<<tagBits | k.
const tagBits = 20

// tagger hands out the frame Step tags of one Reduce call.
type tagger struct{ base, k int64 }

func newTagger(step int64) (*tagger, error) {
	if step < 0 || step >= 1<<(63-tagBits) {
		return nil, fmt.Errorf("compress: step %d out of range [0, 2^%d)", step, 63-tagBits)
	}
	return &tagger{base: step << tagBits}, nil
}

func (t *tagger) next() int64 {
	if t.k >= 1<<tagBits {
		panic("compress: more than 2^20 collectives in one Reduce call")
	}
	t.k++
	return t.base | (t.k - 1)
}

// base holds what every reducer shares: the (counting) ring, the options
// of its collectives, and the counters.
type base struct {
	ring aggregator.Ring // a countingRing
	opts aggregator.Options
	n    int     // world size
	inv  float32 // 1/n, the factor that turns sums into averages
	wire *atomic.Int64

	mu    sync.Mutex // guards stats
	stats Stats
}

func newBase(ring aggregator.Ring, opts aggregator.Options) *base {
	w := new(atomic.Int64)
	return &base{
		ring: countingRing{ring, w},
		opts: opts,
		n:    ring.Size(),
		inv:  1 / float32(ring.Size()),
		wire: w,
	}
}

// Stats implements Reducer.
func (b *base) Stats() Stats {
	b.mu.Lock()
	s := b.stats
	b.mu.Unlock()
	s.WireBytes = b.wire.Load()
	return s
}

// call times one Reduce call: the time inside collectives is subtracted
// from the wall time to give CompressSeconds.
type call struct {
	b     *base
	tags  *tagger
	start time.Time
	comm  time.Duration
}

func (b *base) begin(grads []float32, total int, step int64) (*call, error) {
	if len(grads) != total {
		panic(fmt.Sprintf("compress: Reduce: len(grads) = %d, the segments cover %d", len(grads), total))
	}
	t, err := newTagger(step)
	if err != nil {
		return nil, err
	}
	return &call{b: b, tags: t, start: time.Now()}, nil
}

func (c *call) allReduce(ctx context.Context, buf []float32) error {
	t0 := time.Now()
	err := aggregator.AllReduce(ctx, c.b.ring, buf, c.tags.next(), c.b.opts)
	c.comm += time.Since(t0)
	return err
}

func (c *call) allGather(ctx context.Context, dst, src []float32) error {
	t0 := time.Now()
	err := aggregator.AllGather(ctx, c.b.ring, dst, src, c.tags.next(), c.b.opts)
	c.comm += time.Since(t0)
	return err
}

// done records a successful call that reduced raw bytes by sending a
// message of sent bytes.
func (c *call) done(raw, sent int64) {
	d := time.Since(c.start) - c.comm
	c.b.mu.Lock()
	c.b.stats.Steps++
	c.b.stats.RawBytes += raw
	c.b.stats.SentBytes += sent
	c.b.stats.CompressSeconds += d.Seconds()
	c.b.mu.Unlock()
}

// scale multiplies every element of x by a.
func scale(x []float32, a float32) {
	for i := range x {
		x[i] *= a
	}
}

// checkSegments verifies that segs tile [0, total) in order with lengths
// matching their shapes, and returns total.
func checkSegments(segs []models.Segment) (int, error) {
	total := 0
	for i, s := range segs {
		n := 1
		for _, d := range s.Shape {
			if d < 0 {
				return 0, fmt.Errorf("compress: segment %d (%s): negative dimension in shape %v", i, s.Name, s.Shape)
			}
			n *= d
		}
		if n != s.Len {
			return 0, fmt.Errorf("compress: segment %d (%s): shape %v holds %d elements, Len is %d", i, s.Name, s.Shape, n, s.Len)
		}
		if s.Offset != total {
			return 0, fmt.Errorf("compress: segment %d (%s): offset %d, want %d (segments must tile the buffer in order)", i, s.Name, s.Offset, total)
		}
		total += s.Len
	}
	return total, nil
}

// f32 is a shorthand for an F32 state tensor.
func f32(shape []int, v []float32) models.Tensor { return models.F32Tensor(shape, v) }

// checkStateNames reports names in st that are not in want.
func checkStateNames(st map[string]models.Tensor, want map[string][]int) error {
	for _, name := range slices.Sorted(maps.Keys(st)) {
		shape, ok := want[name]
		if !ok {
			return fmt.Errorf("compress: SetState: unexpected tensor %q", name)
		}
		t := st[name]
		if !slices.Equal(t.Shape, shape) {
			return fmt.Errorf("compress: SetState: %s has shape %v, want %v", name, t.Shape, shape)
		}
		if t.DType != "F32" {
			return fmt.Errorf("compress: SetState: %s is %s, want F32", name, t.DType)
		}
	}
	return nil
}
