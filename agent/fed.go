package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// FedServer is the FedAgent service (agent.proto) a worker serves to the
// script of a fedavg entrypoint job: one federated client. The script
// joins with its layout and initial parameters, then pulls tasks (Next)
// and answers them (Result); the worker's federated client hands it the
// tasks (Fit, Evaluate) and ends it (Finish). Parameters travel in chunks
// of at most MaxElements values.
type FedServer struct {
	pb.UnimplementedFedAgentServer
	cfg FedConfig

	joined chan struct{} // closed once join is set
	tasks  chan *fedTask // the task the worker offers; Next takes it
	done   chan struct{} // closed by Finish

	// mu protects join, pending and doneMsg.
	mu      sync.Mutex
	join    *FedJoin
	pending *fedTask // the task handed to the script and not yet answered
	doneMsg string
}

// FedConfig configures a FedServer.
type FedConfig struct {
	JobID              string
	Client, NumClients int
	Rounds             int
}

// FedJoin is what the script joined with.
type FedJoin struct {
	Layout  []*pb.TensorInfo
	Initial []float32
}

// FedResult is the script's answer to a task.
type FedResult struct {
	NumExamples int64
	Loss        float64
	Accuracy    float64 // an evaluation's
	Metrics     map[string]float64
	Params      []float32 // a fit's new parameters
}

// fedTask is one task for the script: its parameters are the task's own
// copy (the script may still read them after the worker gave up).
type fedTask struct {
	kind   pb.FedTaskKind
	round  int32
	config map[string]float64
	params []float32
	result chan *FedResult // capacity 1: the answer
}

// NewFed returns a FedServer for cfg.
func NewFed(cfg FedConfig) *FedServer {
	return &FedServer{cfg: cfg, joined: make(chan struct{}), tasks: make(chan *fedTask), done: make(chan struct{})}
}

// Joined is closed once the script has joined; Joining then returns it.
func (s *FedServer) Joined() <-chan struct{} { return s.joined }

// Joining returns what the script joined with (nil before it has).
func (s *FedServer) Joining() *FedJoin {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.join
}

// Finish tells the script that it is done (its next Next answers DONE
// with msg). Call it once.
func (s *FedServer) Finish(msg string) {
	s.mu.Lock()
	s.doneMsg = msg
	s.mu.Unlock()
	close(s.done)
}

// Fit hands the script round's fit of params (copied) with config and
// waits for its answer, until ctx ends.
func (s *FedServer) Fit(ctx context.Context, round int32, config map[string]float64, params []float32) (*FedResult, error) {
	return s.run(ctx, &fedTask{kind: pb.FedTaskKind_FED_TASK_KIND_FIT, round: round, config: config, params: params})
}

// Evaluate hands the script the evaluation of round's global model
// params (copied) and waits for its answer, until ctx ends.
func (s *FedServer) Evaluate(ctx context.Context, round int32, config map[string]float64, params []float32) (*FedResult, error) {
	return s.run(ctx, &fedTask{kind: pb.FedTaskKind_FED_TASK_KIND_EVALUATE, round: round, config: config, params: params})
}

func (s *FedServer) run(ctx context.Context, t *fedTask) (*FedResult, error) {
	t.params = append([]float32(nil), t.params...)
	t.result = make(chan *FedResult, 1)
	select {
	case s.tasks <- t:
	case <-ctx.Done():
		return nil, fmt.Errorf("the script did not ask for its %s task of round %d: %w", taskName(t.kind), t.round, context.Cause(ctx))
	}
	defer func() {
		s.mu.Lock()
		if s.pending == t {
			s.pending = nil // abandoned: a late answer is refused
		}
		s.mu.Unlock()
	}()
	select {
	case r := <-t.result:
		return r, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("the script did not answer its %s task of round %d: %w", taskName(t.kind), t.round, context.Cause(ctx))
	}
}

func taskName(k pb.FedTaskKind) string {
	switch k {
	case pb.FedTaskKind_FED_TASK_KIND_FIT:
		return "fit"
	case pb.FedTaskKind_FED_TASK_KIND_EVALUATE:
		return "evaluate"
	}
	return k.String()
}

