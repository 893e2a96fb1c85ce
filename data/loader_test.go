package data

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// fakeSource is an in-memory Source whose image i is a function of i. Its
// reads can be made to fail at one index, and to wait on a gate.
type fakeSource struct {
	info   Info
	reads  atomic.Int64
	failAt int           // -1: never
	gate   chan struct{} // if set, Read waits for it to be closed
	began  chan struct{} // if set, Read signals it (non-blocking) on entry
}

func newFakeSource(n, c, h, w int) *fakeSource {
	return &fakeSource{info: Info{Name: "fake", N: n, C: c, H: h, W: w, Classes: 7}, failAt: -1}
}

func (f *fakeSource) Info() Info        { return f.info }
func (f *fakeSource) Label(i int) int32 { return int32(i % 7) }

func (f *fakeSource) Read(i int, dst []uint8) error {
	checkRead("fakeSource", f.info, i, dst)
	if f.began != nil {
		select {
		case f.began <- struct{}{}:
		default:
		}
	}
	if f.gate != nil {
		<-f.gate
	}
	f.reads.Add(1)
	if i == f.failAt {
		return fmt.Errorf("data: fake/%d.png: decoding: broken", i)
	}
	// Uneven work, so that the pool finishes images out of order.
	for range (i * 7919) % 13 {
		runtime.Gosched()
	}
	for j := range dst {
		dst[j] = uint8(i*31 + j)
	}
	return nil
}

