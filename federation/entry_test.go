package federation

import (
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/gradsync/gradsync/internal/wire"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// entryHarness is a 1-round job of 3 script clients (an entrypoint job:
// no model on the coordinator), all sampled, min_clients 1.
func entryHarness(t *testing.T) *harness {
	t.Helper()
	spec := testSpec(1)
	spec.Federated.Rounds = 1
	spec.Entrypoint = &pb.EntrypointSpec{Command: []string{"python3", "client.py"}}
	h := &harness{t: t, now: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC), ids: []string{"w0", "w1", "w2"}}
	h.coord = &fakeCoord{now: h.clock, ended: make(chan struct{})}
	d, err := New(Config{JobID: "job-1", Generation: 1, Spec: spec, WorkerIDs: h.ids, Started: h.now, Now: h.clock,
		Logger: slog.New(slog.DiscardHandler)}, h.coord)
	if err != nil {
		t.Fatal(err)
	}
	h.d, h.coord.d = d, d
	return h
}

func fill(n int, v float32) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// TestEntryClientsOnStreams: three script clients on real streams. Each
// joins with its layout and initial parameters; a join whose layout
// differs is refused naming the tensor. The global model starts from the
// lowest-index client's initial parameters, not the first to join's. A
// client that leaves (its script crashed) is lost and named, and the round
// closes without it, before its deadline, with the others' updates
// weighted by their examples; the evaluator's metrics are recorded.
func TestEntryClientsOnStreams(t *testing.T) {
	ctx := t.Context()
	h := entryHarness(t)
	ran := make(chan struct{})
	go func() { // owned by the test: ends once the driver is aborted
		defer close(ran)
		h.d.Run()
	}()
	defer func() {
		h.d.Abort(errors.New("test over"))
		<-ran
	}()
	fed := startService(t, func(string) (*Driver, error) { return h.d, nil })
	layout := []*pb.TensorInfo{{Name: "w", Shape: []int64{2, 3}, Dtype: "float32"}, {Name: "b", Shape: []int64{3}, Dtype: "float32"}}
	const p = 9
	var sp wire.Splitter
	sp.FrameElems = 4 // several frames
	join := func(k int, layout []*pb.TensorInfo, initial []float32) pb.Federation_ParticipateClient {
		t.Helper()
		st, err := fed.Participate(ctx)
		if err != nil {
			t.Fatal(err)
		}
		j := &pb.FederationJoin{JobId: "job-1", Generation: 1, NumClients: 3, Client: int32(k), NumParams: int64(len(initial)), Layout: layout}
		if err := st.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Join{Join: j}}); err != nil {
			t.Fatal(err)
		}
		err = sp.Frames(&pb.TensorFrame{JobId: "job-1", Generation: 1, Op: pb.Op_OP_BROADCAST, Phase: 2}, initial, func(f *pb.TensorFrame) error {
			return st.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Delta{Delta: f}})
		})
		if err != nil && !errors.Is(err, io.EOF) { // io.EOF: the join was refused; Recv says why
			t.Fatal(err)
		}
		return st
	}
	joined := func(k int, st pb.Federation_ParticipateClient) {
		t.Helper()
		if m, err := st.Recv(); err != nil || m.GetJoined() == nil {
			t.Fatalf("client %d: %v, %v; want Joined", k, m, err)
		}
	}
	// recvModel reads up to the end of the model after a round start or
	// evaluation request.
	recvModel := func(st pb.Federation_ParticipateClient) (*pb.ParticipateResponse, []float32) {
		t.Helper()
		var head *pb.ParticipateResponse
		var model []float32
		for {
			m, err := st.Recv()
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case m.GetRound() != nil || m.GetEval() != nil:
				head, model = m, nil
			case m.GetModel() != nil:
				v := make([]float32, len(m.GetModel().Data)/4)
				if err := wire.GetF32(v, m.GetModel().Data); err != nil {
					t.Fatal(err)
				}
				model = append(model, v...)
				if m.GetModel().Last {
					return head, model
				}
			}
		}
	}

	s1 := join(1, layout, fill(p, 1)) // the first in: its layout is the job's
	joined(1, s1)
	other := slices.Clone(layout)
	other[1] = &pb.TensorInfo{Name: "b", Shape: []int64{4}, Dtype: "float32"}
	_, err := join(2, other, fill(10, 1)).Recv()
	wantCode(t, "another layout", err, codes.InvalidArgument, "tensor 1 is b [4] float32, the job's is b [3] float32")
	_, err = join(2, nil, fill(p, 1)).Recv()
	wantCode(t, "no layout", err, codes.InvalidArgument, "no layout")
	s0 := join(0, layout, fill(p, 0.5))
	joined(0, s0)
	s2 := join(2, layout, fill(p, 7))
	joined(2, s2)
	streams := []pb.Federation_ParticipateClient{s0, s1, s2}
	for k, st := range streams {
		head, model := recvModel(st)
		if head.GetRound().GetRound() != 1 || !slices.Equal(model, fill(p, 0.5)) {
			t.Fatalf("client %d: %v with model %v; want round 1 from client 0's initial parameters", k, head, model)
		}
	}
	if err := s2.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Leave{Leave: &pb.ClientLeave{Reason: "its script exited with status 1"}}}); err != nil {
		t.Fatal(err)
	}
	// Deltas 1 (10 examples) and 2 (30): the FedAvg step is 1.75.
	for k, d := range map[int]float32{0: 1, 1: 2} {
		st := streams[k]
		up := &pb.ClientUpdate{Round: 1, NumExamples: int64(10 + 20*k), Metrics: map[string]float64{"seconds": 1.5}}
		if err := st.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Update{Update: up}}); err != nil {
			t.Fatal(err)
		}
		err := sp.Frames(&pb.TensorFrame{JobId: "job-1", Generation: 1, Op: pb.Op_OP_PUSH_GRADIENT, Step: 1}, fill(p, d), func(f *pb.TensorFrame) error {
			return st.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Delta{Delta: f}})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for { // client 1 evaluates: the first in (the evaluator is chosen as clients join)
		head, model := recvModel(s1)
		if head.GetEval() == nil {
			continue
		}
		if !slices.Equal(model, fill(p, 2.25)) {
			t.Fatalf("the model to evaluate after round 1: %v; want 0.5 + (10×1 + 30×2)/40 = 2.25", model)
		}
		break
	}
	ev := &pb.ClientEval{Round: 1, TestAccuracy: 0.5, TestLoss: 1, Metrics: map[string]float64{"f1": 0.25}}
	if err := s1.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Eval{Eval: ev}}); err != nil {
		t.Fatal(err)
	}
	<-h.coord.ended
	if h.coord.state != pb.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("job %s: %q; want SUCCEEDED", h.coord.state, h.coord.msg)
	}
	if lost := h.coord.logsOf("client_lost"); len(lost) != 1 || lost[0]["client"] != 2 ||
		!strings.Contains(lost[0]["reason"].(string), "its script exited with status 1") {
		t.Errorf("client_lost records %v; want client 2, naming why it left", lost)
	}
	prog := h.coord.logsOf("progress")
	if len(prog) != 1 || prog[0]["at_deadline"] != false || !slices.Equal(prog[0]["missing"].([]int), []int{2}) {
		t.Errorf("progress %v; want round 1 closed before its deadline, client 2 missing", prog)
	}
	if init := h.coord.logsOf("initial_parameters"); len(init) != 1 || init[0]["client"] != 0 {
		t.Errorf("initial_parameters records %v; want client 0's", init)
	}
	if m := h.coord.logsOf("client_metrics"); len(m) != 3 {
		t.Errorf("client_metrics records %v; want two fits and one evaluation", m)
	}
}

