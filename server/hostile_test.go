package server_test

import (
	"context"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// TestHostileInputs throws malformed, oversized, stale and non-finite input
// at every service, checks each gets the right code, and then that the
// server still serves and no other job was touched. Run with -v to see the
// table.
func TestHostileInputs(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	h := newPSHarness(ctx, t)
	c := h.c

	// A job whose final state must survive everything below.
	done := c.submit(ctx, &pb.JobSpec{Model: "logreg", Dataset: &pb.DatasetSpec{Name: "synthetic"}, Workers: proto.Int32(5)})
	if _, err := c.jobs.CancelJob(ctx, &pb.CancelJobRequest{JobId: done.Id}); err != nil {
		t.Fatal(err)
	}
	a := h.start(ctx, t) // a running one-worker job driven by the fake worker; joins are refused before anyone joins it

	submit := func(s *pb.JobSpec) error { _, err := c.jobs.SubmitJob(ctx, &pb.SubmitJobRequest{Spec: s}); return err }
	// Each gradient case runs on a fresh job (a rank joins a job once).
	grad := func(mod func(f *pb.TensorFrame)) error {
		a := h.start(ctx, t)
		defer c.jobs.CancelJob(ctx, &pb.CancelJobRequest{JobId: a.JobId})
		stream, _, err := h.join(ctx, t, goodJoin(a))
		if err != nil {
			return err
		}
		f := gradFrame(a, 0, 0.5)
		mod(f)
		err = sendGrad(stream, f, a.NumParams, 1)
		return err
	}
	joinWith := func(mod func(j *pb.SyncJoin)) error {
		j := goodJoin(a)
		mod(j)
		_, _, err := h.join(ctx, t, j)
		return err
	}
	connectFirst := func(m *pb.ConnectRequest) error {
		st, err := c.coord.Connect(ctx)
		if err != nil {
			return err
		}
		if err := st.Send(m); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		_, err = st.Recv()
		return err
	}
	cases := []struct {
		what string
		call func() error
		want codes.Code
	}{
		{"SubmitJob: unknown model", func() error { return submit(&pb.JobSpec{Model: "resnet50"}) }, codes.InvalidArgument},
		{"SubmitJob: batch_size 0", func() error { return submit(&pb.JobSpec{BatchSize: proto.Int32(0)}) }, codes.InvalidArgument},
		{"SubmitJob: batch_size -5", func() error { return submit(&pb.JobSpec{BatchSize: proto.Int32(-5)}) }, codes.InvalidArgument},
		{"SubmitJob: lr -0.1", func() error { return submit(&pb.JobSpec{Optimizer: &pb.OptimizerSpec{Lr: proto.Float64(-0.1)}}) }, codes.InvalidArgument},
		{"SubmitJob: lr NaN", func() error { return submit(&pb.JobSpec{Optimizer: &pb.OptimizerSpec{Lr: proto.Float64(math.NaN())}}) }, codes.InvalidArgument},
		{"SubmitJob: workers 0", func() error { return submit(&pb.JobSpec{Workers: proto.Int32(0)}) }, codes.InvalidArgument},
		{"SubmitJob: workers 1e6", func() error { return submit(&pb.JobSpec{Workers: proto.Int32(1e6)}) }, codes.InvalidArgument},
		{"SubmitJob: unknown dataset", func() error { return submit(&pb.JobSpec{Dataset: &pb.DatasetSpec{Name: "cifar10"}}) }, codes.InvalidArgument},
		{"SubmitJob: momentum 1.5", func() error {
			return submit(&pb.JobSpec{Optimizer: &pb.OptimizerSpec{Momentum: proto.Float64(1.5)}})
		}, codes.InvalidArgument},
		{"SubmitJob: 1 KB name", func() error { return submit(&pb.JobSpec{Name: strings.Repeat("x", 1000)}) }, codes.InvalidArgument},
		{"SubmitJob: 5 MiB message", func() error { return submit(&pb.JobSpec{Name: strings.Repeat("x", 5<<20)}) }, codes.ResourceExhausted},
		{"SubmitJob: option not implemented (two parameter-server shards with compression)", func() error {
			return submit(&pb.JobSpec{ParameterServer: &pb.ParameterServerSpec{Shards: 2}, Compression: &pb.CompressionSpec{Type: "fp16"}})
		}, codes.InvalidArgument},
		{"GetJob: empty id", func() error { _, err := c.jobs.GetJob(ctx, &pb.GetJobRequest{}); return err }, codes.InvalidArgument},
		{"GetJob: unknown job", func() error { _, err := c.jobs.GetJob(ctx, &pb.GetJobRequest{JobId: "job-nope"}); return err }, codes.NotFound},
		{"CancelJob: finished job", func() error { _, err := c.jobs.CancelJob(ctx, &pb.CancelJobRequest{JobId: done.Id}); return err }, codes.FailedPrecondition},
		{"ListJobs: page_size 5000", func() error { _, err := c.jobs.ListJobs(ctx, &pb.ListJobsRequest{PageSize: 5000}); return err }, codes.InvalidArgument},
		{"ListJobs: state 99", func() error { _, err := c.jobs.ListJobs(ctx, &pb.ListJobsRequest{State: 99}); return err }, codes.InvalidArgument},
		{"Connect: heartbeat before hello", func() error {
			return connectFirst(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Heartbeat{Heartbeat: &pb.Heartbeat{}}})
		}, codes.InvalidArgument},
		{"Connect: hello without address", func() error {
			return connectFirst(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Hello{Hello: &pb.Hello{WorkerId: "x"}}})
		}, codes.InvalidArgument},
		{"Sync: join for an unknown job", func() error { return joinWith(func(j *pb.SyncJoin) { j.JobId = "job-nope" }) }, codes.NotFound},
		{"Sync: join from a stale generation", func() error { return joinWith(func(j *pb.SyncJoin) { j.Generation = 0 }) }, codes.Aborted},
		{"Sync: join with the wrong model size", func() error { return joinWith(func(j *pb.SyncJoin) { j.NumParams++ }) }, codes.InvalidArgument},
		{"Sync: rank out of range", func() error { return joinWith(func(j *pb.SyncJoin) { j.Rank = 7 }) }, codes.InvalidArgument},
		{"(cancel the join-test job)", func() error {
			_, err := c.jobs.CancelJob(ctx, &pb.CancelJobRequest{JobId: a.JobId})
			return err
		}, codes.OK},
		{"Sync: gradient of wrong length (odd bytes)", func() error { return grad(func(f *pb.TensorFrame) { f.Data = f.Data[:len(f.Data)-1] }) }, codes.InvalidArgument},
		{"Sync: gradient past the tensor's end", func() error { return grad(func(f *pb.TensorFrame) { f.Offset = 4 }) }, codes.InvalidArgument},
		{"Sync: gradient with the wrong dtype", func() error { return grad(func(f *pb.TensorFrame) { f.Dtype = pb.DType_D_TYPE_F16 }) }, codes.InvalidArgument},
		{"Sync: gradient for another job", func() error { return grad(func(f *pb.TensorFrame) { f.JobId = done.Id }) }, codes.InvalidArgument},
		{"Sync: gradient from a stale generation", func() error { return grad(func(f *pb.TensorFrame) { f.Generation = 0 }) }, codes.Aborted},
		{"Sync: gradient for a past step", func() error { return grad(func(f *pb.TensorFrame) { f.Step = -1 }) }, codes.Aborted},
		{"Pull: unknown job", func() error {
			st, err := c.ps.Pull(ctx, &pb.PullRequest{JobId: "job-nope"})
			if err != nil {
				return err
			}
			_, err = st.Recv()
			return err
		}, codes.NotFound},
		{"WatchJob: empty id", func() error {
			st, err := c.jobs.WatchJob(ctx, &pb.WatchJobRequest{})
			if err != nil {
				return err
			}
			_, err = st.Recv()
			return err
		}, codes.InvalidArgument},
	}
	t.Logf("| # | bad input | code |")
	t.Logf("|---|---|---|")
	n := 0
	for _, tc := range cases {
		err := tc.call()
		got := status.Code(err)
		if tc.want != codes.OK {
			n++
			t.Logf("| %d | %s | %s |", n, tc.what, got)
		}
		if got != tc.want {
			t.Errorf("%s: %v; want %s", tc.what, err, tc.want)
		}
	}
	// NaN in a gradient: refused, and (policy fail) it ends only its own job.
	if err := grad(func(f *pb.TensorFrame) { f.Data[0], f.Data[1], f.Data[2], f.Data[3] = 0, 0, 0xc0, 0x7f }); status.Code(err) != codes.InvalidArgument {
		t.Errorf("NaN gradient: %v; want InvalidArgument", err)
	}
	t.Logf("| %d | Sync: gradient holding NaN (nonfinite_policy fail) | InvalidArgument |", n+1)

	// Still serving; the finished job is as it was.
	got, err := c.jobs.GetJob(ctx, &pb.GetJobRequest{JobId: done.Id})
	if err != nil || got.Job.State != pb.JobState_JOB_STATE_CANCELLED {
		t.Fatalf("finished job after the barrage: %v %v", got, err)
	}
	if _, err := c.jobs.ListJobs(context.Background(), &pb.ListJobsRequest{}); err != nil {
		t.Fatalf("server no longer serves: %v", err)
	}
}
