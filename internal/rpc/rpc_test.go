package rpc_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/gradsync/gradsync/internal/logbuf"
	"github.com/gradsync/gradsync/internal/rpc"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// panicky is a JobService whose handlers panic (a bug) — the recovery
// interceptor must turn that into Internal, not a crash.
type panicky struct {
	pb.UnimplementedJobServiceServer
}

func (panicky) GetJob(context.Context, *pb.GetJobRequest) (*pb.GetJobResponse, error) {
	panic("boom")
}

func (panicky) WatchJob(*pb.WatchJobRequest, pb.JobService_WatchJobServer) error {
	panic("stream boom")
}

func (panicky) ListJobs(context.Context, *pb.ListJobsRequest) (*pb.ListJobsResponse, error) {
	return &pb.ListJobsResponse{}, nil
}

func TestInterceptors(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	logs := &logbuf.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	lis := bufconn.Listen(1 << 20)
	s := grpc.NewServer(rpc.ServerOptions(log, nil, nil)...)
	pb.RegisterJobServiceServer(s, panicky{})
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
	c := pb.NewJobServiceClient(conn)

	_, err = c.GetJob(ctx, &pb.GetJobRequest{JobId: "j"})
	if st, _ := status.FromError(err); st.Code() != codes.Internal || !strings.Contains(st.Message(), "boom") {
		t.Errorf("panicking unary handler: %v; want Internal", err)
	}
	stream, err := c.WatchJob(ctx, &pb.WatchJobRequest{JobId: "j"})
	if err == nil {
		_, err = stream.Recv()
	}
	if st, _ := status.FromError(err); st.Code() != codes.Internal {
		t.Errorf("panicking stream handler: %v; want Internal", err)
	}
	// The validator runs before the handler: an empty id never reaches it.
	_, err = c.GetJob(ctx, &pb.GetJobRequest{})
	if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "job_id") {
		t.Errorf("GetJob without id: %v; want InvalidArgument naming job_id", err)
	}
	_, err = c.ListJobs(ctx, &pb.ListJobsRequest{PageSize: -1})
	if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument {
		t.Errorf("ListJobs page_size -1: %v; want InvalidArgument", err)
	}
	if _, err := c.ListJobs(ctx, &pb.ListJobsRequest{}); err != nil {
		t.Errorf("ListJobs: %v", err)
	}
	// The server survived, and the panic was logged with its stack.
	if !strings.Contains(logs.String(), "panic in RPC handler") {
		t.Errorf("no panic log line in:\n%s", logs.String())
	}
}
