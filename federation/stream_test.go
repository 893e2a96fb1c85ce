package federation

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/internal/wire"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// service serves Participate through Serve with a fixed lookup, as the
// coordinator's adapter does.
type service struct {
	pb.UnimplementedFederationServer
	lookup func(jobID string) (*Driver, error)
}

func (s service) Participate(st pb.Federation_ParticipateServer) error { return Serve(st, s.lookup) }

// startService serves lookup's drivers on an in-memory listener until the
// test ends, and returns a client of it.
func startService(t *testing.T, lookup func(string) (*Driver, error)) pb.FederationClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	g := grpc.NewServer()
	pb.RegisterFederationServer(g, service{lookup: lookup})
	served := make(chan struct{})
	go func() { // owned by the test: ends with g.Stop
		defer close(served)
		_ = g.Serve(lis)
	}()
	conn, err := grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		g.Stop()
		<-served
	})
	return pb.NewFederationClient(conn)
}

// wantCode fails the test unless err has code and its message holds msg.
func wantCode(t *testing.T, what string, err error, code codes.Code, msg string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), msg) {
		t.Errorf("%s: %v; want %v with %q", what, err, code, msg)
	}
}

// TestParticipateStream: a job's three clients on real streams. The
// preamble and wrong joins are refused with clear codes; the clients
// joined get the round and the global model in frames, stream their
// deltas in frames, and, once the evaluator has answered the final
// evaluation and the coordinator has ended the job, hear FederationDone
// and see their streams end. Run then returns.
func TestParticipateStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	spec := testSpec(3)
	spec.Federated.Rounds = 1
	h := newHarness(t, spec, "")
	ran := make(chan struct{})
	go func() { // owned by the test: ends once the driver is aborted
		defer close(ran)
		h.d.Run()
	}()
	defer func() {
		h.d.Abort(errors.New("test over"))
		<-ran
	}()
	fed := startService(t, func(id string) (*Driver, error) {
		if id != "job-1" {
			return nil, status.Errorf(codes.NotFound, "job %q not found", id)
		}
		return h.d, nil
	})
	open := func(first *pb.ParticipateRequest) pb.Federation_ParticipateClient {
		t.Helper()
		st, err := fed.Participate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(first); err != nil {
			t.Fatal(err)
		}
		return st
	}
	joinMsg := func(j *pb.FederationJoin) *pb.ParticipateRequest {
		return &pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Join{Join: j}}
	}

	_, err := open(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Eval{Eval: &pb.ClientEval{}}}).Recv()
	wantCode(t, "no join first", err, codes.InvalidArgument, "the first message on Participate must be a join")
	good := &pb.FederationJoin{JobId: "job-1", Generation: 1, NumClients: 3, NumParams: int64(h.d.params)}
	for _, tc := range []struct {
		name string
		mod  func(j *pb.FederationJoin)
		code codes.Code
		msg  string
	}{
		{"no job id", func(j *pb.FederationJoin) { j.JobId = "" }, codes.InvalidArgument, "join.job_id must be 1..128 bytes"},
		{"job id too long", func(j *pb.FederationJoin) { j.JobId = strings.Repeat("j", 129) }, codes.InvalidArgument, "join.job_id must be 1..128 bytes"},
		{"unknown job", func(j *pb.FederationJoin) { j.JobId = "job-none" }, codes.NotFound, "not found"},
		{"stale generation", func(j *pb.FederationJoin) { j.Generation = 0 }, codes.Aborted, "stale"},
		{"other number of clients", func(j *pb.FederationJoin) { j.NumClients = 2 }, codes.InvalidArgument, "num_clients 2"},
		{"client out of range", func(j *pb.FederationJoin) { j.Client = 3 }, codes.InvalidArgument, "out of range"},
		{"wrong model", func(j *pb.FederationJoin) { j.NumParams++ }, codes.InvalidArgument, "parameters"},
		{"histogram not summing", func(j *pb.FederationJoin) { j.NumExamples, j.LabelHistogram = 5, make([]int64, 10) }, codes.InvalidArgument, "sums to 0"},
	} {
		j := proto.Clone(good).(*pb.FederationJoin)
		tc.mod(j)
		_, err := open(joinMsg(j)).Recv()
		wantCode(t, tc.name, err, tc.code, tc.msg)
	}

	// recvModel reads a client's messages up to the end of the model that
	// follows a round start or an evaluation request, and returns that
	// message and the model.
	recvModel := func(st pb.Federation_ParticipateClient, what string) (*pb.ParticipateResponse, []float32) {
		t.Helper()
		var head *pb.ParticipateResponse
		var model []float32
		for {
			m, err := st.Recv()
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			switch {
			case m.GetRound() != nil || m.GetEval() != nil:
				head, model = m, nil
			case m.GetModel() != nil:
				f := m.GetModel()
				v := make([]float32, len(f.Data)/4)
				if err := wire.GetF32(v, f.Data); err != nil {
					t.Fatal(err)
				}
				model = append(model, v...)
				if f.Last {
					return head, model
				}
			}
		}
	}
	global := slices.Clone(h.d.net.Params())
	var streams []pb.Federation_ParticipateClient
	for k := range 3 { // one after the other: client 0, the first in, evaluates
		j := proto.Clone(good).(*pb.FederationJoin)
		j.Client = int32(k)
		st := open(joinMsg(j))
		m, err := st.Recv()
		if err != nil || m.GetJoined().GetRounds() != 1 {
			t.Fatalf("client %d: %v, %v; want Joined of a 1-round job", k, m, err)
		}
		streams = append(streams, st)
	}
	for k, st := range streams {
		head, model := recvModel(st, "round 1")
		if rs := head.GetRound(); rs.GetRound() != 1 || !rs.GetSampled() || !slices.Equal(model, global) {
			t.Fatalf("client %d: round start %v with a model of %d values; want round 1, sampled, the global model", k, rs, len(model))
		}
	}
	j := proto.Clone(good).(*pb.FederationJoin)
	_, err = open(joinMsg(j)).Recv()
	wantCode(t, "second join of a connected client", err, codes.AlreadyExists, "already connected")

	var sp wire.Splitter
	for k, st := range streams {
		if err := st.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Update{Update: &pb.ClientUpdate{Round: 1, NumExamples: 30}}}); err != nil {
			t.Fatal(err)
		}
		err := sp.Frames(&pb.TensorFrame{JobId: "job-1", Generation: 1, Op: pb.Op_OP_PUSH_GRADIENT, Step: 1},
			make([]float32, h.d.params), func(f *pb.TensorFrame) error {
				return st.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Delta{Delta: f}})
			})
		if err != nil {
			t.Fatal(err)
		}
		m, err := st.Recv()
		if err != nil || m.GetAccepted().GetRound() != 1 {
			t.Fatalf("client %d: %v, %v; want its update for round 1 accepted", k, m, err)
		}
	}
	head, model := recvModel(streams[0], "the final evaluation")
	if head.GetEval().GetRound() != 1 || !slices.Equal(model, global) { // zero deltas: the model is unchanged
		t.Fatalf("evaluator: %v with a model of %d values; want the evaluation of round 1 with the global model", head, len(model))
	}
	if err := streams[0].Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Eval{Eval: &pb.ClientEval{Round: 1, TestAccuracy: 0.75, TestLoss: 0.5}}}); err != nil {
		t.Fatal(err)
	}
	for k, st := range streams {
		var done *pb.FederationDone
		for done == nil {
			m, err := st.Recv()
			if err != nil {
				t.Fatalf("client %d: %v before FederationDone", k, err)
			}
			done = m.GetDone()
		}
		if !strings.Contains(done.Message, "test accuracy 75.00% after 1 round(s)") {
			t.Errorf("client %d: done %q", k, done.Message)
		}
		if _, err := st.Recv(); !errors.Is(err, io.EOF) {
			t.Errorf("client %d: after FederationDone: %v; want the stream's end", k, err)
		}
	}
	<-h.coord.ended
	if h.coord.state != pb.JobState_JOB_STATE_SUCCEEDED {
		t.Errorf("job %s: %q; want SUCCEEDED", h.coord.state, h.coord.msg)
	}
	select {
	case <-ran:
	case <-ctx.Done():
		t.Fatal("Run did not return after the job ended")
	}
}