// Join implements pb.FedAgentServer.
func (s *FedServer) Join(stream pb.FedAgent_JoinServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	n, _, err := layoutSum(first.GetTensors())
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if n > maxShmElements {
		return status.Errorf(codes.ResourceExhausted, "a model of %d values; at most %d", n, maxShmElements)
	}
	s.mu.Lock()
	already := s.join != nil
	s.mu.Unlock()
	if already {
		return status.Error(codes.AlreadyExists, "this client has joined already: join once")
	}
	// Grown as the values come, not made for the layout's claim: a
	// layout of 2^32 values must not take 16 GiB before any arrives.
	initial := make([]float32, 0, min(n, MaxElements))
	m := first
	for {
		if int64(len(initial))+int64(len(m.GetData()))/4 > n {
			return status.Errorf(codes.InvalidArgument, "more than the layout's %d initial values", n)
		}
		if initial, err = appendF32(initial, m.GetData()); err != nil {
			return err
		}
		if m, err = stream.Recv(); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return err
		}
		if len(m.GetTensors()) > 0 {
			return status.Error(codes.InvalidArgument, "the layout goes in the first message only")
		}
	}
	if int64(len(initial)) != n {
		return status.Errorf(codes.InvalidArgument, "%d initial values; the layout holds %d", len(initial), n)
	}
	if err := checkFinite("initial parameter", initial); err != nil {
		return err
	}
	s.mu.Lock()
	if s.join != nil {
		s.mu.Unlock()
		return status.Error(codes.AlreadyExists, "this client has joined already: join once")
	}
	s.join = &FedJoin{Layout: first.GetTensors(), Initial: initial}
	s.mu.Unlock()
	close(s.joined)
	return stream.SendAndClose(&pb.FedAgentJoinResponse{JobId: s.cfg.JobID, Client: int32(s.cfg.Client), NumClients: int32(s.cfg.NumClients),
		Rounds: int32(s.cfg.Rounds), MaxElements: MaxElements})
}

// maxWait bounds a Next call's wait for a task.
const maxWait = 60 * time.Second

// Next implements pb.FedAgentServer.
func (s *FedServer) Next(req *pb.FedAgentNextRequest, stream pb.FedAgent_NextServer) error {
	if s.Joining() == nil {
		return status.Error(codes.FailedPrecondition, "join first")
	}
	wait := maxWait
	if w := req.GetWaitSeconds(); w > 0 && w < maxWait.Seconds() {
		wait = time.Duration(w * float64(time.Second))
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var t *fedTask
	select {
	case <-s.done:
		s.mu.Lock()
		msg := s.doneMsg
		s.mu.Unlock()
		return stream.Send(&pb.FedAgentNextResponse{Kind: pb.FedTaskKind_FED_TASK_KIND_DONE, Message: msg})
	case <-timer.C:
		return stream.Send(&pb.FedAgentNextResponse{Kind: pb.FedTaskKind_FED_TASK_KIND_NONE})
	case <-stream.Context().Done():
		return status.FromContextError(stream.Context().Err()).Err()
	case t = <-s.tasks:
	}
	s.mu.Lock()
	s.pending = t
	s.mu.Unlock()
	head := &pb.FedAgentNextResponse{Kind: t.kind, Round: t.round, Config: t.config, NumElements: int64(len(t.params))}
	if err := stream.Send(head); err != nil {
		return err
	}
	for off := 0; off < len(t.params); off += MaxElements {
		if err := stream.Send(&pb.FedAgentNextResponse{Data: encode(t.params[off:min(off+MaxElements, len(t.params))])}); err != nil {
			return err
		}
	}
	return nil
}

// Result implements pb.FedAgentServer.
func (s *FedServer) Result(stream pb.FedAgent_ResultServer) error {
	head, err := stream.Recv()
	if err != nil {
		return err
	}
	s.mu.Lock()
	t := s.pending
	s.mu.Unlock()
	switch {
	case t == nil:
		return status.Errorf(codes.FailedPrecondition, "no task in hand for the %s of round %d (it was abandoned at its deadline, or never given)", taskName(head.GetKind()), head.GetRound())
	case head.GetKind() != t.kind || head.GetRound() != t.round:
		return status.Errorf(codes.InvalidArgument, "a result for the %s of round %d; the task in hand is the %s of round %d", taskName(head.GetKind()), head.GetRound(), taskName(t.kind), t.round)
	}
	r := &FedResult{NumExamples: head.GetNumExamples(), Loss: head.GetLoss(), Accuracy: head.GetAccuracy(), Metrics: head.GetMetrics()}
	if err := checkResult(r, t.kind); err != nil {
		return err
	}
	if t.kind == pb.FedTaskKind_FED_TASK_KIND_FIT {
		n := len(t.params)
		r.Params = make([]float32, 0, n)
		m := head
		for {
			if len(r.Params)+len(m.GetData())/4 > n {
				return status.Errorf(codes.InvalidArgument, "more than the layout's %d values", n)
			}
			if r.Params, err = appendF32(r.Params, m.GetData()); err != nil {
				return err
			}
			if m, err = stream.Recv(); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return err
			}
		}
		if len(r.Params) != n {
			return status.Errorf(codes.InvalidArgument, "%d parameter values; the layout holds %d", len(r.Params), n)
		}
		if err := checkFinite("parameter", r.Params); err != nil {
			return err
		}
	} else if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		if err == nil {
			err = status.Error(codes.InvalidArgument, "an evaluation's result is one message")
		}
		return err
	}
	s.mu.Lock()
	if s.pending != t {
		s.mu.Unlock()
		return status.Errorf(codes.FailedPrecondition, "the %s of round %d was abandoned at its deadline", taskName(t.kind), t.round)
	}
	s.pending = nil
	s.mu.Unlock()
	t.result <- r // capacity 1, sent once
	return stream.SendAndClose(&pb.FedAgentResultResponse{})
}