// TestEntryNoJoinFailsJob: an entrypoint job none of whose clients
// joined by the start deadline has no initial model: it fails, saying so.
func TestEntryNoJoinFailsJob(t *testing.T) {
	h := entryHarness(t)
	h.advance(testDeadline)
	if h.coord.state != pb.JobState_JOB_STATE_FAILED || !strings.Contains(h.coord.msg, "no initial parameters") {
		t.Fatalf("job %s: %q; want FAILED for want of initial parameters", h.coord.state, h.coord.msg)
	}
}

// TestLayoutSize: what a script's layout may be.
func TestLayoutSize(t *testing.T) {
	f32 := func(name string, shape ...int64) *pb.TensorInfo {
		return &pb.TensorInfo{Name: name, Shape: shape, Dtype: "float32"}
	}
	if n, err := layoutSize([]*pb.TensorInfo{f32("a", 2, 3), f32("s"), f32("e", 0, 5)}); n != 7 || err != nil {
		t.Errorf("layout of 6 + a scalar + an empty tensor: %d, %v; want 7", n, err)
	}
	for what, ts := range map[string][]*pb.TensorInfo{
		"1..65536 tensors":  nil,
		"name must be":      {f32("", 1)},
		"dtype \"float64\"": {{Name: "a", Shape: []int64{1}, Dtype: "float64"}},
		"out of range":      {f32("a", -1)},
		"layout of more":    {f32("a", 1<<30), f32("b", 1<<30), f32("c", 1)},
	} {
		if _, err := layoutSize(ts); err == nil || !strings.Contains(err.Error(), what) {
			t.Errorf("%v: %v; want an error with %q", ts, err, what)
		}
	}
}
