package rpc_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	encproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/internal/rpc"
	"github.com/gradsync/gradsync/internal/wire/framecodec"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// withField99 is b followed by field 99 as a varint: a field no gradsync
// message has.
func withField99(b []byte) []byte {
	b = protowire.AppendTag(b, 99, protowire.VarintType)
	return protowire.AppendVarint(b, 1)
}

func mustMarshal(t testing.TB, m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// submitWith99InSpec is a SubmitJobRequest whose spec carries field 99.
func submitWith99InSpec(t testing.TB) []byte {
	spec := withField99(mustMarshal(t, &pb.JobSpec{Model: "mlp"}))
	b := protowire.AppendTag(nil, 1, protowire.BytesType)
	return protowire.AppendBytes(b, spec)
}

func TestCheckUnknown(t *testing.T) {
	cases := []struct {
		name  string
		raw   []byte
		into  proto.Message
		wants []string // all in the error; none means accepted
	}{
		{"known fields only", mustMarshal(t, &pb.SubmitJobRequest{Spec: &pb.JobSpec{Model: "mlp"}}), &pb.SubmitJobRequest{}, nil},
		{"empty", nil, &pb.SubmitJobRequest{}, nil},
		{"top level", withField99(mustMarshal(t, &pb.GetJobRequest{JobId: "j"})), &pb.GetJobRequest{},
			[]string{"unknown field 99 in gradsync.v1.GetJobRequest:"}},
		{"nested", submitWith99InSpec(t), &pb.SubmitJobRequest{},
			[]string{"unknown field 99 in gradsync.v1.JobSpec (spec)"}},
		{"two levels down", func() []byte {
			ds := withField99(mustMarshal(t, &pb.DatasetSpec{Name: "mnist"}))
			num := (&pb.JobSpec{}).ProtoReflect().Descriptor().Fields().ByName("dataset").Number()
			spec := protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), ds)
			return protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), spec)
		}(), &pb.SubmitJobRequest{}, []string{"unknown field 99 in gradsync.v1.DatasetSpec (spec.dataset)"}},
		// spec (field 1, a message) sent as a varint: protobuf-go keeps it
		// among the unknown fields rather than failing the decode.
		{"wrong wire type", []byte{0x08, 0x01}, &pb.SubmitJobRequest{},
			[]string{"field 1 (spec) in gradsync.v1.SubmitJobRequest has wire type varint", "message field is encoded as length-delimited"}},
		{"in a list", func() []byte {
			w := withField99(mustMarshal(t, &pb.Worker{Id: "w"}))
			return protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), w)
		}(), &pb.ListWorkersResponse{}, []string{"unknown field 99 in gradsync.v1.Worker (workers[0])"}},
	}
	for _, tc := range cases {
		if err := proto.Unmarshal(tc.raw, tc.into); err != nil {
			t.Fatalf("%s: the proto codec refused the bytes itself: %v", tc.name, err)
		}
		err := rpc.CheckUnknown(tc.into)
		if len(tc.wants) == 0 {
			if err != nil {
				t.Errorf("%s: %v; want accepted", tc.name, err)
			}
			continue
		}
		st, _ := status.FromError(err)
		if st.Code() != codes.InvalidArgument {
			t.Errorf("%s: %v; want InvalidArgument", tc.name, err)
			continue
		}
		for _, w := range tc.wants {
			if !strings.Contains(st.Message(), w) {
				t.Errorf("%s: %q does not say %q", tc.name, st.Message(), w)
			}
		}
	}
	// What framecodec decodes itself, and what is no proto message, is
	// not inspected.
	if err := rpc.CheckUnknown(&framecodec.SyncRequest{}); err != nil {
		t.Errorf("framecodec message: %v", err)
	}
	if err := rpc.CheckUnknown("not a message"); err != nil {
		t.Errorf("string: %v", err)
	}
	if err := rpc.CheckUnknown((*pb.GetJobRequest)(nil)); err != nil {
		t.Errorf("nil message: %v", err)
	}
}

// rawCodec sends []byte as the request's encoding (under the proto
// codec's name, so the server decodes it with the proto codec) and
// decodes replies with the proto codec: a client that speaks a different
// version of the messages.
type rawCodec struct{}

func (rawCodec) Name() string { return encproto.Name }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.(*[]byte); ok {
		return mem.BufferSlice{mem.SliceBuffer(*b)}, nil
	}
	return encoding.GetCodecV2(encproto.Name).Marshal(v)
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return encoding.GetCodecV2(encproto.Name).Unmarshal(data, v)
}

// recording is a JobService that counts the requests its handlers see.
type recording struct {
	pb.UnimplementedJobServiceServer
	seen chan string
}

func (r recording) SubmitJob(_ context.Context, req *pb.SubmitJobRequest) (*pb.SubmitJobResponse, error) {
	r.seen <- "submit " + req.GetSpec().GetModel()
	return &pb.SubmitJobResponse{Job: &pb.Job{Id: "job-1"}}, nil
}

