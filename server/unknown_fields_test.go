package server_test

import (
	"errors"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	encproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
	"github.com/gradsync/gradsync/server"
)

// rawBytes is a codec that sends a *[]byte as the request's encoding
// (under the proto codec's name, so the server decodes it as usual) and
// decodes replies with the proto codec: a client built from another
// version of the messages.
type rawBytes struct{}

func (rawBytes) Name() string { return encproto.Name }

func (rawBytes) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.(*[]byte); ok {
		return mem.BufferSlice{mem.SliceBuffer(*b)}, nil
	}
	return encoding.GetCodecV2(encproto.Name).Marshal(v)
}

func (rawBytes) Unmarshal(data mem.BufferSlice, v any) error {
	return encoding.GetCodecV2(encproto.Name).Unmarshal(data, v)
}

func appendField99(b []byte) []byte {
	return protowire.AppendVarint(protowire.AppendTag(b, 99, protowire.VarintType), 1)
}

// TestUnknownFieldsRefused: a request with a field the server does not
// know — at the top, inside the spec, or a known field with the wrong
// wire type — is refused with InvalidArgument naming it, and no job is
// created; the same request without it is accepted.
func TestUnknownFieldsRefused(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	c := newCluster(t, server.Config{}, 0)
	raw := grpc.ForceCodecV2(rawBytes{})
	submit := func(b []byte) error {
		return c.conn.Invoke(ctx, pb.JobService_SubmitJob_FullMethodName, &b, &pb.SubmitJobResponse{}, raw)
	}
	marshal := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	spec99 := appendField99(marshal(&pb.JobSpec{Model: "mlp", Dataset: &pb.DatasetSpec{Name: "synthetic"}}))
	nested := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), spec99)

	wantCode(t, "SubmitJob with field 99 in JobSpec", submit(nested), codes.InvalidArgument,
		"unknown field 99 in gradsync.v1.JobSpec (spec)")
	// 08 01 is field 1 (spec, a message) as a varint: protobuf-go keeps it
	// among the unknown fields, and without this check it queued a
	// default mlp job.
	wantCode(t, "SubmitJob 08 01", submit([]byte{0x08, 0x01}), codes.InvalidArgument,
		"field 1 (spec) in gradsync.v1.SubmitJobRequest has wire type varint")
	wantCode(t, "SubmitJob with field 99 at the top", submit(appendField99(marshal(&pb.SubmitJobRequest{
		Spec: &pb.JobSpec{Model: "mlp", Dataset: &pb.DatasetSpec{Name: "synthetic"}}}))),
		codes.InvalidArgument, "unknown field 99 in gradsync.v1.SubmitJobRequest")

	b := appendField99(nil)
	err := c.conn.Invoke(ctx, pb.ClusterService_ListWorkers_FullMethodName, &b, &pb.ListWorkersResponse{}, raw)
	wantCode(t, "ListWorkers with field 99", err, codes.InvalidArgument, "unknown field 99 in gradsync.v1.ListWorkersRequest")

	// A stream: the worker's hello carries a field this server lacks.
	st, err := c.conn.NewStream(ctx, &pb.Coordinator_ServiceDesc.Streams[0], pb.Coordinator_Connect_FullMethodName, raw)
	if err != nil {
		t.Fatal(err)
	}
	hello := appendField99(marshal(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Hello{Hello: &pb.Hello{WorkerId: "w-new"}}}))
	if err := st.SendMsg(&hello); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	err = st.RecvMsg(&pb.ConnectResponse{})
	wantCode(t, "Connect with field 99 in the hello", err, codes.InvalidArgument, "unknown field 99 in gradsync.v1.ConnectRequest")

	// The worker-facing streams, on the plain proto codec (framecodec's
	// frames are parsed by framecodec itself and not checked): the first
	// message carries field 99.
	streams := []struct {
		name string
		desc *grpc.StreamDesc
		full string
		msg  proto.Message
		want string
	}{
		{"ParameterServer.Sync", &pb.ParameterServer_ServiceDesc.Streams[0], pb.ParameterServer_Sync_FullMethodName,
			&pb.SyncRequest{}, "unknown field 99 in gradsync.v1.SyncRequest"},
		{"ParameterServer.Pull", &pb.ParameterServer_ServiceDesc.Streams[1], pb.ParameterServer_Pull_FullMethodName,
			&pb.PullRequest{JobId: "job-x"}, "unknown field 99 in gradsync.v1.PullRequest"},
		{"Federation.Participate", &pb.Federation_ServiceDesc.Streams[0], pb.Federation_Participate_FullMethodName,
			&pb.ParticipateRequest{}, "unknown field 99 in gradsync.v1.ParticipateRequest"},
	}
	for _, sc := range streams {
		st, err := c.conn.NewStream(ctx, sc.desc, sc.full, raw)
		if err != nil {
			t.Fatal(err)
		}
		b := appendField99(marshal(sc.msg))
		if err := st.SendMsg(&b); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		_ = st.CloseSend()
		var resp emptypb.Empty // any reply would do: the call must fail first
		wantCode(t, sc.name+" with field 99", st.RecvMsg(&resp), codes.InvalidArgument, sc.want)
	}

	list, err := c.jobs.ListJobs(ctx, &pb.ListJobsRequest{})
	if err != nil || len(list.Jobs) != 0 {
		t.Fatalf("refused requests created jobs: %v, %v", list, err)
	}
	workers, err := c.cl.ListWorkers(ctx, &pb.ListWorkersRequest{})
	if err != nil || len(workers.Workers) != 0 {
		t.Fatalf("a refused hello registered a worker: %v, %v", workers, err)
	}

	// Without the unknown field the same request is a job.
	ok := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), marshal(&pb.JobSpec{Model: "mlp", Dataset: &pb.DatasetSpec{Name: "synthetic"}}))
	if err := submit(ok); err != nil {
		t.Fatalf("plain SubmitJob: %v", err)
	}
	list, err = c.jobs.ListJobs(ctx, &pb.ListJobsRequest{})
	if err != nil || len(list.Jobs) != 1 {
		t.Fatalf("after one good submit: %v, %v; want one job", list, err)
	}
}
