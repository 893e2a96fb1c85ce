package paramserver_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/internal/wire"
	"github.com/gradsync/gradsync/paramserver"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// service is a `gradsync aggregator`'s Sync handler (ShardServer.Sync)
// that reports each stream's end; read gets a value each time the shard
// has read a gradient frame.
type service struct {
	pb.UnimplementedParameterServerServer
	agg   *paramserver.ShardServer
	ended chan error
	read  chan struct{}
}

func (s service) Sync(stream pb.ParameterServer_SyncServer) error {
	err := s.agg.Sync(watched{stream, s.read})
	s.ended <- err
	return err
}

// watched is a Sync stream whose gradient frames the test sees read.
type watched struct {
	pb.ParameterServer_SyncServer
	read chan struct{}
}

// Recv is how the shard reads a client that speaks plain protobuf, as
// this test's does.
func (w watched) Recv() (*pb.SyncRequest, error) {
	m, err := w.ParameterServer_SyncServer.Recv()
	if err == nil && m.GetGradient() != nil {
		w.read <- struct{}{}
	}
	return m, err
}

// startShard serves the shards of `gradsync aggregator` over an
// in-memory listener until the test ends; it returns a client, the
// channel each served stream's result arrives on and the one that hears
// of each gradient frame a shard reads.
func startShard(t *testing.T) (pb.ParameterServerClient, chan error, chan struct{}) {
	t.Helper()
	agg, err := paramserver.NewShardServer(paramserver.ShardServerConfig{Insecure: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	ended, read := make(chan error, 2), make(chan struct{}, 4)
	pb.RegisterParameterServerServer(srv, service{agg: agg, ended: ended, read: read})
	served := make(chan struct{})
	go func() { // owned by the test: ends with srv.Stop
		defer close(served)
		_ = srv.Serve(lis)
	}()
	conn, err := grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		<-served
	})
	return pb.NewParameterServerClient(conn), ended, read
}

// TestServeReturnsOnCancel: a rank's stream to its shard (an
// aggregator's; the coordinator's Group serves it the same way) that the
// rank cancels mid step, in the middle of its push or while its stream
// waits for the other rank's, ends the shard's loop serving it with
// Canceled, and nothing is left running (goleak, TestMain).
func TestServeReturnsOnCancel(t *testing.T) {
	for _, whole := range []bool{false, true} {
		name := map[bool]string{false: "mid-push", true: "waiting for the other rank"}[whole]
		t.Run(name, func(t *testing.T) {
			ps, ended, read := startShard(t)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			sctx, stop := context.WithCancel(ctx)
			defer stop()
			st, err := ps.Sync(sctx)
			if err != nil {
				t.Fatal(err)
			}
			spec := &pb.JobSpec{
				Model: "logreg", Mode: "ps", Workers: proto.Int32(2), Epochs: proto.Int32(1), Seed: proto.Int64(3),
				ParameterServer: &pb.ParameterServerSpec{Addresses: []string{"bufnet:1"}},
				Dataset:         &pb.DatasetSpec{Name: "synthetic", SyntheticTrain: 200, SyntheticTest: 50},
			}
			const n = 28*28*10 + 10 // logreg's parameters on the synthetic set
			join := &pb.SyncJoin{JobId: "job-1", Generation: 1, Rank: 0, WorldSize: 2, NumParams: n, TotalSteps: 5, TrainExamples: 200, NumShards: 1, Spec: spec}
			if err := st.Send(&pb.SyncRequest{Msg: &pb.SyncRequest_Join{Join: join}}); err != nil {
				t.Fatal(err)
			}
			for { // the initial parameters
				m, err := st.Recv()
				if err != nil {
					t.Fatal(err)
				}
				if m.GetParameters().GetLast() {
					break
				}
			}
			k := n / 2
			if whole {
				k = n
			}
			f := &pb.TensorFrame{JobId: "job-1", Generation: 1, Op: pb.Op_OP_PUSH_GRADIENT, Step: 0, Total: uint64(n),
				Dtype: pb.DType_D_TYPE_F32, Last: whole, Data: wire.PutF32(make([]byte, 4*k), make([]float32, k))}
			if err := st.Send(&pb.SyncRequest{Msg: &pb.SyncRequest_Gradient{Gradient: f}}); err != nil {
				t.Fatal(err)
			}
			// The shard has the frame: it is in its receive loop (a
			// partial push) or about to wait for rank 1 (a whole one).
			select {
			case <-read:
			case <-ctx.Done():
				t.Fatal("the shard never read the gradient frame")
			}
			stop()
			select {
			case err := <-ended:
				if status.Code(err) != codes.Canceled {
					t.Errorf("the shard's loop returned %v; want Canceled", err)
				}
			case <-ctx.Done():
				t.Fatal("the shard's loop did not return after the rank cancelled its stream")
			}
			if _, err := st.Recv(); err == nil || err == io.EOF {
				t.Errorf("the cancelled stream: Recv %v", err)
			}
		})
	}
}
