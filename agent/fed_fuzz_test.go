package agent

import (
	"context"
	"io"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// fakeJoin is a Join stream of scripted messages.
type fakeJoin struct {
	grpc.ServerStream
	msgs []*pb.FedAgentJoinRequest
}

func (f *fakeJoin) Recv() (*pb.FedAgentJoinRequest, error) {
	if len(f.msgs) == 0 {
		return nil, io.EOF
	}
	m := f.msgs[0]
	f.msgs = f.msgs[1:]
	return m, nil
}
func (f *fakeJoin) SendAndClose(*pb.FedAgentJoinResponse) error { return nil }
func (f *fakeJoin) Context() context.Context                    { return context.Background() }

// FuzzFedJoin feeds a federated script's Join stream arbitrary messages
// (up to three, each decoded from a piece of the input): a join that is
// malformed is refused with an error, one that is whole is taken; never
// a panic, and never an allocation sized by the layout's claim alone.
func FuzzFedJoin(f *testing.F) {
	layout := &pb.FedAgentJoinRequest{Tensors: []*pb.TensorInfo{{Name: "w", Shape: []int64{2, 2}, Dtype: "float32"}}, Data: encode([]float32{1, 2})}
	rest := &pb.FedAgentJoinRequest{Data: encode([]float32{3, 4})}
	huge := &pb.FedAgentJoinRequest{Tensors: []*pb.TensorInfo{{Name: "w", Shape: []int64{1 << 32}, Dtype: "float32"}}}
	for _, ms := range [][]*pb.FedAgentJoinRequest{{layout, rest}, {huge}, {layout}} {
		var parts [3][]byte
		for i, m := range ms {
			parts[i], _ = proto.Marshal(m)
		}
		f.Add(parts[0], parts[1], parts[2])
	}
	f.Fuzz(func(t *testing.T, a, b, c []byte) {
		var msgs []*pb.FedAgentJoinRequest
		for _, p := range [][]byte{a, b, c} {
			var m pb.FedAgentJoinRequest
			if len(p) == 0 || proto.Unmarshal(p, &m) != nil {
				break
			}
			msgs = append(msgs, &m)
		}
		if len(msgs) == 0 {
			return
		}
		s := NewFed(FedConfig{JobID: "j", Client: 0, NumClients: 2, Rounds: 1})
		if err := s.Join(&fakeJoin{msgs: msgs}); err == nil {
			j := s.Joining()
			n, _, _ := layoutSum(j.Layout)
			if int64(len(j.Initial)) != n {
				t.Fatalf("joined with %d initial values for a layout of %d", len(j.Initial), n)
			}
		}
	})
}
