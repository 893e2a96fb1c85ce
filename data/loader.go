package data

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// LoaderConfig configures a [Loader]. Batch is required; the zero values
// of the rest are the documented defaults.
type LoaderConfig struct {
	// Batch is the number of indices per batch (the last may be short).
	Batch int
	// Workers is the number of decoding goroutines; 0 means GOMAXPROCS.
	Workers int
	// Prefetch is how many batches may be decoded or waiting ahead of the
	// consumer; 0 means 2. It bounds the loader's memory to about
	// (Prefetch + 1) batches.
	Prefetch int
	// Cache, if set, keeps decoded images across loaders (epochs) of the
	// same source; see [ImageCache].
	Cache *ImageCache
}

// Batch is one batch of decoded examples, owned by the caller of Next.
type Batch struct {
	// Indices are the source indices of the batch, in the order given.
	Indices []int
	// Pix is (len(Indices), C, H, W): image j is Pix[j*C*H*W:(j+1)*C*H*W],
	// raw bytes as [Pixels.Read] gives them.
	Pix []uint8
	// Labels[j] is Indices[j]'s label when the source is a [Source]; nil
	// otherwise (a [MultiSource]'s label sets are LabelSet(Indices[j])).
	Labels []int32
}

// LoaderStats is what a loader has done so far.
type LoaderStats struct {
	// Images is the number of images delivered by Next.
	Images int64
	// Decoded counts images read from the source, CacheHits those copied
	// from the cache.
	Decoded, CacheHits int64
	// Elapsed is the time since the loader started, Waiting the part of it
	// that Next spent blocked on batches not yet decoded: a large share
	// means the loader is the bottleneck.
	Elapsed, Waiting time.Duration
	// Busy is the time the pool's goroutines spent producing images
	// (decoding or copying from the cache), summed over them; Workers is
	// the pool's size.
	Busy    time.Duration
	Workers int
}

// Capacity returns the images per second the pool produces while busy,
// (Decoded + CacheHits) / (Busy / Workers): what the loader could deliver
// if never held back by its consumer. Compared with training's images per
// second it shows whether steps wait for data.
func (s LoaderStats) Capacity() float64 {
	if s.Busy <= 0 || s.Workers <= 0 {
		return 0
	}
	return float64(s.Decoded+s.CacheHits) / (s.Busy.Seconds() / float64(s.Workers))
}

// PerSecond returns the delivered images per second of elapsed time.
func (s LoaderStats) PerSecond() float64 {
	if s.Elapsed <= 0 {
		return 0
	}
	return float64(s.Images) / s.Elapsed.Seconds()
}

// Loader streams the examples of a [Pixels] source in a given index order,
// in batches: a bounded pool of decoding goroutines fills up to Prefetch
// batches ahead of the consumer. Batch k holds order[k·Batch : (k+1)·Batch]
// in that order, whatever the pool size, so a sampler's order (and a
// resumed position's remainder of it) comes out as it went in.
//
// The loader owns its goroutines: they stop when Close is called or the
// context given to NewLoader ends, and Close waits for them (a Read in
// progress is finished first). Next must be called from one goroutine at a
// time; Stats and Close may be called from any.
type Loader struct {
	src     Pixels
	label   func(int) int32 // nil unless src is a Source
	order   []int
	cfg     LoaderConfig
	size    int // bytes per image
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	batches chan *pending // in order; capacity Prefetch
	done    atomic.Bool   // every batch was dispatched

	// Consumer state, touched only by Next.
	held *pending // taken from batches but not yet returned
	err  error    // sticky: a failed batch fails the rest

	start                      time.Time
	images, decoded, cacheHits atomic.Int64
	waiting, busy              atomic.Int64 // nanoseconds
}

// pending is one batch being decoded.
type pending struct {
	b    *Batch
	errs []error      // per position
	left atomic.Int32 // images not yet decoded
	done chan struct{}
}

type loadJob struct {
	p *pending
	j int
}

// NewLoader starts a loader over src that yields the examples at order,
// in batches of cfg.Batch. Indices out of [0, N) and invalid configs are
// errors. The loader copies order.
func NewLoader(ctx context.Context, src Pixels, order []int, cfg LoaderConfig) (*Loader, error) {
	in := src.Info()
	switch {
	case cfg.Batch < 1:
		return nil, fmt.Errorf("data: loader: batch = %d, must be ≥ 1", cfg.Batch)
	case cfg.Workers < 0 || cfg.Prefetch < 0:
		return nil, fmt.Errorf("data: loader: workers = %d and prefetch = %d must be ≥ 0 (0 means the default)", cfg.Workers, cfg.Prefetch)
	case cfg.Cache != nil && cfg.Cache.src != src:
		return nil, errors.New("data: loader: the cache belongs to another source")
	}
	for k, i := range order {
		if i < 0 || i >= in.N {
			return nil, fmt.Errorf("data: loader: order[%d] = %d is out of range [0, %d) for %s", k, i, in.N, in.Name)
		}
	}
	if cfg.Workers == 0 {
		cfg.Workers = runtime.GOMAXPROCS(0)
	}
	if cfg.Prefetch == 0 {
		cfg.Prefetch = 2
	}
	l := &Loader{
		src:     src,
		order:   append([]int(nil), order...),
		cfg:     cfg,
		size:    in.ImageSize(),
		batches: make(chan *pending, cfg.Prefetch),
		start:   time.Now(),
	}
	if s, ok := src.(Source); ok {
		l.label = s.Label
	}
	l.ctx, l.cancel = context.WithCancel(ctx)
	jobs := make(chan loadJob)
	for range cfg.Workers {
		l.wg.Go(func() { l.decode(jobs) })
	}
	l.wg.Go(func() { l.dispatch(jobs) })
	return l, nil
}

