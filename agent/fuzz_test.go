package agent

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/aggregator"
	"github.com/gradsync/gradsync/compress"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// FuzzRequests feeds arbitrary bytes to the agent as each request message
// (world size 1): a request that does not decode is refused by gRPC; one
// that does gets an answer or an error, never a panic.
func FuzzRequests(f *testing.F) {
	seeds := []proto.Message{
		&pb.AllReduceRequest{Data: encode([]float32{1, 2}), Average: true},
		&pb.BroadcastRequest{Root: 0, Data: encode([]float32{3})},
		&pb.RegisterLayoutRequest{Tensors: []*pb.TensorInfo{{Name: "w", Shape: []int64{2, 3}, Dtype: "float32"}}, SharedMemory: true},
		&pb.AllReduceRequest{Shm: &pb.ShmRange{Offset: 1, Length: 4}},
		&pb.ReportRequest{Step: 1, Loss: 0.3, Eval: true, TestAccuracy: 0.5},
	}
	for i, m := range seeds {
		b, _ := proto.Marshal(m)
		f.Add(uint8(i), b)
	}
	ring := aggregator.NewMemRing(1, 0)[0]
	s, err := New(Config{Ring: ring, StepTimeout: time.Second})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(s.Close) // a shared region a fuzzed layout asked for
	f.Fuzz(func(t *testing.T, kind uint8, b []byte) {
		ctx := context.Background()
		s.mu.Lock()
		next := s.next
		s.mu.Unlock()
		switch kind % 4 {
		case 0:
			var m pb.AllReduceRequest
			if proto.Unmarshal(b, &m) == nil {
				m.Seq = next
				_, _ = s.AllReduce(ctx, &m)
			}
		case 1:
			var m pb.BroadcastRequest
			if proto.Unmarshal(b, &m) == nil {
				m.Seq = next
				_, _ = s.Broadcast(ctx, &m)
			}
		case 2:
			var m pb.RegisterLayoutRequest
			if proto.Unmarshal(b, &m) == nil {
				m.Seq = next
				_, _ = s.RegisterLayout(ctx, &m)
			}
		case 3:
			var m pb.ReportRequest
			if proto.Unmarshal(b, &m) == nil {
				_, _ = s.Report(ctx, &m)
			}
		}
	})
}

// FuzzCompressedBuckets registers a layout of small tensors drawn from the
// input and all-reduces shared-memory ranges drawn from it with PowerSGD
// on (world size 1, from step 0): ranges that cut tensors, overlap
// buckets or fall outside the region get errors, never a panic, and a
// whole-bucket range reduces.
func FuzzCompressedBuckets(f *testing.F) {
	f.Add([]byte{3, 2, 4, 5, 1, 4, 2, 3, 2, 0, 20, 0, 20, 20, 4})
	f.Add([]byte{1, 1, 7, 0, 7, 0, 7, 3, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		next := func() int {
			if len(b) == 0 {
				return 0
			}
			v := int(b[0])
			b = b[1:]
			return v
		}
		var layout []*pb.TensorInfo
		for i := range 1 + next()%5 {
			shape := make([]int64, 1+next()%3)
			for j := range shape {
				shape[j] = int64(1 + next()%8)
			}
			layout = append(layout, &pb.TensorInfo{Name: string(rune('a' + i)), Shape: shape, Dtype: "float32"})
		}
		ring := aggregator.NewMemRing(1, 0)[0]
		defer ring.(*aggregator.MemRing).Close()
		s, err := New(Config{Ring: ring, StepTimeout: time.Second,
			Compression: compress.Scheme{Type: "powersgd", PowerSGD: compress.PowerSGDConfig{Rank: 1 + len(b)%3}}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ctx := context.Background()
		res, err := s.RegisterLayout(ctx, &pb.RegisterLayoutRequest{Seq: 0, Tensors: layout, SharedMemory: true})
		if err != nil {
			t.Fatalf("a valid layout %v: %v", layout, err)
		}
		seq := int64(1)
		for len(b) >= 2 && seq < 16 {
			off, n := int64(next()), int64(next())
			_, err := s.AllReduce(ctx, &pb.AllReduceRequest{Seq: seq, Shm: &pb.ShmRange{Offset: off % (res.NumElements + 2), Length: n % (res.NumElements + 2)}, Average: true})
			if err != nil {
				return // the agent is broken after a bad range, as it should be
			}
			seq++
		}
	})
}
