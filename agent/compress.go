package agent

import (
	"context"
	"fmt"
	"sort"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/compress"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Compression of a script's gradient buckets. A bucket is a range of the
// shared region that covers whole tensors of the registered layout, and
// that the script all-reduces once per step (DistributedOptimizer's
// buckets). Each bucket gets its own compress.Reducer, built over the
// bucket's tensors with their names and shapes (so PowerSGD compresses
// the tensors of two or more dimensions and sends 1-D ones as they are,
// as PyTorch's powerSGD_hook does), and keeps its state (error-feedback
// residuals, PowerSGD's warm-start Q) in the worker from step to step.
// The bucket's step count — how many times it was reduced — is the
// reducer's step: it drives start_iter and seeds per-step randomness.

// compressing reports whether sc compresses anything.
func compressing(sc compress.Scheme) bool { return sc.Type != "" && sc.Type != "none" }

// bucket is one compressed bucket: [off, off+n) of the layout.
type bucket struct {
	off, n int64
	red    compress.Reducer
	steps  int64 // successful Reduce calls
}

// bucketSet holds the buckets of one registered layout. Its methods run
// in a collective's turn only (one at a time); Server.mu guards the
// buckets slice for Stats.
type bucketSet struct {
	tensors []models.Segment // the layout, offsets in float32 values
	buckets []*bucket        // sorted by off, never overlapping
}

// newBucketSet returns the (empty) bucket set of a layout already checked
// by layoutSum.
func newBucketSet(ts []*pb.TensorInfo) *bucketSet {
	bs := &bucketSet{tensors: make([]models.Segment, len(ts))}
	off := 0
	for i, t := range ts {
		shape := make([]int, len(t.GetShape()))
		n := 1
		for j, d := range t.GetShape() {
			shape[j] = int(d)
			n *= int(d)
		}
		bs.tensors[i] = models.Segment{Name: t.GetName(), Shape: shape, Offset: off, Len: n}
		off += n
	}
	return bs
}

// find returns the bucket [off, off+n), making it (with a reducer built
// by mk over its tensors, rebased to 0) the first time. A range that cuts
// a tensor or overlaps another bucket is an error.
func (bs *bucketSet) find(off, n int64, mk func(segs []models.Segment, first int) (compress.Reducer, error)) (*bucket, bool, error) {
	i := sort.Search(len(bs.buckets), func(i int) bool { return bs.buckets[i].off+bs.buckets[i].n > off })
	if i < len(bs.buckets) {
		b := bs.buckets[i]
		if b.off == off && b.n == n {
			return b, false, nil
		}
		if b.off < off+n {
			return nil, false, fmt.Errorf("range [%d, %d) overlaps the bucket [%d, %d) reduced before: with compression a bucket must be the same range every step", off, off+n, b.off, b.off+b.n)
		}
	}
	if n == 0 {
		return nil, false, fmt.Errorf("range [%d, %d) is empty: a compressed bucket holds at least one tensor", off, off)
	}
	first := sort.Search(len(bs.tensors), func(i int) bool { return int64(bs.tensors[i].Offset) >= off })
	if first == len(bs.tensors) || int64(bs.tensors[first].Offset) != off {
		return nil, false, fmt.Errorf("range [%d, %d) starts inside a tensor of the layout: a compressed bucket holds whole tensors", off, off+n)
	}
	end := first
	var segs []models.Segment
	for end < len(bs.tensors) && int64(bs.tensors[end].Offset) < off+n {
		s := bs.tensors[end]
		s.Offset -= int(off)
		segs = append(segs, s)
		end++
	}
	last := bs.tensors[end-1]
	if int64(last.Offset+last.Len) != off+n {
		return nil, false, fmt.Errorf("range [%d, %d) ends inside tensor %q: a compressed bucket holds whole tensors", off, off+n, last.Name)
	}
	red, err := mk(segs, first)
	if err != nil {
		return nil, false, err
	}
	b := &bucket{off: off, n: n, red: red}
	return b, true, nil
}

// insert adds b at its place (the caller holds Server.mu).
func (bs *bucketSet) insert(b *bucket) {
	i := sort.Search(len(bs.buckets), func(i int) bool { return bs.buckets[i].off > b.off })
	bs.buckets = append(bs.buckets, nil)
	copy(bs.buckets[i+1:], bs.buckets[i:])
	bs.buckets[i] = b
}

// bucketScheme is sc for the bucket whose first tensor is the layout's
// tensor first: the seeds differ per bucket, so that buckets do not draw
// the same random numbers (PowerSGD's first Q, int8's rounding).
func bucketScheme(sc compress.Scheme, first int) compress.Scheme {
	mix := int64(uint64(first+1) * 0x9E3779B97F4A7C15)
	sc.PowerSGD.Seed ^= mix
	sc.Int8.Seed ^= mix
	return sc
}

// reduceBucket reduces buf, the shared range [off, off+len(buf)), with
// its bucket's compressor: in place, averaged over the ranks. Called in a
// collective's turn.
func (s *Server) reduceBucket(ctx context.Context, off int64, buf []float32) error {
	s.mu.Lock()
	bs := s.buckets
	s.mu.Unlock()
	if bs == nil {
		return status.Error(codes.FailedPrecondition, "no gradient layout: register the layout first")
	}
	b, isNew, err := bs.find(off, int64(len(buf)), func(segs []models.Segment, first int) (compress.Reducer, error) {
		return compress.New(bucketScheme(s.cfg.Compression, first), s.cfg.Ring, s.opt(), segs, 4*len(buf))
	})
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if isNew {
		s.mu.Lock()
		bs.insert(b)
		s.mu.Unlock()
	}
	if err := b.red.Reduce(ctx, buf, b.steps); err != nil {
		return err
	}
	b.steps++
	return nil
}

// CompressionStats are the compressed buckets' counters, summed over the
// buckets of the current layout.
type CompressionStats struct {
	compress.Stats
	// Steps is the most reductions of any one bucket: the steps taken
	// (each bucket is reduced once a step).
	Steps int64
}

// CompressionStats returns the counters of the compressed buckets so far
// (zero without compression). Safe to call at any time.
func (s *Server) CompressionStats() CompressionStats {
	s.mu.Lock()
	var bs []*bucket
	if s.buckets != nil {
		bs = append(bs, s.buckets.buckets...)
	}
	s.mu.Unlock()
	var out CompressionStats
	for _, b := range bs {
		st := b.red.Stats()
		out.RawBytes += st.RawBytes
		out.SentBytes += st.SentBytes
		out.WireBytes += st.WireBytes
		out.CompressSeconds += st.CompressSeconds
		out.Stats.Steps += st.Steps
		out.Steps = max(out.Steps, st.Steps)
	}
	return out
}
