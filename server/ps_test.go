package server_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/gradsync/gradsync/internal/wire/framecodec"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
	"github.com/gradsync/gradsync/server"
)

// psHarness holds one fake worker; each call of start runs a fresh
// one-worker job on it whose parameter server nobody else talks to.
type psHarness struct {
	c *cluster
	f *fakeWorker
	// opts open the Sync streams: none speaks plain protobuf (as grpcurl
	// and workers in other languages do), fastCodec the codec gradsync's
	// workers use.
	opts []grpc.CallOption
}

// codecs are the ways a client may open a Sync stream.
var codecs = []struct {
	name string
	opts []grpc.CallOption
}{{"proto", nil}, {"framecodec", []grpc.CallOption{framecodec.CallOption()}}}

func newPSHarness(ctx context.Context, t *testing.T) *psHarness {
	c := newCluster(t, server.Config{HeartbeatTimeout: time.Minute}, 0)
	return &psHarness{c: c, f: c.connectFake(ctx, "fake-ps", true)}
}

// start submits a one-worker job and returns the assignment the fake
// worker receives for it.
func (h *psHarness) start(ctx context.Context, t *testing.T) *pb.Assignment {
	t.Helper()
	job := h.c.submit(ctx, longSpec(1))
	for {
		m := h.f.next(ctx, t)
		if a := m.GetAssignment(); a != nil {
			if a.JobId != job.Id || a.Generation != 1 || a.WorldSize != 1 || a.NumParams <= 0 {
				t.Fatalf("assignment %v for job %s", a, job.Id)
			}
			return a
		}
	}
}

// cancel ends the job so that the fake worker is free for the next one.
func (h *psHarness) cancel(ctx context.Context, t *testing.T, a *pb.Assignment) {
	t.Helper()
	if _, err := h.c.jobs.CancelJob(ctx, &pb.CancelJobRequest{JobId: a.JobId}); err != nil {
		t.Fatal(err)
	}
}

func goodJoin(a *pb.Assignment) *pb.SyncJoin {
	return &pb.SyncJoin{JobId: a.JobId, Generation: a.Generation, Rank: 0, WorldSize: a.WorldSize, NumParams: a.NumParams, TotalSteps: 100}
}