// drain reads every batch of l, failing on an error.
func drain(t *testing.T, l *Loader) []*Batch {
	t.Helper()
	var out []*Batch
	for {
		b, err := l.Next(context.Background())
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
}

func TestLoaderOrderAndDeterminism(t *testing.T) {
	src := newFakeSource(50, 2, 3, 4)
	s, err := NewSampler(50, 1, 3, 9, true, false)
	if err != nil {
		t.Fatal(err)
	}
	order := s.Epoch(2)
	var ref []*Batch
	for _, cfg := range []LoaderConfig{
		{Batch: 4, Workers: 1, Prefetch: 1},
		{Batch: 4, Workers: 7, Prefetch: 5},
		{Batch: 4},
		{Batch: 4, Workers: 3, Prefetch: 1, Cache: NewImageCache(src, 1<<20)},
	} {
		l, err := NewLoader(context.Background(), src, order, cfg)
		if err != nil {
			t.Fatal(err)
		}
		got := drain(t, l)
		l.Close()
		if len(got) != 5 || len(got[4].Indices) != 17-16 {
			t.Fatalf("%+v: %d batches", cfg, len(got))
		}
		var all []int
		for _, b := range got {
			all = append(all, b.Indices...)
			for j, i := range b.Indices {
				want := make([]uint8, 24)
				src.Read(i, want)
				if !bytes.Equal(b.Pix[j*24:(j+1)*24], want) || b.Labels[j] != int32(i%7) {
					t.Fatalf("%+v: image %d of a batch (index %d) is wrong", cfg, j, i)
				}
			}
		}
		if !slices.Equal(all, order) {
			t.Fatalf("%+v: indices %v, want the sampler's %v", cfg, all, order)
		}
		if ref == nil {
			ref = got
			continue
		}
		for k := range got {
			if !slices.Equal(got[k].Indices, ref[k].Indices) || !bytes.Equal(got[k].Pix, ref[k].Pix) {
				t.Fatalf("%+v: batch %d differs from one worker's", cfg, k)
			}
		}
		if st := l.Stats(); st.Images != 17 || st.Decoded+st.CacheHits != 17 || st.PerSecond() < 0 ||
			st.Busy <= 0 || st.Workers < 1 || st.Capacity() <= 0 {
			t.Errorf("%+v: stats %+v", cfg, st)
		}
	}
	// A resumed position: the rest of the order comes out as it went in.
	l, err := NewLoader(context.Background(), src, order[8:], LoaderConfig{Batch: 4, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := drain(t, l); !slices.Equal(got[0].Indices, order[8:12]) || !bytes.Equal(got[0].Pix, ref[2].Pix) {
		t.Errorf("resumed loader's first batch %v, want %v", got[0].Indices, order[8:12])
	}
}

func TestLoaderCache(t *testing.T) {
	src := newFakeSource(10, 1, 2, 5) // 10 bytes per image
	cache := NewImageCache(src, 35)   // room for 3 images
	order := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0}
	for epoch := range 2 {
		l, err := NewLoader(context.Background(), src, order, LoaderConfig{Batch: 3, Workers: 2, Cache: cache})
		if err != nil {
			t.Fatal(err)
		}
		drain(t, l)
		l.Close()
		st := l.Stats()
		if cache.Bytes() > 35 || cache.Len() != 3 || cache.Bytes() != 30 {
			t.Fatalf("epoch %d: cache holds %d bytes in %d images, limit 35", epoch, cache.Bytes(), cache.Len())
		}
		if epoch == 1 && (st.CacheHits < 3 || st.Decoded > 8) {
			t.Errorf("epoch 2: %d cache hits and %d decoded, want ≥ 3 and ≤ 8", st.CacheHits, st.Decoded)
		}
	}
	// A cache is bound to its source.
	if _, err := NewLoader(context.Background(), newFakeSource(10, 1, 2, 5), order, LoaderConfig{Batch: 3, Cache: cache}); err == nil {
		t.Error("a cache of another source was accepted")
	}
}

func TestLoaderErrors(t *testing.T) {
	src := newFakeSource(20, 1, 1, 1)
	src.failAt = 9
	l, err := NewLoader(context.Background(), src, []int{0, 1, 2, 3, 9, 4, 5}, LoaderConfig{Batch: 2, Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for range 2 {
		if _, err := l.Next(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	_, err = l.Next(context.Background())
	wantErr(t, err, "fake/9.png")
	if _, again := l.Next(context.Background()); again != err {
		t.Errorf("after a failed batch Next returned %v, want the same error", again)
	}
	for _, c := range []struct {
		order []int
		cfg   LoaderConfig
		want  string
	}{
		{[]int{0, 20}, LoaderConfig{Batch: 1}, "order[1] = 20 is out of range [0, 20)"},
		{[]int{-1}, LoaderConfig{Batch: 1}, "order[0] = -1"},
		{nil, LoaderConfig{}, "batch = 0"},
		{nil, LoaderConfig{Batch: 1, Workers: -1}, "workers = -1"},
	} {
		_, err := NewLoader(context.Background(), src, c.order, c.cfg)
		wantErr(t, err, c.want)
	}
	// An empty order is an empty epoch.
	e, err := NewLoader(context.Background(), src, nil, LoaderConfig{Batch: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if _, err := e.Next(context.Background()); err != io.EOF {
		t.Errorf("empty order: Next = %v, want io.EOF", err)
	}
}

func TestLoaderCancellation(t *testing.T) {
	defer goleak.VerifyNone(t)
	src := newFakeSource(100, 1, 4, 4)
	src.gate = make(chan struct{})
	src.began = make(chan struct{}, 1)
	order := make([]int, 100)
	for i := range order {
		order[i] = i
	}
	ctx, cancel := context.WithCancel(context.Background())
	l, err := NewLoader(ctx, src, order, LoaderConfig{Batch: 10, Workers: 2, Prefetch: 2})
	if err != nil {
		t.Fatal(err)
	}
	<-src.began // a decoder is inside Read, stuck on the gate

	// The caller's own context ending returns at once and loses nothing.
	nctx, ncancel := context.WithCancel(context.Background())
	ncancel()
	if _, err := l.Next(nctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Next with a cancelled context = %v", err)
	}
	// The loader's context ending stops it, even with Reads stuck.
	cancel()
	_, err = l.Next(context.Background())
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "loader stopped") {
		t.Fatalf("Next after the loader's context ended = %v", err)
	}
	close(src.gate) // let the stuck Reads return
	l.Close()
	l.Close() // idempotent
	if n := src.reads.Load(); n > 2+2*10 {
		t.Errorf("%d images read after cancellation; prefetch bounds it to about 2 workers + 2 batches", n)
	}
}

func TestLoaderCloseMidEpoch(t *testing.T) {
	defer goleak.VerifyNone(t)
	src := newFakeSource(1000, 1, 8, 8)
	order := make([]int, 1000)
	for i := range order {
		order[i] = i
	}
	l, err := NewLoader(context.Background(), src, order, LoaderConfig{Batch: 16, Workers: 4, Prefetch: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Next(context.Background()); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if _, err := l.Next(context.Background()); err == nil || err == io.EOF {
		t.Errorf("Next after Close = %v, want the loader's stop", err)
	}
}

// TestLoaderCapacity: images produced per second of the pool's busy time,
// per goroutine; nothing measured is 0.
func TestLoaderCapacity(t *testing.T) {
	st := LoaderStats{Decoded: 30, CacheHits: 10, Busy: 4 * time.Second, Workers: 2}
	if got := st.Capacity(); got != 20 {
		t.Errorf("40 images in 4 busy seconds over 2 goroutines: %v images/s, want 20", got)
	}
	if got := (LoaderStats{Decoded: 5}).Capacity(); got != 0 {
		t.Errorf("no busy time: %v, want 0", got)
	}
}
