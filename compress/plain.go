package compress

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/internal/trace"
	"github.com/gradsync/gradsync/models"
)

// span is a bucket: grads[lo:hi].
type span struct{ lo, hi int }

// bucketize groups parameter segments into buckets of at most capBytes, in
// reverse layer order (the order backward finishes them), as DDP does. A
// segment larger than the cap is a bucket of its own. Empty segments are
// skipped. The result is exactly what the worker's ring mode has always
// used, so Plain reproduces its sums bit for bit (the ring chunks, and so
// the order of the additions, depend on the bucket boundaries).
//
// As in DDP, the first bucket is capped at FirstBucketCapBytes (or capBytes
// if smaller): the last layers' gradients are ready first, and a small
// first bucket lets its all-reduce start early in backward.
func bucketize(segs []models.Segment, capBytes int) []span {
	var out []span
	cur := span{lo: -1}
	for i := len(segs) - 1; i >= 0; i-- {
		s := segs[i]
		if s.Len == 0 {
			continue
		}
		limit := capBytes
		if len(out) == 0 {
			limit = min(capBytes, FirstBucketCapBytes)
		}
		if cur.lo >= 0 && 4*(cur.hi-s.Offset) > limit {
			out = append(out, cur)
			cur = span{lo: -1}
		}
		if cur.lo < 0 {
			cur = span{lo: s.Offset, hi: s.Offset + s.Len}
			continue
		}
		if s.Offset+s.Len != cur.lo {
			panic(fmt.Sprintf("compress: parameter segment %s is not contiguous with the next one", s.Name))
		}
		cur.lo = s.Offset
	}
	if cur.lo >= 0 {
		out = append(out, cur)
	}
	return out
}

// DefaultBucketCapBytes is the bucket size used when NewPlain is given 0
// (DDP's bucket_cap_mb default, 25 MiB).
const DefaultBucketCapBytes = 25 << 20

// FirstBucketCapBytes caps the first bucket (DDP's
// _DEFAULT_FIRST_BUCKET_BYTES, 1 MiB).
const FirstBucketCapBytes = 1 << 20

// Plain is the uncompressed reducer: a ring all-reduce per bucket, then a
// multiplication by 1/n. It is what ring mode did before compression, bit
// for bit, and the fallback every compressor uses before start_iter.
type Plain struct {
	*base
	stateless // no state to snapshot
	total     int
	buckets   []span
	trace     *trace.Recorder // nil: no timeline (SetTrace)
}

// SetTrace makes the reducer record each bucket's all-reduce in r (as
// trace.CatComm spans on trace.TidComm) and, in an overlapped step, the
// moment each bucket's gradients were ready; nil records nothing. It must
// not be called while a step runs.
func (p *Plain) SetTrace(r *trace.Recorder) { p.trace = r }

// allReduceBucket all-reduces bucket i of grads within c, recording it
// when a trace is set.
func (p *Plain) allReduceBucket(ctx context.Context, c *call, grads []float32, i int) error {
	b := p.buckets[i]
	if p.trace == nil {
		return c.allReduce(ctx, grads[b.lo:b.hi])
	}
	start := time.Now()
	err := c.allReduce(ctx, grads[b.lo:b.hi])
	p.trace.Span(fmt.Sprintf("all-reduce bucket %d", i), trace.CatComm, trace.TidComm, start, time.Now(),
		map[string]any{"bytes": 4 * (b.hi - b.lo)})
	return err
}

var (
	_ Reducer  = (*Plain)(nil)
	_ Stateful = (*Plain)(nil)
)

// NewPlain returns the plain reducer for a gradient laid out as segs
// (which must tile the buffer in order, as models.Network.Segments does),
// all-reduced in buckets of at most bucketCapBytes (0: 25 MiB). It panics
// if segs are malformed.
func NewPlain(ring aggregator.Ring, opts aggregator.Options, segs []models.Segment, bucketCapBytes int) *Plain {
	return newPlain(newBase(ring, opts), segs, bucketCapBytes)
}

func newPlain(b *base, segs []models.Segment, capBytes int) *Plain {
	total, err := checkSegments(segs)
	if err != nil {
		panic(err)
	}
	if capBytes <= 0 {
		capBytes = DefaultBucketCapBytes
	}
	return &Plain{base: b, total: total, buckets: bucketize(segs, capBytes)}
}