// Bounds of a script's metrics.
const (
	maxMetrics    = 64
	maxMetricName = 128
)

// checkResult refuses what the coordinator could not record.
func checkResult(r *FedResult, kind pb.FedTaskKind) error {
	if r.NumExamples < 0 || r.NumExamples > 1<<31 {
		return status.Errorf(codes.InvalidArgument, "num_examples %d out of range [0, 2^31]", r.NumExamples)
	}
	if math.IsNaN(r.Loss) || math.IsInf(r.Loss, 0) || r.Loss < 0 {
		return status.Errorf(codes.InvalidArgument, "loss %v: want a finite number ≥ 0", r.Loss)
	}
	if kind == pb.FedTaskKind_FED_TASK_KIND_EVALUATE && !(r.Accuracy >= 0 && r.Accuracy <= 1) {
		return status.Errorf(codes.InvalidArgument, "accuracy %v out of range [0, 1]", r.Accuracy)
	}
	if len(r.Metrics) > maxMetrics {
		return status.Errorf(codes.InvalidArgument, "%d metrics; at most %d", len(r.Metrics), maxMetrics)
	}
	for k, v := range r.Metrics {
		if k == "" || len(k) > maxMetricName {
			return status.Errorf(codes.InvalidArgument, "metric name %q: must be 1..%d bytes", k, maxMetricName)
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return status.Errorf(codes.InvalidArgument, "metric %s is %v; want a finite number", k, v)
		}
	}
	return nil
}

// appendF32 appends the little-endian float32 values of b to dst.
func appendF32(dst []float32, b []byte) ([]float32, error) {
	if len(b)%4 != 0 {
		return nil, status.Errorf(codes.InvalidArgument, "data is %d bytes, not a whole number of float32 values", len(b))
	}
	if len(b)/4 > MaxElements {
		return nil, status.Errorf(codes.ResourceExhausted, "a message of %d values; at most %d", len(b)/4, MaxElements)
	}
	v, err := decode(b)
	if err != nil {
		return nil, err
	}
	return append(dst, v...), nil
}

func checkFinite(what string, v []float32) error {
	for i, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return status.Errorf(codes.InvalidArgument, "%s %d is %v; want a finite number", what, i, x)
		}
	}
	return nil
}
