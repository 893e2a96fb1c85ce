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
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/internal/wire/framecodec"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/paramserver"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// psService is the coordinator's ParameterServer for one job's Group;
// pushed is closed once the shard has read the last frame of a push.
type psService struct {
	pb.UnimplementedParameterServerServer
	g      *paramserver.Group
	pushed chan struct{}
	once   *sync.Once
}

func (s psService) Sync(stream pb.ParameterServer_SyncServer) error {
	join, err := paramserver.RecvJoin(stream)
	if err != nil {
		return err
	}
	return s.g.Serve(watchedStream{stream, s}, join)
}

// watchedStream is a Sync stream whose reads the test watches.
type watchedStream struct {
	pb.ParameterServer_SyncServer
	s psService
}

func (w watchedStream) RecvMsg(m any) error {
	err := w.ParameterServer_SyncServer.RecvMsg(m)
	if r, ok := m.(*framecodec.SyncRequest); ok && err == nil && r.Msg == framecodec.FieldGradient && r.Frame.Last {
		w.s.once.Do(func() { close(w.s.pushed) })
	}
	return err
}

// TestPSClientHonoursContext: rank 0 of a 2-rank ps job joins the real
// parameter server over gRPC and pushes its gradient of step 0; rank 1
// never does, so the answer never comes. Cancelling the step's context
// ends the step at once (no step timeout involved), with the context's
// error; a step under a context already ended sends nothing; and closing
// the client leaves nothing running (goleak, TestMain).
func TestPSClientHonoursContext(t *testing.T) {
	spec, err := jobspec.Normalize(&pb.JobSpec{
		Model: "logreg", Mode: "ps", Workers: proto.Int32(2), Epochs: proto.Int32(1), Seed: proto.Int64(3),
		StepTimeoutSeconds: 600, // far beyond the test's wait: only the context can end the step
		Dataset:            &pb.DatasetSpec{Name: "synthetic", SyntheticTrain: 200, SyntheticTest: 50},
	}, models.Names())
	if err != nil {
		t.Fatal(err)
	}
	c, h, w, classes := jobspec.InputShape(spec)
	net0, err := models.New(spec.Model, models.Options{Channels: c, Height: h, Width: w, Classes: classes, Seed: spec.GetSeed()})
	if err != nil {
		t.Fatal(err)
	}
	g, err := paramserver.NewGroup(paramserver.Env{Now: time.Now, Log: slog.New(slog.DiscardHandler)}, "job-1", 1, 2, net0, spec, "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Abort(errors.New("test over"))
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	svc := psService{g: g, pushed: make(chan struct{}), once: new(sync.Once)}
	pb.RegisterParameterServerServer(srv, svc)
	served := make(chan struct{})
	go func() { // owned by the test: ends with srv.Stop
		defer close(served)
		_ = srv.Serve(lis)
	}()
	defer func() { srv.Stop(); <-served }()
	conn, err := grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	a := &pb.Assignment{JobId: "job-1", Generation: 1, Rank: 0, WorldSize: 2, Spec: spec}
	env := &taskEnv{conn: conn, log: slog.New(slog.DiscardHandler)}
	ps, err := joinPS(ctx, env, a, net0, 5, psStart{trainExamples: 200})
	if err != nil {
		t.Fatal(err)
	}
	defer ps.close()
	grads, params := make([]float32, net0.NumParams()), make([]float32, net0.NumParams())

	ended, stop := context.WithCancel(ctx)
	stop()
	if err := ps.step(ended, grads, params); !errors.Is(err, context.Canceled) {
		t.Fatalf("a step under an ended context: %v; want context.Canceled", err)
	}

	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ps.step(sctx, grads, params) }() // owned by the test: ends when sctx does
	// Mid step: the shard has rank 0's whole push.
	select {
	case <-svc.pushed:
	case <-ctx.Done():
		t.Fatal("the shard never read rank 0's push")
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
