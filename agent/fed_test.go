package agent

import (
	"context"
	"errors"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// startFed serves a FedServer on a socket until the test ends and returns
// it with a client, as the script's.
func startFed(t *testing.T) (*FedServer, pb.FedAgentClient) {
	t.Helper()
	fs := NewFed(FedConfig{JobID: "job-1", Client: 1, NumClients: 3, Rounds: 5})
	k, err := Listen(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // owned by the test: stopped by cancel in Cleanup
		defer wg.Done()
		if err := k.ServeFed(ctx, fs, nil); err != nil {
			t.Error(err)
		}
	}()
	conn, err := grpc.NewClient("unix://"+k.Path, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(5<<20), grpc.MaxCallSendMsgSize(5<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		wg.Wait()
	})
	return fs, pb.NewFedAgentClient(conn)
}

// nextTask reads a Next stream: its head and the parameters that follow.
func nextTask(t *testing.T, c pb.FedAgentClient, wait float64) (*pb.FedAgentNextResponse, []float32, int) {
	t.Helper()
	st, err := c.Next(t.Context(), &pb.FedAgentNextRequest{WaitSeconds: wait})
	if err != nil {
		t.Fatal(err)
	}
	head, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var params []float32
	msgs := 0
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return head, params, msgs
		}
		if err != nil {
			t.Fatal(err)
		}
		v, err := decode(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		params = append(params, v...)
		msgs++
	}
}

// sendResult sends a result: head, then params in chunks of MaxElements.
func sendResult(t *testing.T, c pb.FedAgentClient, head *pb.FedAgentResultRequest, params []float32) error {
	t.Helper()
	st, err := c.Result(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// A refusal ends the stream: Send then says io.EOF, and the status
	// comes with CloseAndRecv.
	if err := st.Send(head); err == nil {
		for off := 0; off < len(params); off += MaxElements {
			if err := st.Send(&pb.FedAgentResultRequest{Data: encode(params[off:min(off+MaxElements, len(params))])}); err != nil {
				break
			}
		}
	}
	_, err = st.CloseAndRecv()
	return err
}

// TestFedTasks: a script joins with a model larger than one message, is
// handed a fit and an evaluation with their parameters in chunks and
// answers them; the worker gets its answers; Finish ends its tasks.
func TestFedTasks(t *testing.T) {
	fs, c := startFed(t)
	st, err := c.Next(t.Context(), &pb.FedAgentNextRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("next before the join: %v; want FailedPrecondition", err)
	}
	const p = MaxElements + 3
	layout := []*pb.TensorInfo{{Name: "w", Shape: []int64{MaxElements}, Dtype: "float32"}, {Name: "b", Shape: []int64{3}, Dtype: "float32"}}
	initial := make([]float32, p)
	for i := range initial {
		initial[i] = float32(i % 7)
	}
	js, err := c.Join(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := js.Send(&pb.FedAgentJoinRequest{Tensors: layout, Data: encode(initial[:10])}); err != nil {
		t.Fatal(err)
	}
	for off := 10; off < p; off += MaxElements {
		if err := js.Send(&pb.FedAgentJoinRequest{Data: encode(initial[off:min(off+MaxElements, p)])}); err != nil {
			t.Fatal(err)
		}
	}
	jr, err := js.CloseAndRecv()
	if err != nil || jr.Client != 1 || jr.NumClients != 3 || jr.Rounds != 5 || jr.MaxElements != MaxElements {
		t.Fatalf("join: %v, %v", jr, err)
	}
	<-fs.Joined()
	if j := fs.Joining(); len(j.Layout) != 2 || !slices.Equal(j.Initial, initial) {
		t.Fatalf("joined with %d tensors and %d values; want the layout and its initial values", len(j.Layout), len(j.Initial))
	}
	if head, _, _ := nextTask(t, c, 0.001); head.Kind != pb.FedTaskKind_FED_TASK_KIND_NONE {
		t.Fatalf("no task yet: %v; want NONE", head)
	}

	type answer struct {
		r   *FedResult
		err error
	}
	fit := make(chan answer, 1)
	go func() { // owned by the test: ends when the script answers
		r, err := fs.Fit(t.Context(), 4, map[string]float64{"lr": 0.1}, initial)
		fit <- answer{r, err}
	}()
	head, params, msgs := nextTask(t, c, 0)
	if head.Kind != pb.FedTaskKind_FED_TASK_KIND_FIT || head.Round != 4 || head.Config["lr"] != 0.1 || head.NumElements != p ||
		!slices.Equal(params, initial) || msgs != 2 {
		t.Fatalf("fit task %v with %d values in %d messages; want round 4's fit of the initial values in 2 chunks", head, len(params), msgs)
	}
	wrong := &pb.FedAgentResultRequest{Kind: pb.FedTaskKind_FED_TASK_KIND_FIT, Round: 3}
	if err := sendResult(t, c, wrong, params); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "round 3") {
		t.Errorf("result for another round: %v; want InvalidArgument", err)
	}
	nan := slices.Clone(params)
	nan[5] = float32(math.NaN())
	good := &pb.FedAgentResultRequest{Kind: pb.FedTaskKind_FED_TASK_KIND_FIT, Round: 4, NumExamples: 30, Loss: 0.5, Metrics: map[string]float64{"loss": 0.5}}
	if err := sendResult(t, c, good, nan); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "parameter 5") {
		t.Errorf("a NaN parameter: %v; want InvalidArgument naming it", err)
	}
	for i := range params {
		params[i]++
	}
	if err := sendResult(t, c, good, params); err != nil {
		t.Fatal(err)
	}
	a := <-fit
	if a.err != nil || a.r.NumExamples != 30 || a.r.Metrics["loss"] != 0.5 || !slices.Equal(a.r.Params, params) {
		t.Fatalf("fit: %v; want the script's answer", a.err)
	}
	if err := sendResult(t, c, good, params); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a second answer: %v; want FailedPrecondition", err)
	}

	eval := make(chan answer, 1)
	go func() { // owned by the test: ends when the script answers
		r, err := fs.Evaluate(t.Context(), 4, nil, initial)
		eval <- answer{r, err}
	}()
	if head, params, _ := nextTask(t, c, 0); head.Kind != pb.FedTaskKind_FED_TASK_KIND_EVALUATE || !slices.Equal(params, initial) {
		t.Fatalf("evaluation task %v", head)
	}
	ev := &pb.FedAgentResultRequest{Kind: pb.FedTaskKind_FED_TASK_KIND_EVALUATE, Round: 4, NumExamples: 100, Loss: 0.25, Accuracy: 1.5}
	if err := sendResult(t, c, ev, nil); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "accuracy") {
		t.Errorf("accuracy 1.5: %v; want InvalidArgument", err)
	}
	ev.Accuracy = 0.75
	if err := sendResult(t, c, ev, nil); err != nil {
		t.Fatal(err)
	}
	if a := <-eval; a.err != nil || a.r.Accuracy != 0.75 || a.r.Loss != 0.25 {
		t.Fatalf("evaluation: %v, %v", a.r, a.err)
	}

	fs.Finish("rounds over")
	if head, _, _ := nextTask(t, c, 0); head.Kind != pb.FedTaskKind_FED_TASK_KIND_DONE || head.Message != "rounds over" {
		t.Fatalf("after Finish: %v; want DONE", head)
	}
}