// join opens a Sync stream, sends join and reads the initial parameters.
// It returns the stream, the parameters, and the stream's error (if the
// server refused the join).
func (h *psHarness) join(ctx context.Context, t *testing.T, j *pb.SyncJoin) (pb.ParameterServer_SyncClient, []float32, error) {
	t.Helper()
	stream, err := h.c.ps.Sync(ctx, h.opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.SyncRequest{Msg: &pb.SyncRequest_Join{Join: j}}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	params, err := recvParams(stream, j.GetNumParams(), 0)
	return stream, params, err
}

// recvParams reads one whole parameter tensor tagged with step.
func recvParams(stream pb.ParameterServer_SyncClient, n, step int64) ([]float32, error) {
	var out []float32
	for {
		m, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		f := m.GetParameters()
		if f.GetStep() != step || f.GetOp() != pb.Op_OP_PULL_PARAMETERS || int64(f.GetTotal()) != n || int(f.GetOffset()) != len(out) {
			return nil, errors.New("unexpected parameter frame " + f.String())
		}
		for i := 0; i+4 <= len(f.Data); i += 4 {
			out = append(out, math.Float32frombits(binary.LittleEndian.Uint32(f.Data[i:])))
		}
		if f.Last {
			return out, nil
		}
	}
}

// gradFrame is a whole-tensor gradient frame of n values v for step.
func gradFrame(a *pb.Assignment, step int64, v float32) *pb.TensorFrame {
	data := make([]byte, 4*a.NumParams)
	for i := int64(0); i < a.NumParams; i++ {
		binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
	}
	return &pb.TensorFrame{JobId: a.JobId, Generation: a.Generation, Op: pb.Op_OP_PUSH_GRADIENT, Step: step,
		Rank: 0, Offset: 0, Total: uint64(a.NumParams), Dtype: pb.DType_D_TYPE_F32, Data: data, Last: true}
}

// sendGrad sends a frame and returns the error the stream ends with (or
// nil when parameters come back).
func sendGrad(stream pb.ParameterServer_SyncClient, f *pb.TensorFrame, n, wantStep int64) error {
	if err := stream.Send(&pb.SyncRequest{Msg: &pb.SyncRequest_Gradient{Gradient: f}}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	_, err := recvParams(stream, n, wantStep)
	return err
}

func TestParameterServerJoinRefusals(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	h := newPSHarness(ctx, t)
	a := h.start(ctx, t)
	mod := func(f func(j *pb.SyncJoin)) *pb.SyncJoin {
		j := goodJoin(a)
		f(j)
		return j
	}
	cases := []struct {
		name string
		join *pb.SyncJoin
		code codes.Code
		msg  string
	}{
		{"unknown job", mod(func(j *pb.SyncJoin) { j.JobId = "job-nope" }), codes.NotFound, "job-nope"},
		{"stale generation", mod(func(j *pb.SyncJoin) { j.Generation = 0 }), codes.Aborted, "generation"},
		{"future generation", mod(func(j *pb.SyncJoin) { j.Generation = 2 }), codes.Aborted, "generation"},
		{"rank out of range", mod(func(j *pb.SyncJoin) { j.Rank = 1 }), codes.InvalidArgument, "rank"},
		{"negative rank", mod(func(j *pb.SyncJoin) { j.Rank = -1 }), codes.InvalidArgument, "rank"},
		{"world size", mod(func(j *pb.SyncJoin) { j.WorldSize = 2 }), codes.InvalidArgument, "world size"},
		{"num_params", mod(func(j *pb.SyncJoin) { j.NumParams++ }), codes.InvalidArgument, "parameters"},
		{"total_steps", mod(func(j *pb.SyncJoin) { j.TotalSteps = 0 }), codes.InvalidArgument, "total_steps"},
	}
	for _, tc := range cases {
		_, _, err := h.join(ctx, t, tc.join)
		wantCode(t, tc.name, err, tc.code, tc.msg)
	}

	// The first message must be a join.
	stream, err := h.c.ps.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.Send(&pb.SyncRequest{Msg: &pb.SyncRequest_Gradient{Gradient: gradFrame(a, 0, 0)}})
	_, err = stream.Recv()
	wantCode(t, "gradient first", err, codes.InvalidArgument, "join")

	// None of the refusals used up rank 0: a good join works, once.
	_, params, err := h.join(ctx, t, goodJoin(a))
	if err != nil {
		t.Fatalf("good join: %v", err)
	}
	if int64(len(params)) != a.NumParams {
		t.Errorf("initial parameters: %d values, want %d", len(params), a.NumParams)
	}
	_, _, err = h.join(ctx, t, goodJoin(a))
	wantCode(t, "second join of rank 0", err, codes.AlreadyExists, "already joined")

	// Pull gives the same snapshot.
	pull, err := h.c.ps.Pull(ctx, &pb.PullRequest{JobId: a.JobId})
	if err != nil {
		t.Fatal(err)
	}
	var got int
	for {
		m, err := pull.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("Pull: %v", err)
		}
		got += len(m.GetParameters().GetData()) / 4
	}
	if int64(got) != a.NumParams {
		t.Errorf("Pull: %d values, want %d", got, a.NumParams)
	}

	// Once the job has ended, its parameter server refuses joins and pulls.
	h.cancel(ctx, t, a)
	_, _, err = h.join(ctx, t, goodJoin(a))
	wantCode(t, "join after cancel", err, codes.FailedPrecondition, "not running")
	pull, err = h.c.ps.Pull(ctx, &pb.PullRequest{JobId: a.JobId})
	if err == nil {
		_, err = pull.Recv()
	}
	wantCode(t, "pull after cancel", err, codes.FailedPrecondition, "not running")
	pull, err = h.c.ps.Pull(ctx, &pb.PullRequest{JobId: "job-nope"})
	if err == nil {
		_, err = pull.Recv()
	}
	wantCode(t, "pull unknown", err, codes.NotFound, "job-nope")
	pull, err = h.c.ps.Pull(ctx, &pb.PullRequest{})
	if err == nil {
		_, err = pull.Recv()
	}
	wantCode(t, "pull without id", err, codes.InvalidArgument, "job_id")
}

func TestParameterServerFrameRefusals(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	h := newPSHarness(ctx, t)
	cases := []struct {
		name string
		// frame returns the frame to send after the join (and, for the
		// stale case, after one good step).
		frame    func(a *pb.Assignment) *pb.TensorFrame
		goodStep bool
		code     codes.Code
		msg      string
	}{
		{"stale step", func(a *pb.Assignment) *pb.TensorFrame { return gradFrame(a, 0, 0) }, true, codes.Aborted, "step"},
		{"negative step", func(a *pb.Assignment) *pb.TensorFrame { return gradFrame(a, -1, 0) }, false, codes.Aborted, "step"},
		{"stale generation", func(a *pb.Assignment) *pb.TensorFrame {
			f := gradFrame(a, 0, 0)
			f.Generation = 0
			return f
		}, false, codes.Aborted, "generation"},
		{"future step", func(a *pb.Assignment) *pb.TensorFrame { return gradFrame(a, 5, 0) }, false, codes.InvalidArgument, "step"},
		{"other job", func(a *pb.Assignment) *pb.TensorFrame {
			f := gradFrame(a, 0, 0)
			f.JobId = "job-other"
			return f
		}, false, codes.InvalidArgument, "job"},
		{"wrong total", func(a *pb.Assignment) *pb.TensorFrame {
			f := gradFrame(a, 0, 0)
			f.Total++
			return f
		}, false, codes.InvalidArgument, "elements"},
		{"wrong op", func(a *pb.Assignment) *pb.TensorFrame {
			f := gradFrame(a, 0, 0)
			f.Op = pb.Op_OP_ALL_REDUCE
			return f
		}, false, codes.InvalidArgument, "op"},
		{"wrong dtype", func(a *pb.Assignment) *pb.TensorFrame {
			f := gradFrame(a, 0, 0)
			f.Dtype = pb.DType_D_TYPE_F16
			return f
		}, false, codes.InvalidArgument, "dtype"},
		{"short last frame", func(a *pb.Assignment) *pb.TensorFrame {
			f := gradFrame(a, 0, 0)
			f.Data = f.Data[:len(f.Data)-4]
			return f
		}, false, codes.InvalidArgument, "last frame"},
		{"NaN gradient", func(a *pb.Assignment) *pb.TensorFrame { return gradFrame(a, 0, float32(math.NaN())) }, false, codes.InvalidArgument, "nonfinite"},
	}
	for _, codec := range codecs {
		h.opts = codec.opts
		for _, tc := range cases {
			t.Run(codec.name+"/"+tc.name, func(t *testing.T) {
				a := h.start(ctx, t)
				defer h.cancel(ctx, t, a)
				stream, _, err := h.join(ctx, t, goodJoin(a))
				if err != nil {
					t.Fatalf("join: %v", err)
				}
				if tc.goodStep {
					if err := sendGrad(stream, gradFrame(a, 0, 0.01), a.NumParams, 1); err != nil {
						t.Fatalf("good step 0: %v", err)
					}
				}
				err = sendGrad(stream, tc.frame(a), a.NumParams, 1)
				wantCode(t, tc.name, err, tc.code, tc.msg)
			})
		}
		// Bytes that are not a SyncRequest fail the stream as the proto
		// codec fails it (Internal: the message cannot be parsed).
		t.Run(codec.name+"/malformed", func(t *testing.T) {
			a := h.start(ctx, t)
			defer h.cancel(ctx, t, a)
			stream, _, err := h.join(ctx, t, goodJoin(a))
			if err != nil {
				t.Fatalf("join: %v", err)
			}
			f, err := proto.Marshal(&pb.SyncRequest{Msg: &pb.SyncRequest_Gradient{Gradient: gradFrame(a, 0, 0.5)}})
			if err != nil {
				t.Fatal(err)
			}
			// Unknown fields are sent as they are: a truncated request.
			raw := &emptypb.Empty{}
			raw.ProtoReflect().SetUnknown(f[:len(f)-3])
			if err := stream.SendMsg(raw); err != nil && !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			_, err = stream.Recv()
			wantCode(t, "truncated message", err, codes.Internal, "unmarshal")
		})
	}
}

// TestParameterServerStep checks one averaged SGD step end to end over the
// raw protocol: with lr 1, momentum 0 and a constant schedule, a gradient of
// 0.5 everywhere moves every parameter by exactly -0.5.
func TestParameterServerStep(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	h := newPSHarness(ctx, t)
	for _, codec := range codecs {
		h.opts = codec.opts
		t.Run(codec.name, func(t *testing.T) { testParameterServerStep(ctx, t, h) })
	}
}

func testParameterServerStep(ctx context.Context, t *testing.T, h *psHarness) {
	spec := longSpec(1)
	spec.Optimizer = &pb.OptimizerSpec{Lr: proto.Float64(1), Momentum: proto.Float64(0)}
	spec.LrSchedule = &pb.ScheduleSpec{Name: "constant"}
	job := h.c.submit(ctx, spec)
	var a *pb.Assignment
	for a == nil {
		a = h.f.next(ctx, t).GetAssignment()
	}
	if a.JobId != job.Id {
		t.Fatalf("assignment for %s, want %s", a.JobId, job.Id)
	}
	defer h.cancel(ctx, t, a)
	stream, before, err := h.join(ctx, t, goodJoin(a))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.SyncRequest{Msg: &pb.SyncRequest_Gradient{Gradient: gradFrame(a, 0, 0.5)}}); err != nil {
		t.Fatal(err)
	}
	after, err := recvParams(stream, a.NumParams, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i := range before {
		if d := after[i] - before[i]; math.Abs(float64(d+0.5)) > 1e-6 {
			t.Fatalf("param %d moved by %v, want -0.5", i, d)
		}
	}
}

// TestParameterServerCloseSend: a worker that finishes closes its send side;
// the server's Sync must then end with OK (io.EOF on the client), not with
// Unknown "EOF" (which the logging interceptor reports at ERROR level for
// every finished job).
func TestParameterServerCloseSend(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	h := newPSHarness(ctx, t)
	a := h.start(ctx, t)
	defer h.cancel(ctx, t, a)
	stream, _, err := h.join(ctx, t, goodJoin(a))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	_, err = stream.Recv()
	if !errors.Is(err, io.EOF) {
		t.Errorf("after CloseSend: %v; want io.EOF (status OK)", err)
	}
}
