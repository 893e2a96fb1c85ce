package worker

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/paramserver"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// sentWatch is a stream interceptor of a rank's connections to its
// shards: sent is closed once a message other than a *pb.SyncRequest
// (the join) went out, which is a gradient frame on framecodec's fast
// path (logreg's gradient is one frame).
func sentWatch(sent chan struct{}) grpc.DialOption {
	var once sync.Once
	return grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		return watchedClient{cs, func() { once.Do(func() { close(sent) }) }}, err
	})
}

type watchedClient struct {
	grpc.ClientStream
	sent func()
}

func (w watchedClient) SendMsg(m any) error {
	err := w.ClientStream.SendMsg(m)
	if _, join := m.(*pb.SyncRequest); err == nil && !join {
		w.sent()
	}
	return err
}

// TestPSClientHonoursContext: rank 0 of a 2-rank ps job joins its shard,
// a `gradsync aggregator` (ShardServer) on loopback, and pushes its
// gradient of step 0; rank 1 never does, so the answer never comes.
// Cancelling the step's context ends the step at once (no step timeout
// involved), with the context's error; a step under a context already
// ended sends nothing; and closing the client leaves nothing running
// (goleak, TestMain).
func TestPSClientHonoursContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	agg, err := paramserver.NewShardServer(paramserver.ShardServerConfig{Insecure: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	actx, stopAgg := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- agg.Serve(actx, lis) }() // owned by the test: ends with stopAgg
	defer func() {
		stopAgg()
		if err := <-served; err != nil {
			t.Errorf("aggregator: %v", err)
		}
	}()

	spec, err := jobspec.Normalize(&pb.JobSpec{
		Model: "logreg", Mode: "ps", Workers: proto.Int32(2), Epochs: proto.Int32(1), Seed: proto.Int64(3),
		StepTimeoutSeconds: 600, // far beyond the test's wait: only the context can end the step
		ParameterServer:    &pb.ParameterServerSpec{Addresses: []string{lis.Addr().String()}},
		Dataset:            &pb.DatasetSpec{Name: "synthetic", SyntheticTrain: 200, SyntheticTest: 50},
	}, models.Names())
	if err != nil {
		t.Fatal(err)
	}
	c, h, w, classes := jobspec.InputShape(spec)
	model, err := models.New(spec.Model, models.Options{Channels: c, Height: h, Width: w, Classes: classes, Seed: spec.GetSeed()})
	if err != nil {
		t.Fatal(err)
	}
	sent := make(chan struct{})
	env := &taskEnv{log: slog.New(slog.DiscardHandler), psDial: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), sentWatch(sent)}}
	a := &pb.Assignment{JobId: "job-1", Generation: 1, Rank: 0, WorldSize: 2, Spec: spec, PsAddresses: spec.GetParameterServer().GetAddresses()}
	ps, err := joinPS(ctx, env, a, model, 5, psStart{trainExamples: 200})
	if err != nil {
		t.Fatal(err)
	}
	defer ps.close()
	grads, params := make([]float32, model.NumParams()), make([]float32, model.NumParams())

	ended, stop := context.WithCancel(ctx)
	stop()
	if err := ps.step(ended, grads, params); !errors.Is(err, context.Canceled) {
		t.Fatalf("a step under an ended context: %v; want context.Canceled", err)
	}

	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ps.step(sctx, grads, params) }() // owned by the test: ends when sctx does
	// Mid step: rank 0's push is out, and no answer can come.
	select {
	case <-sent:
	case <-ctx.Done():
		t.Fatal("rank 0 never pushed")
	}
	stop()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) && status.Code(err) != codes.Canceled {
			t.Fatalf("the cancelled step: %v; want it cancelled", err)
		}
		if ctx.Err() != nil {
			t.Fatal("the step returned only when the test's own deadline passed")
		}
	case <-ctx.Done():
		t.Fatal("the step did not return after its context was cancelled")
	}
}
