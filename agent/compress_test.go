package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/compress"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// cnnLayout is examples/torch_mnist.py's Net as DistributedOptimizer
// registers it (bucket_cap_mb 4: buckets in reverse parameter order, the
// layout in bucket order), and the buckets' ranges.
func cnnLayout() ([]*pb.TensorInfo, [][2]int64) {
	ts := []*pb.TensorInfo{
		{Name: "fc2.bias", Shape: []int64{10}}, {Name: "fc2.weight", Shape: []int64{10, 128}},
		{Name: "fc1.bias", Shape: []int64{128}},
		{Name: "fc1.weight", Shape: []int64{128, 9216}},
		{Name: "conv2.bias", Shape: []int64{64}}, {Name: "conv2.weight", Shape: []int64{64, 32, 3, 3}},
		{Name: "conv1.bias", Shape: []int64{32}}, {Name: "conv1.weight", Shape: []int64{32, 1, 3, 3}},
	}
	for _, t := range ts {
		t.Dtype = "float32"
	}
	return ts, [][2]int64{{0, 1418}, {1418, 1179648}, {1181066, 64 + 18432 + 32 + 288}}
}

// registerShared registers layout with shared memory on every rank and
// maps each rank's region.
func registerShared(t *testing.T, w *world, layout []*pb.TensorInfo) [][]float32 {
	t.Helper()
	ctx := ctxT(t)
	n := len(w.clients)
	paths := make([]string, n)
	sizes := make([]int64, n)
	errs := onAll(n, func(r int) error {
		res, err := w.clients[r].RegisterLayout(ctx, &pb.RegisterLayoutRequest{Seq: 0, Tensors: layout, SharedMemory: true})
		if err == nil {
			paths[r], sizes[r] = res.ShmPath, res.NumElements
		}
		return err
	})
	views := make([][]float32, n)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		views[r] = mapShared(t, paths[r], int(sizes[r]))
	}
	return views
}

// reduceBuckets all-reduces every bucket on every rank, all in flight at
// once (as DistributedOptimizer sends them while backward runs), numbered
// from seq.
func reduceBuckets(ctx context.Context, w *world, buckets [][2]int64, seq int64) []error {
	return onAll(len(w.clients), func(r int) error {
		errs := make(chan error, len(buckets))
		for i, b := range buckets {
			go func() { // owned by this call: it receives every result below
				_, err := w.clients[r].AllReduce(ctx, &pb.AllReduceRequest{Seq: seq + int64(i),
					Shm: &pb.ShmRange{Offset: b[0], Length: b[1]}, Average: true})
				errs <- err
			}()
		}
		var first error
		for range buckets {
			if err := <-errs; err != nil && first == nil {
				first = err
			}
		}
		return first
	})
}