// Reduce implements Reducer.
func (p *Plain) Reduce(ctx context.Context, grads []float32, step int64) error {
	c, err := p.begin(grads, p.total, step)
	if err != nil {
		return err
	}
	if err := p.reduce(ctx, c, grads); err != nil {
		return err
	}
	c.done(4*int64(len(grads)), 4*int64(len(grads)))
	return nil
}

// reduce averages grads over the ranks within the call c.
func (p *Plain) reduce(ctx context.Context, c *call, grads []float32) error {
	for i := range p.buckets {
		if err := p.allReduceBucket(ctx, c, grads, i); err != nil {
			return err
		}
	}
	scale(grads, p.inv)
	return nil
}

// Overlapped is one step's plain reduction running while backward still
// produces the gradient (DDP's overlap): a goroutine, owned by it and
// joined by Wait, all-reduces each bucket as soon as Ready says its
// gradients are final. The sums are bit for bit those of Reduce.
type Overlapped struct {
	p     *Plain
	c     *call
	grads []float32
	from  atomic.Int64  // grads[from:] are final
	sig   chan struct{} // wakes the goroutine after Ready
	done  chan struct{} // closed when the goroutine ends
	err   error         // the goroutine's; read after done
}

// Start begins the reduction of grads for step; the caller must call
// Ready as backward finishes layers (or not at all) and then Wait exactly
// once. grads[from:] must not be written after Ready(from).
func (p *Plain) Start(ctx context.Context, grads []float32, step int64) (*Overlapped, error) {
	c, err := p.begin(grads, p.total, step)
	if err != nil {
		return nil, err
	}
	o := &Overlapped{p: p, c: c, grads: grads, sig: make(chan struct{}, 1), done: make(chan struct{})}
	o.from.Store(int64(len(grads)))
	go o.run(ctx)
	return o, nil
}

// Ready reports that grads[from:] are final. It never blocks.
func (o *Overlapped) Ready(from int) {
	if int64(from) >= o.from.Load() {
		return
	}
	o.from.Store(int64(from))
	select {
	case o.sig <- struct{}{}:
	default: // a wake-up is already pending
	}
}

func (o *Overlapped) run(ctx context.Context) {
	defer close(o.done)
	for i, b := range o.p.buckets {
		for o.from.Load() > int64(b.lo) {
			select {
			case <-o.sig:
			case <-ctx.Done():
				o.err = ctx.Err()
				return
			}
		}
		if o.p.trace != nil {
			o.p.trace.Instant(fmt.Sprintf("bucket %d ready", i), trace.CatComm, trace.TidComm, time.Now(), nil)
		}
		if err := o.p.allReduceBucket(ctx, o.c, o.grads, i); err != nil {
			o.err = err
			return
		}
	}
}

// Wait marks the whole gradient final, waits for the last bucket and
// averages. After an error the gradient is partly reduced and must not be
// applied.
func (o *Overlapped) Wait() error {
	o.Ready(0)
	<-o.done
	if o.err != nil {
		return o.err
	}
	// Only the averaging counts as this reducer's own time: the rest of
	// the call overlapped backward.
	o.c.start, o.c.comm = time.Now(), 0
	scale(o.grads, o.p.inv)
	raw := 4 * int64(len(o.grads))
	o.c.done(raw, raw)
	return nil
}

// State implements Stateful: Plain has none.
func (p *Plain) State() map[string]models.Tensor { return map[string]models.Tensor{} }

// SetState implements Stateful: only an empty state is accepted.
func (p *Plain) SetState(st map[string]models.Tensor) error {
	return checkStateNames(st, nil)
}

// beforeStart runs the plain all-reduce for the steps before a compressor's
// start_iter and reports whether it handled the step.
func (c *call) beforeStart(ctx context.Context, plain *Plain, grads []float32, step, start int64) (handled bool, err error) {
	if step >= start {
		return false, nil
	}
	if err := plain.reduce(ctx, c, grads); err != nil {
		return true, err
	}
	raw := 4 * int64(len(grads))
	c.done(raw, raw)
	return true, nil
}