// TestFedAbandonedTask: a task the worker gave up on (its deadline) is
// refused when the script answers it late.
func TestFedAbandonedTask(t *testing.T) {
	fs, c := startFed(t)
	js, err := c.Join(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	layout := []*pb.TensorInfo{{Name: "w", Shape: []int64{4}, Dtype: "float32"}}
	if err := js.Send(&pb.FedAgentJoinRequest{Tensors: layout, Data: encode(make([]float32, 4))}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(t.Context())
	failed := make(chan error, 1)
	go func() { // owned by the test: ends when ctx is cancelled
		_, err := fs.Fit(ctx, 2, nil, make([]float32, 4))
		failed <- err
	}()
	if head, _, _ := nextTask(t, c, 0); head.Kind != pb.FedTaskKind_FED_TASK_KIND_FIT {
		t.Fatalf("task %v; want a fit", head)
	}
	cancel(errors.New("its deadline of 1s passed"))
	if err := <-failed; err == nil || !strings.Contains(err.Error(), "did not answer its fit task of round 2: its deadline of 1s passed") {
		t.Fatalf("fit after its deadline: %v", err)
	}
	late := &pb.FedAgentResultRequest{Kind: pb.FedTaskKind_FED_TASK_KIND_FIT, Round: 2, NumExamples: 1}
	if err := sendResult(t, c, late, make([]float32, 4)); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "abandoned") {
		t.Errorf("a late answer: %v; want FailedPrecondition", err)
	}
}