// sameBits fails unless every rank's view holds the same bits.
func sameBits(t *testing.T, views [][]float32, what string) {
	t.Helper()
	b0 := f32bytes(views[0])
	for r := 1; r < len(views); r++ {
		if !bytes.Equal(b0, f32bytes(views[r])) {
			t.Fatalf("%s: rank %d's gradient differs from rank 0's", what, r)
		}
	}
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// TestCompressedBucketsPowerSGDBytes: the example CNN's three buckets
// through two agents with PowerSGD rank 2, start_iter 3. After start_iter
// each step sends ≥ 50× fewer bytes than the plain steps before it, by
// the compressors' counters (the message a rank contributes, and the
// payload handed to the ring); every rank ends every step with the same
// bits.
func TestCompressedBucketsPowerSGDBytes(t *testing.T) {
	const n, start, steps = 2, 3, 7
	sc := compress.Scheme{Type: "powersgd", PowerSGD: compress.PowerSGDConfig{Rank: 2, StartIter: start, Seed: 5}}
	w := newWorldWith(t, n, time.Minute, sc)
	ctx := ctxT(t)
	info, err := w.clients[0].Init(ctx, &pb.AgentInitRequest{})
	if err != nil || info.Compression != "powersgd" {
		t.Fatalf("Init: %v %v, want compression powersgd", info, err)
	}
	layout, buckets := cnnLayout()
	views := registerShared(t, w, layout)
	var atStart CompressionStats
	seq := int64(1)
	for s := range steps {
		if s == start {
			atStart = w.servers[0].CompressionStats()
		}
		for r := range n {
			rng := rand.New(rand.NewPCG(uint64(r), uint64(s)))
			for i := range views[r] {
				views[r][i] = float32(rng.NormFloat64())
			}
		}
		for r, err := range reduceBuckets(ctx, w, buckets, seq) {
			if err != nil {
				t.Fatalf("step %d rank %d: %v", s, r, err)
			}
		}
		seq += int64(len(buckets))
		sameBits(t, views, fmt.Sprintf("step %d", s))
	}
	end := w.servers[0].CompressionStats()
	if end.Steps != steps || atStart.Steps != start {
		t.Fatalf("steps counted %d (%d at start_iter), want %d (%d)", end.Steps, atStart.Steps, steps, start)
	}
	raw, sent := end.RawBytes-atStart.RawBytes, end.SentBytes-atStart.SentBytes
	plainWire := float64(atStart.WireBytes) / start
	compWire := float64(end.WireBytes-atStart.WireBytes) / (steps - start)
	t.Logf("after start_iter per step: raw %d B, sent %d B (%.1f×); on the wire %.0f B vs %.0f B plain (%.1f×)",
		raw/(steps-start), sent/(steps-start), float64(raw)/float64(sent), compWire, plainWire, plainWire/compWire)
	if float64(raw) < 50*float64(sent) {
		t.Fatalf("raw/sent after start_iter = %.1f, want ≥ 50", float64(raw)/float64(sent))
	}
	if plainWire < 50*compWire {
		t.Fatalf("wire bytes per step: plain %.0f, compressed %.0f: %.1f×, want ≥ 50×", plainWire, compWire, plainWire/compWire)
	}
}

// TestCompressedBucketsLowRankExact: when each matrix's average has rank
// ≤ r, PowerSGD gives it back (to float32 accuracy) from the first step;
// the 1-D tensors of a bucket go uncompressed and are the exact average.
func TestCompressedBucketsLowRankExact(t *testing.T) {
	const n = 2
	sc := compress.Scheme{Type: "powersgd", PowerSGD: compress.PowerSGDConfig{Rank: 2, Seed: 9}}
	w := newWorldWith(t, n, time.Minute, sc)
	ctx := ctxT(t)
	layout := []*pb.TensorInfo{
		{Name: "a.weight", Shape: []int64{20, 16}, Dtype: "float32"}, {Name: "a.bias", Shape: []int64{20}, Dtype: "float32"},
		{Name: "b.weight", Shape: []int64{8, 3, 3, 3}, Dtype: "float32"}, {Name: "b.bias", Shape: []int64{8}, Dtype: "float32"},
	}
	buckets := [][2]int64{{0, 340}, {340, 224}}
	views := registerShared(t, w, layout)
	want := make([]float32, 564)
	for r := range n {
		rng := rand.New(rand.NewPCG(uint64(r), 1))
		fill := func(off, rows, cols int) { // a rank-1 matrix u vᵀ
			u, v := make([]float32, rows), make([]float32, cols)
			for i := range u {
				u[i] = float32(rng.NormFloat64())
			}
			for j := range v {
				v[j] = float32(rng.NormFloat64())
			}
			for i := range rows {
				for j := range cols {
					views[r][off+i*cols+j] = u[i] * v[j]
				}
			}
		}
		fill(0, 20, 16)
		fill(340, 8, 27)
		for _, b := range [][2]int{{320, 20}, {556, 8}} {
			for i := b[0]; i < b[0]+b[1]; i++ {
				views[r][i] = float32(rng.NormFloat64())
			}
		}
	}
	for i := range want {
		want[i] = (views[0][i] + views[1][i]) * 0.5
	}
	for r, err := range reduceBuckets(ctx, w, buckets, 1) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	sameBits(t, views, "low rank")
	for _, seg := range [][3]int{{0, 320, 0}, {320, 20, 1}, {340, 216, 0}, {556, 8, 1}} {
		var d, nrm float64
		for i := seg[0]; i < seg[0]+seg[1]; i++ {
			d += math.Pow(float64(views[0][i]-want[i]), 2)
			nrm += math.Pow(float64(want[i]), 2)
			if seg[2] == 1 && views[0][i] != want[i] {
				t.Fatalf("[%d] (a 1-D tensor) = %v, want the exact average %v", i, views[0][i], want[i])
			}
		}
		if rel := math.Sqrt(d / nrm); rel > 1e-5 {
			t.Fatalf("tensor at %d: relative error %.3g, want ≤ 1e-5", seg[0], rel)
		}
	}
	if st := w.servers[1].CompressionStats(); st.Steps != 1 || st.Ratio() <= 1 {
		t.Fatalf("stats %+v: want one step, compressed", st)
	}
}

// TestCompressedBucketsOtherTypes: top-k, int8, fp16 and bf16 buckets
// leave every rank with the same bits, step after step, and count their
// bytes; fp16 stays close to the average.
func TestCompressedBucketsOtherTypes(t *testing.T) {
	const n = 3
	for _, sc := range []compress.Scheme{
		{Type: "topk", TopK: compress.TopKConfig{Ratio: 0.1}},
		{Type: "int8", Int8: compress.Int8Config{Seed: 3}},
		{Type: "fp16"}, {Type: "bf16"},
	} {
		t.Run(sc.Type, func(t *testing.T) {
			w := newWorldWith(t, n, time.Minute, sc)
			ctx := ctxT(t)
			layout := []*pb.TensorInfo{{Name: "w", Shape: []int64{30, 10}, Dtype: "float32"}, {Name: "b", Shape: []int64{30}, Dtype: "float32"},
				{Name: "v", Shape: []int64{700}, Dtype: "float32"}}
			buckets := [][2]int64{{0, 330}, {330, 700}}
			views := registerShared(t, w, layout)
			seq := int64(1)
			for s := range 3 {
				want := make([]float32, 1030)
				for r := range n {
					rng := rand.New(rand.NewPCG(uint64(r), uint64(s)))
					for i := range views[r] {
						views[r][i] = float32(rng.NormFloat64())
						want[i] += views[r][i] / n
					}
				}
				for r, err := range reduceBuckets(ctx, w, buckets, seq) {
					if err != nil {
						t.Fatalf("step %d rank %d: %v", s, r, err)
					}
				}
				seq += 2
				sameBits(t, views, sc.Type)
				if sc.Type == "fp16" {
					for i, v := range views[0] {
						if math.Abs(float64(v-want[i])) > 2e-3 {
							t.Fatalf("fp16 [%d] = %v, want about %v", i, v, want[i])
						}
					}
				}
			}
			st := w.servers[0].CompressionStats()
			if st.Steps != 3 || st.RawBytes != 3*4*1030 || st.SentBytes <= 0 || st.SentBytes >= st.RawBytes {
				t.Fatalf("stats %+v: want 3 steps of 4120 raw bytes, fewer sent", st)
			}
		})
	}
}

// TestCompressedBucketRefusals: a compressed all-reduce must average and
// cover whole tensors, and a bucket must be the same range every step;
// data in messages is reduced uncompressed, exactly.
func TestCompressedBucketRefusals(t *testing.T) {
	const n = 2
	sc := compress.Scheme{Type: "powersgd"}
	layout := []*pb.TensorInfo{{Name: "w", Shape: []int64{8, 8}, Dtype: "float32"}, {Name: "b", Shape: []int64{8}, Dtype: "float32"}}
	t.Run("average and tensors", func(t *testing.T) {
		w := newWorldWith(t, n, time.Minute, sc)
		ctx := ctxT(t)
		registerShared(t, w, layout)
		_, err := w.clients[0].AllReduce(ctx, &pb.AllReduceRequest{Seq: 1, Shm: &pb.ShmRange{Offset: 0, Length: 72}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "averages") {
			t.Fatalf("a summing compressed all-reduce: %v, want InvalidArgument", err)
		}
		// Data in a message: not a bucket, reduced exactly.
		errs := onAll(n, func(r int) error {
			res, err := w.clients[r].AllReduce(ctx, &pb.AllReduceRequest{Seq: 1, Data: encode([]float32{float32(r), 1.5}), Average: true})
			if err == nil && !bytes.Equal(res.Data, encode([]float32{0.5, 1.5})) {
				t.Errorf("rank %d: data all-reduce gave %v", r, res.Data)
			}
			return err
		})
		for r, err := range errs {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
		_, err = w.clients[0].AllReduce(ctx, &pb.AllReduceRequest{Seq: 2, Shm: &pb.ShmRange{Offset: 0, Length: 70}, Average: true})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "whole tensors") {
			t.Fatalf("a range that cuts a tensor: %v, want InvalidArgument naming whole tensors", err)
		}
	})
	t.Run("overlap", func(t *testing.T) {
		w := newWorldWith(t, n, time.Minute, sc)
		ctx := ctxT(t)
		registerShared(t, w, layout)
		for r, err := range reduceBuckets(ctx, w, [][2]int64{{0, 64}}, 1) {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
		_, err := w.clients[0].AllReduce(ctx, &pb.AllReduceRequest{Seq: 2, Shm: &pb.ShmRange{Offset: 0, Length: 72}, Average: true})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "overlaps") {
			t.Fatalf("a range over a bucket: %v, want InvalidArgument", err)
		}
	})
}