// TestParticipateRefusesBadDelta: a delta frame that is not the next
// frame of the update (out of order, another job's, a phase the stream
// does not use, past the last) ends the client's stream with
// InvalidArgument saying what was wrong, and nothing of it is used.
func TestParticipateRefusesBadDelta(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name string
		bad  func(p int) []*pb.TensorFrame
		msg  string
	}{
		{"out of order", func(p int) []*pb.TensorFrame {
			return []*pb.TensorFrame{{Offset: 1, Data: make([]byte, 4*(p-1)), Last: true}}
		}, "frames in order"},
		{"another job", func(p int) []*pb.TensorFrame {
			return []*pb.TensorFrame{{JobId: "job-2", Data: make([]byte, 4*p), Last: true}}
		}, "job-2"},
		{"other phase", func(p int) []*pb.TensorFrame {
			return []*pb.TensorFrame{{Phase: 1, Data: make([]byte, 4*p), Last: true}}
		}, "phase"},
		{"short last", func(p int) []*pb.TensorFrame {
			return []*pb.TensorFrame{{Data: make([]byte, 4*(p-1)), Last: true}}
		}, "last frame ends"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, testSpec(3), "")
			ran := make(chan struct{})
			go func() { // owned by the subtest: ends once the driver is aborted
				defer close(ran)
				h.d.Run()
			}()
			defer func() {
				h.d.Abort(errors.New("test over"))
				<-ran
			}()
			fed := startService(t, func(string) (*Driver, error) { return h.d, nil })
			var streams []pb.Federation_ParticipateClient
			for k := range 3 {
				st, err := fed.Participate(ctx)
				if err != nil {
					t.Fatal(err)
				}
				j := &pb.FederationJoin{JobId: "job-1", Generation: 1, NumClients: 3, NumParams: int64(h.d.params), Client: int32(k)}
				if err := st.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Join{Join: j}}); err != nil {
					t.Fatal(err)
				}
				streams = append(streams, st)
			}
			st := streams[0]
			for { // up to the end of round 1's model
				m, err := st.Recv()
				if err != nil {
					t.Fatal(err)
				}
				if m.GetModel().GetLast() {
					break
				}
			}
			if err := st.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Update{Update: &pb.ClientUpdate{Round: 1, NumExamples: 30}}}); err != nil {
				t.Fatal(err)
			}
			for _, f := range tc.bad(h.d.params) {
				if f.JobId == "" {
					f.JobId = "job-1"
				}
				f.Generation, f.Op, f.Step, f.Total, f.Dtype = 1, pb.Op_OP_PUSH_GRADIENT, 1, uint64(h.d.params), pb.DType_D_TYPE_F32
				if err := st.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Delta{Delta: f}}); err != nil {
					t.Fatal(err)
				}
			}
			var err error
			for err == nil {
				_, err = st.Recv()
			}
			wantCode(t, tc.name, err, codes.InvalidArgument, tc.msg)
		})
	}
}
