package peerrpc_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/internal/wire"
	"github.com/gradsync/gradsync/pipeline/peerrpc"
	"github.com/gradsync/gradsync/pipeline/stage"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// rawStream opens an Exchange stream to w as stage 0 of job "j" at
// generation gen would, without a Link: the test writes its frames.
func rawStream(ctx context.Context, t *testing.T, w *worker, md metadata.MD) pb.Pipeline_ExchangeClient {
	t.Helper()
	conn := w.conn(t)
	t.Cleanup(func() { conn.Close() })
	s, err := pb.NewPipelineClient(conn).Exchange(metadata.NewOutgoingContext(ctx, md))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func goodFrame() *pb.PipelineFrame {
	return &pb.PipelineFrame{JobId: "j", Generation: 4, Stage: 0, Direction: pb.PipelineDirection_PIPELINE_DIRECTION_ACTIVATION,
		Step: 5, MicroBatch: 1, Shape: []uint64{2, 3}, Offset: 0, Last: true, Data: wire.PutF32(make([]byte, 24), []float32{1, 2, 3, 4, 5, 6})}
}

var refuseWant = stage.Header{Step: 5, MicroBatch: 1, Dir: stage.Activation, Shape: [2]int{2, 3}}

// Frames with a wrong job, generation, stage, direction, step,
// micro-batch, shape, offset or size are refused: Recv fails with a
// *stage.HeaderError saying what is wrong, nothing is delivered, and the
// sender's stream ends with Aborted (an earlier generation or step) or
// InvalidArgument.
func TestRefusesWrongFrames(t *testing.T) {
	md := metadata.Pairs("gradsync-job", "j", "gradsync-generation", "4", "gradsync-stage", "0")
	for _, c := range []struct {
		name string
		edit func(*pb.PipelineFrame)
		code codes.Code
		msg  string
	}{
		{"job", func(f *pb.PipelineFrame) { f.JobId = "k" }, codes.InvalidArgument, `frame for job "k" on a link of job "j"`},
		{"older generation", func(f *pb.PipelineFrame) { f.Generation = 3 }, codes.Aborted, "frame from generation 3 on a link of generation 4"},
		{"newer generation", func(f *pb.PipelineFrame) { f.Generation = 5 }, codes.InvalidArgument, "generation 5"},
		{"stage", func(f *pb.PipelineFrame) { f.Stage = 2 }, codes.InvalidArgument, "from stage 2; this link's peer is stage 0"},
		{"direction", func(f *pb.PipelineFrame) { f.Direction = pb.PipelineDirection_PIPELINE_DIRECTION_GRADIENT }, codes.InvalidArgument, "direction PIPELINE_DIRECTION_GRADIENT"},
		{"no direction", func(f *pb.PipelineFrame) { f.Direction = 0 }, codes.InvalidArgument, "direction PIPELINE_DIRECTION_UNSPECIFIED"},
		{"evaluation", func(f *pb.PipelineFrame) { f.Eval = true }, codes.InvalidArgument, "got the activation of micro-batch 1 of evaluation 5"},
		{"earlier step", func(f *pb.PipelineFrame) { f.Step = 4 }, codes.Aborted, "want step 5"},
		{"later step", func(f *pb.PipelineFrame) { f.Step = 6 }, codes.InvalidArgument, "want step 5"},
		{"micro-batch", func(f *pb.PipelineFrame) { f.MicroBatch = 2 }, codes.InvalidArgument, "want micro-batch 1"},
		{"shape", func(f *pb.PipelineFrame) { f.Shape = []uint64{3, 2} }, codes.InvalidArgument, "shape 3×2, want shape 2×3"},
		{"flat shape", func(f *pb.PipelineFrame) { f.Shape = []uint64{6} }, codes.InvalidArgument, "want two dimensions"},
		{"huge shape", func(f *pb.PipelineFrame) { f.Shape = []uint64{1 << 40, 1 << 40} }, codes.InvalidArgument, "each at most 2^31"},
		{"offset", func(f *pb.PipelineFrame) { f.Offset = 2 }, codes.InvalidArgument, "offset 2"},
		{"odd bytes", func(f *pb.PipelineFrame) { f.Data = f.Data[:23] }, codes.InvalidArgument, "23 bytes, not a whole number"},
		{"short", func(f *pb.PipelineFrame) { f.Data = f.Data[:16] }, codes.InvalidArgument, "last frame ends at 4"},
		{"long", func(f *pb.PipelineFrame) { f.Data = append(f.Data, 0, 0, 0, 0) }, codes.InvalidArgument, "outside"},
		{"empty, not last", func(f *pb.PipelineFrame) { f.Data, f.Last = nil, false }, codes.InvalidArgument, "empty frame"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			w := newWorker()
			defer w.stop()
			type accepted struct {
				l   *peerrpc.Link
				err error
			}
			got := make(chan accepted, 1)
			go func() {
				l, err := w.ep.Accept(ctx, "j", 4, 1)
				if err != nil {
					got <- accepted{err: err}
					return
				}
				got <- accepted{l: l}
			}()
			var s pb.Pipeline_ExchangeClient
			for {
				// Until Accept has registered, the endpoint says NotFound.
				s = rawStream(ctx, t, w, md)
				if hdr, err := s.Header(); err == nil && len(hdr.Get("gradsync-accepted")) == 1 {
					break
				}
				if _, err := s.Recv(); status.Code(err) != codes.NotFound {
					t.Fatalf("handshake: %v", err)
				}
			}
			a := <-got
			if a.err != nil {
				t.Fatal(a.err)
			}
			defer a.l.Close()
			f := goodFrame()
			c.edit(f)
			if err := s.Send(&pb.ExchangeRequest{Frame: f}); err != nil {
				t.Fatal(err)
			}
			dst := make([]float32, 6)
			err := a.l.Recv(ctx, refuseWant, dst)
			var he *stage.HeaderError
			var pe *stage.PeerError
			if !errors.As(err, &he) || !errors.As(err, &pe) || pe.Stage != 0 || !strings.Contains(err.Error(), c.msg) {
				t.Errorf("Recv: %v, want a PeerError for stage 0 with a HeaderError saying %q", err, c.msg)
			}
			if he != nil && he.Stale != (c.code == codes.Aborted) {
				t.Errorf("Recv: stale %v for a refusal with %v", he.Stale, c.code)
			}
			_, err = s.Recv()
			if st, _ := status.FromError(err); st.Code() != c.code || !strings.Contains(st.Message(), c.msg) {
				t.Errorf("the sender's stream ended with %v, want %v saying %q", err, c.code, c.msg)
			}
		})
	}
}

