package rpc

import (
	"errors"
	"io"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

func TestFirst(t *testing.T) {
	pick := func(m *pb.ConnectRequest) *pb.Hello { return m.GetHello() }
	hello := &pb.ConnectRequest{Msg: &pb.ConnectRequest_Hello{Hello: &pb.Hello{WorkerId: "w0"}}}
	m, h, err := First(func() (*pb.ConnectRequest, error) { return hello, nil }, pick, "Connect", "hello")
	if err != nil || m != hello || h.GetWorkerId() != "w0" {
		t.Fatalf("hello first: %v %v %v", m, h, err)
	}
	other := &pb.ConnectRequest{Msg: &pb.ConnectRequest_Heartbeat{Heartbeat: &pb.Heartbeat{}}}
	_, h, err = First(func() (*pb.ConnectRequest, error) { return other, nil }, pick, "Connect", "hello")
	if status.Code(err) != codes.InvalidArgument || h != nil || err.Error() != "rpc error: code = InvalidArgument desc = the first message on Connect must be a hello" {
		t.Fatalf("heartbeat first: %v %v", h, err)
	}
	_, _, err = First(func() (*pb.ConnectRequest, error) { return nil, io.EOF }, pick, "Connect", "hello")
	if !errors.Is(err, io.EOF) {
		t.Fatalf("receive error: %v, want io.EOF", err)
	}
}

func TestCheckLen(t *testing.T) {
	if err := CheckLen("join.job_id", "j", 1, 128); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"", string(make([]byte, 129))} {
		if err := CheckLen("join.job_id", v, 1, 128); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("len %d: %v", len(v), err)
		}
	}
	if got := status.Convert(CheckLen("join.job_id", "", 1, 128)).Message(); got != "join.job_id must be 1..128 bytes, got 0" {
		t.Fatalf("message %q", got)
	}
}