func (r recording) WatchJob(req *pb.WatchJobRequest, _ pb.JobService_WatchJobServer) error {
	r.seen <- "watch " + req.GetJobId()
	return nil
}

func TestRefuseUnknownOnTheWire(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	lis := bufconn.Listen(1 << 20)
	s := grpc.NewServer(rpc.ServerOptions(slog.New(slog.DiscardHandler), nil, nil)...)
	srv := recording{seen: make(chan string, 16)}
	pb.RegisterJobServiceServer(s, srv)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(lis) }()
	defer func() { s.Stop(); <-done }()
	conn, err := grpc.NewClient("passthrough:///bufnet", append(rpc.DialOptions(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw := grpc.ForceCodecV2(rawCodec{})

	unary := func(b []byte) error {
		return conn.Invoke(ctx, pb.JobService_SubmitJob_FullMethodName, &b, &pb.SubmitJobResponse{}, raw)
	}
	watch := func(b []byte) error {
		st, err := conn.NewStream(ctx, &pb.JobService_ServiceDesc.Streams[0], pb.JobService_WatchJob_FullMethodName, raw)
		if err != nil {
			return err
		}
		if err := st.SendMsg(&b); err != nil {
			return err
		}
		if err := st.CloseSend(); err != nil {
			return err
		}
		var resp pb.WatchJobResponse
		err = st.RecvMsg(&resp)
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
	refused := []struct {
		name string
		call func() error
		want string
	}{
		{"SubmitJob, field 99 in spec", func() error { return unary(submitWith99InSpec(t)) }, "unknown field 99 in gradsync.v1.JobSpec (spec)"},
		{"SubmitJob, spec as a varint", func() error { return unary([]byte{0x08, 0x01}) }, "field 1 (spec) in gradsync.v1.SubmitJobRequest has wire type varint"},
		{"SubmitJob, field 99 at the top", func() error {
			return unary(withField99(mustMarshal(t, &pb.SubmitJobRequest{Spec: &pb.JobSpec{Model: "mlp"}})))
		}, "unknown field 99 in gradsync.v1.SubmitJobRequest:"},
		{"WatchJob (a stream), field 99", func() error { return watch(withField99(mustMarshal(t, &pb.WatchJobRequest{JobId: "j"}))) },
			"unknown field 99 in gradsync.v1.WatchJobRequest:"},
	}
	for _, tc := range refused {
		err := tc.call()
		if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.want) {
			t.Errorf("%s: %v; want InvalidArgument saying %q", tc.name, err, tc.want)
		}
	}
	select {
	case got := <-srv.seen:
		t.Errorf("a refused request reached its handler: %s", got)
	default:
	}

	// Requests the server knows in full still go through, on both paths.
	if err := unary(mustMarshal(t, &pb.SubmitJobRequest{Spec: &pb.JobSpec{Model: "mlp"}})); err != nil {
		t.Errorf("plain SubmitJob: %v", err)
	}
	if err := watch(mustMarshal(t, &pb.WatchJobRequest{JobId: "j"})); err != nil {
		t.Errorf("plain WatchJob: %v", err)
	}
	for _, want := range []string{"submit mlp", "watch j"} {
		if got := <-srv.seen; got != want {
			t.Errorf("handler saw %q; want %q", got, want)
		}
	}
}

// FuzzCheckUnknown: whatever bytes arrive as a SubmitJobRequest, decoding
// and the unknown-field check never panic; a refusal is InvalidArgument,
// and a request let through re-encodes to the same message.
func FuzzCheckUnknown(f *testing.F) {
	f.Add([]byte{0x08, 0x01})
	f.Add(submitWith99InSpec(f))
	f.Add(mustMarshal(f, &pb.SubmitJobRequest{Spec: &pb.JobSpec{Model: "mlp", Dataset: &pb.DatasetSpec{Name: "mnist"}}, ResumeJobId: "job-1"}))
	f.Add([]byte{0x0a, 0x03, 0xf8, 0x06}) // a truncated field inside spec
	f.Fuzz(func(t *testing.T, b []byte) {
		var req pb.SubmitJobRequest
		if proto.Unmarshal(b, &req) != nil {
			return // the proto codec refuses it before any interceptor runs
		}
		err := rpc.CheckUnknown(&req)
		if err != nil {
			if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument {
				t.Fatalf("%v; want InvalidArgument", err)
			}
			return
		}
		// Accepted: re-encoding what was decoded loses nothing.
		again, mErr := proto.Marshal(&req)
		if mErr != nil {
			t.Fatal(mErr)
		}
		var back pb.SubmitJobRequest
		if uErr := proto.Unmarshal(again, &back); uErr != nil || !proto.Equal(&req, &back) {
			t.Fatalf("an accepted request does not round-trip: %v", uErr)
		}
	})
}
