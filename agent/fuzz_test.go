package agent

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/aggregator"
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