// Streams that do not name a link the endpoint waits for are refused at
// the handshake with a code saying why.
func TestRefusesStreams(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := newWorker()
	defer w.stop()
	acc := make(chan error, 1)
	actx, acancel := context.WithCancel(ctx)
	go func() {
		_, err := w.ep.Accept(actx, "j", 4, 1)
		acc <- err
	}()
	// Wait until Accept has registered: then a probe of a newer
	// generation hears that generation 4 is awaited.
	for {
		s := rawStream(ctx, t, w, metadata.Pairs("gradsync-job", "j", "gradsync-generation", "5", "gradsync-stage", "0"))
		_, err := s.Recv()
		if st, _ := status.FromError(err); st.Code() == codes.NotFound && strings.Contains(st.Message(), "waits for generation 4") {
			break
		} else if st.Code() != codes.NotFound {
			t.Fatalf("probe: %v", err)
		}
	}
	for _, c := range []struct {
		name string
		md   metadata.MD
		code codes.Code
		msg  string
	}{
		{"no metadata", metadata.MD{}, codes.InvalidArgument, `exactly one "gradsync-job" metadata value`},
		{"bad generation", metadata.Pairs("gradsync-job", "j", "gradsync-generation", "x", "gradsync-stage", "0"), codes.InvalidArgument, "not an unsigned integer"},
		{"bad stage", metadata.Pairs("gradsync-job", "j", "gradsync-generation", "4", "gradsync-stage", "-1"), codes.InvalidArgument, "is not a stage"},
		{"unknown job", metadata.Pairs("gradsync-job", "k", "gradsync-generation", "4", "gradsync-stage", "0"), codes.NotFound, `no stage 1 of job "k" waits`},
		{"no such stage", metadata.Pairs("gradsync-job", "j", "gradsync-generation", "4", "gradsync-stage", "1"), codes.NotFound, `no stage 2 of job "j" waits`},
		{"older generation", metadata.Pairs("gradsync-job", "j", "gradsync-generation", "3", "gradsync-stage", "0"), codes.Aborted, "stale generation 3"},
		{"newer generation", metadata.Pairs("gradsync-job", "j", "gradsync-generation", "5", "gradsync-stage", "0"), codes.NotFound, "not 5 yet"},
	} {
		s := rawStream(ctx, t, w, c.md)
		_, err := s.Recv()
		if st, _ := status.FromError(err); st.Code() != c.code || !strings.Contains(st.Message(), c.msg) {
			t.Errorf("%s: %v, want %v saying %q", c.name, err, c.code, c.msg)
		}
	}
	acancel()
	if err := <-acc; !errors.Is(err, context.Canceled) {
		t.Errorf("Accept after its context ended: %v", err)
	}
}