// dispatch makes the batches in order and hands out their images. Putting
// a batch in l.batches before its images are decoded is what bounds the
// loader: the channel holds at most Prefetch of them.
func (l *Loader) dispatch(jobs chan<- loadJob) {
	defer close(l.batches)
	for lo := 0; lo < len(l.order); lo += l.cfg.Batch {
		idx := l.order[lo:min(lo+l.cfg.Batch, len(l.order))]
		p := &pending{
			b:    &Batch{Indices: idx, Pix: make([]uint8, len(idx)*l.size)},
			errs: make([]error, len(idx)),
			done: make(chan struct{}),
		}
		p.left.Store(int32(len(idx)))
		if l.label != nil {
			p.b.Labels = make([]int32, len(idx))
			for j, i := range idx {
				p.b.Labels[j] = l.label(i)
			}
		}
		select {
		case l.batches <- p:
		case <-l.ctx.Done():
			return
		}
		for j := range idx {
			select {
			case jobs <- loadJob{p, j}:
			case <-l.ctx.Done():
				return
			}
		}
	}
	l.done.Store(true)
}

// decode is one worker of the pool.
func (l *Loader) decode(jobs <-chan loadJob) {
	for {
		var jb loadJob
		select {
		case jb = <-jobs:
		case <-l.ctx.Done():
			return
		}
		i := jb.p.b.Indices[jb.j]
		dst := jb.p.b.Pix[jb.j*l.size : (jb.j+1)*l.size]
		t0 := time.Now()
		if c := l.cfg.Cache; c != nil && c.get(i, dst) {
			l.cacheHits.Add(1)
		} else {
			err := l.src.Read(i, dst)
			jb.p.errs[jb.j] = err
			l.decoded.Add(1)
			if err == nil && c != nil {
				c.put(i, dst)
			}
		}
		l.busy.Add(int64(time.Since(t0)))
		if jb.p.left.Add(-1) == 0 {
			close(jb.p.done)
		}
	}
}

// Next returns the next batch, or io.EOF after the last one. A batch with
// an image that failed to decode returns that error (the first in batch
// order), and so does every later call. When ctx ends, Next returns its
// error and the batch it was waiting for is returned by the next call;
// when the loader's own context ends or it is closed, Next returns that
// cause.
func (l *Loader) Next(ctx context.Context) (*Batch, error) {
	if l.err != nil {
		return nil, l.err
	}
	if l.ctx.Err() != nil {
		// Stopped: batches already decoded are not handed out either, so
		// that what a stopped loader returns does not depend on timing.
		l.err = fmt.Errorf("data: loader stopped: %w", context.Cause(l.ctx))
		return nil, l.err
	}
	t0 := time.Now()
	defer func() { l.waiting.Add(int64(time.Since(t0))) }()
	if l.held == nil {
		select {
		case p, ok := <-l.batches:
			if !ok {
				if l.done.Load() {
					return nil, io.EOF
				}
				l.err = fmt.Errorf("data: loader stopped: %w", context.Cause(l.ctx))
				return nil, l.err
			}
			l.held = p
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	p := l.held
	select {
	case <-p.done:
	default:
		select {
		case <-p.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-l.ctx.Done():
			l.err = fmt.Errorf("data: loader stopped: %w", context.Cause(l.ctx))
			return nil, l.err
		}
	}
	l.held = nil
	for _, err := range p.errs {
		if err != nil {
			l.err = err
			l.cancel()
			return nil, err
		}
	}
	l.images.Add(int64(len(p.b.Indices)))
	return p.b, nil
}

// Close stops the loader and waits for its goroutines. It may be called
// more than once, and from any goroutine.
func (l *Loader) Close() {
	l.cancel()
	l.wg.Wait()
}

// Stats returns what the loader has done so far.
func (l *Loader) Stats() LoaderStats {
	return LoaderStats{
		Images:    l.images.Load(),
		Decoded:   l.decoded.Load(),
		CacheHits: l.cacheHits.Load(),
		Elapsed:   time.Since(l.start),
		Waiting:   time.Duration(l.waiting.Load()),
		Busy:      time.Duration(l.busy.Load()),
		Workers:   l.cfg.Workers,
	}
}

// ImageCache keeps decoded images of one source in memory, up to a limit
// on their pixel bytes, so that later epochs skip decoding them. It admits
// images until it is full and then keeps what it has: with a shuffled order
// every epoch, evicting would only trade one cached image for another. Safe
// for concurrent use; share one across the loaders of a source.
type ImageCache struct {
	src   Pixels
	limit int64
	mu    sync.Mutex // protects m and bytes
	m     map[int][]uint8
	bytes int64
}

// NewImageCache returns an empty cache for src's images holding at most
// limit bytes of pixels (map overhead is not counted).
func NewImageCache(src Pixels, limit int64) *ImageCache {
	return &ImageCache{src: src, limit: limit, m: map[int][]uint8{}}
}

// Bytes returns the pixel bytes held, and Len the number of images.
func (c *ImageCache) Bytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes
}

// Len returns the number of images held.
func (c *ImageCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

func (c *ImageCache) get(i int, dst []uint8) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	pix, ok := c.m[i]
	if ok {
		copy(dst, pix)
	}
	return ok
}

func (c *ImageCache) put(i int, pix []uint8) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[i]; ok || c.bytes+int64(len(pix)) > c.limit {
		return
	}
	c.m[i] = append([]uint8(nil), pix...)
	c.bytes += int64(len(pix))
}
