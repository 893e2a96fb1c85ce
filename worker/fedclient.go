package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/federated"
	"github.com/gradsync/gradsync/internal/kernels"
	"github.com/gradsync/gradsync/internal/wire"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// fedClient is this worker as one real client of a fedavg job (workers ≥
// 2): client index = its rank. It joins the coordinator's Federation
// stream, trains each round it is sampled for from the global model the
// server sends and sends its update, and, as the evaluator, evaluates the
// global models it is sent. What trains and evaluates is its fedLearner:
// gradsync's own engine (engineLearner) or, in an entrypoint job, the
// user's script (scriptLearner, fedentry.go); the rounds are the same.
type fedClient struct {
	a       *pb.Assignment
	env     *taskEnv
	learner fedLearner
	join    fedJoin
	idle    time.Duration // a stream silent this long (not computing) is dead
	global  []float32     // the model being received
	delta   []float32
	sp      wire.Splitter
	res     *pb.JobResult
	// left: the learner is gone (fedLearnerGone) and the client has left
	// the job; its stream stays open, idle, until the job ends.
	left bool
}

// fedLearner is what a real federated client computes with: it trains
// and evaluates the global models the client is sent.
type fedLearner interface {
	// fit trains round rs from global (read only) and writes the update —
	// the local parameters after training minus global — into delta.
	fit(ctx context.Context, rs *pb.RoundStart, global, delta []float32) (fitResult, error)
	// evaluate evaluates global (read only), the model after round, on
	// the client's test data.
	evaluate(ctx context.Context, round int32, global []float32) (*pb.ClientEval, error)
}

// fitResult is what a fit reports besides its delta.
type fitResult struct {
	numExamples int64
	hist        []int // label histogram; nil: none
	loss        float64
	metrics     map[string]float64
}

// fedLearnerGone is the error of a learner that can take no further part
// (a script that exited, or did not answer within its deadline): the
// client leaves the job (ClientLeave), as a lost worker's client is lost.
type fedLearnerGone struct{ reason string }

func (e *fedLearnerGone) Error() string { return e.reason }

// fedJoin is what a client joins with: its model's size and, for a
// script, its layout and initial parameters (sent after each join); its
// examples and label histogram (gradsync's engine).
type fedJoin struct {
	numParams   int
	numExamples int64
	hist        []int
	layout      []*pb.TensorInfo
	initial     []float32
}

// engineLearner trains with gradsync's own engine on this worker's data:
// its training split (Config.DataDir or the spec's), or, when the spec has
// a partition, part `rank` of that partitioner over it (so one machine
// can demo Non-IID clients), with federated.Trainer — the simulation's
// local training, with the same seeded shuffles, so a client's update is
// the one the simulation computes for it. Batch-norm buffers stay local:
// each client trains and evaluates with its own.
type engineLearner struct {
	a       *pb.Assignment
	train   *data.Dataset
	idx     []int // this client's training examples
	hist    []int
	trainer *federated.Trainer
	obj     *classification
	res     *pb.JobResult // the client's: skipped steps, speed, per-class results
}

func runFedClient(ctx context.Context, a *pb.Assignment, env *taskEnv, train, test *data.Dataset) (*pb.JobResult, error) {
	spec := a.Spec
	k := int(a.Rank)
	idx := make([]int, train.Len())
	for i := range idx {
		idx[i] = i
	}
	if spec.GetPartition() != nil {
		parts, err := partition(spec, train)
		if err != nil {
			return nil, err
		}
		if len(parts) != int(a.WorldSize) {
			return nil, fmt.Errorf("partition into %d parts for %d clients", len(parts), a.WorldSize)
		}
		idx = parts[k]
	}
	f := spec.GetFederated()
	prec, err := models.ParsePrecision(spec.GetPrecision())
	if err != nil {
		return nil, err
	}
	trainer, err := federated.NewTrainer(spec.GetModel(), train, spec.GetSeed(), len(idx), int(f.GetLocalBatchSize()), prec)
	if err != nil {
		return nil, err
	}
	p := trainer.Network().NumParams()
	if int64(p) != a.NumParams {
		return nil, fmt.Errorf("model %s has %d parameters here but %d on the coordinator", spec.GetModel(), p, a.NumParams)
	}
	res := &pb.JobResult{GemmBackend: kernels.Backend()}
	l := &engineLearner{a: a, train: train, idx: idx, hist: train.LabelHistogram(idx), trainer: trainer,
		obj: newClassification(train, test, spec), res: res}
	env.log.Info("federated client", "job", a.JobId, "client", k, "of", a.WorldSize, "examples", len(idx), "labels", l.hist)
	return newFedClient(a, env, l, fedJoin{numParams: p, numExamples: int64(len(idx)), hist: l.hist}, res).run(ctx)
}

func newFedClient(a *pb.Assignment, env *taskEnv, l fedLearner, join fedJoin, res *pb.JobResult) *fedClient {
	f := a.Spec.GetFederated()
	return &fedClient{a: a, env: env, learner: l, join: join,
		idle:   2*time.Duration(f.GetRoundDeadlineSeconds()*float64(time.Second)) + 30*time.Second,
		global: make([]float32, join.numParams), delta: make([]float32, join.numParams), res: res}
}

// run takes part in the job's rounds until they are over.
func (c *fedClient) run(ctx context.Context) (*pb.JobResult, error) {
	a := c.a
	for {
		done, err := c.session(ctx)
		if done {
			return c.res, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if status.Code(err) != codes.Aborted || c.left {
			return nil, fmt.Errorf("federated client %d: %w", a.Rank, err)
		}
		// A late update: the round closed without it. Join again for the
		// next round this client is sampled for.
		c.env.log.Info("federated update refused; joining again", "job", a.JobId, "client", a.Rank, "reason", status.Convert(err).Message())
	}
}

// session is one Participate stream; done reports that the job's rounds
// are over.
func (c *fedClient) session(ctx context.Context) (done bool, err error) {
	a := c.a
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Every wait for the server is bounded: a stream silent for idle while
	// this client is not computing is dead.
	watchdog := time.AfterFunc(c.idle, cancel)
	defer watchdog.Stop()
	stream, err := pb.NewFederationClient(c.env.conn).Participate(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = stream.CloseSend() }()
	join := &pb.FederationJoin{JobId: a.JobId, Generation: a.Generation, Client: a.Rank, NumClients: a.WorldSize,
		NumParams: int64(len(c.global)), NumExamples: c.join.numExamples, Layout: c.join.layout}
	for _, v := range c.join.hist {
		join.LabelHistogram = append(join.LabelHistogram, int64(v))
	}
	if err := stream.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Join{Join: join}}); err != nil {
		return false, err
	}
	if c.join.layout != nil { // a script's initial parameters follow
		err := c.sp.Frames(&pb.TensorFrame{JobId: a.JobId, Generation: a.Generation, Op: pb.Op_OP_BROADCAST, Phase: 2, Rank: a.Rank},
			c.join.initial, func(f *pb.TensorFrame) error {
				return stream.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Delta{Delta: f}})
			})
		if err != nil {
			return false, err
		}
	}
	recv := func() (*pb.ParticipateResponse, error) {
		m, err := stream.Recv()
		if err == nil && !c.left {
			watchdog.Reset(c.idle)
		} else if ctx.Err() != nil && status.Code(err) == codes.Canceled {
			err = status.Errorf(codes.Unavailable, "no word from the coordinator for %v", c.idle)
		}
		return m, err
	}
	for {
		m, err := recv()
		if errors.Is(err, io.EOF) {
			return false, status.Error(codes.Unavailable, "the coordinator ended the federation stream")
		}
		if err != nil {
			return false, err
		}
		switch m := m.Msg.(type) {
		case *pb.ParticipateResponse_Joined, *pb.ParticipateResponse_Accepted:
		case *pb.ParticipateResponse_Round:
			rs := m.Round
			if !rs.Sampled {
				continue
			}
			if err := c.receiveModel(recv, int64(rs.Round), 0); err != nil {
				return false, err
			}
			if c.left {
				continue // sent before the coordinator heard that it left
			}
			watchdog.Stop() // training is not waiting
			err := c.trainAndSend(ctx, stream, rs)
			if err = c.leaveIfGone(stream, err); err != nil {
				return false, err
			}
			if !c.left {
				watchdog.Reset(c.idle)
			}
		case *pb.ParticipateResponse_Eval:
			round := m.Eval.Round
			if err := c.receiveModel(recv, int64(round), 1); err != nil {
				return false, err
			}
			if c.left {
				continue // the next evaluator has it
			}
			watchdog.Stop()
			err := c.evaluate(ctx, stream, round)
			if err = c.leaveIfGone(stream, err); err != nil {
				return false, err
			}
			if !c.left {
				watchdog.Reset(c.idle)
			}
		case *pb.ParticipateResponse_Done:
			c.env.log.Info("federated rounds over", "job", a.JobId, "client", a.Rank, "message", m.Done.Message)
			return true, nil
		case *pb.ParticipateResponse_Model:
			return false, fmt.Errorf("model frame without a round start or evaluation request")
		default:
			return false, fmt.Errorf("unexpected message %T from the coordinator", m)
		}
	}
}

// leaveIfGone: when err says the learner is gone, the client leaves the
// job (ClientLeave, naming why) and keeps its stream open, with no
// watchdog, until the job ends (the coordinator ends the stream, or the
// task is cancelled): it is lost, as a lost worker's client is. Other
// errors are returned.
func (c *fedClient) leaveIfGone(stream pb.Federation_ParticipateClient, err error) error {
	var gone *fedLearnerGone
	if !errors.As(err, &gone) {
		return err
	}
	c.env.log.Warn("federated client leaves the job", "job", c.a.JobId, "client", c.a.Rank, "worker", c.env.worker, "reason", gone.reason)
	c.left = true
	return stream.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Leave{Leave: &pb.ClientLeave{
		Reason: fmt.Sprintf("worker %s: %s", c.env.worker, gone.reason)}}})
}

// receiveModel reads the model frames that follow a round start (phase 0)
// or an evaluation request (phase 1) into c.global.
func (c *fedClient) receiveModel(recv func() (*pb.ParticipateResponse, error), step int64, phase uint32) error {
	var asm wire.Assembler
	asm.Start(wire.Expect{JobID: c.a.JobId, Generation: c.a.Generation, Op: pb.Op_OP_BROADCAST, Step: step, Total: uint64(len(c.global))}, phase)
	for {
		m, err := recv()
		if err != nil {
			return err
		}
		f := m.GetModel()
		if f == nil {
			return fmt.Errorf("expected a model frame, got %T", m.Msg)
		}
		if err := asm.Copy(c.global, f); err != nil {
			return fmt.Errorf("model frame: %w", err)
		}
		if asm.Done() {
			return nil
		}
	}
}

// trainAndSend has the learner train the round from c.global and sends
// the update.
func (c *fedClient) trainAndSend(ctx context.Context, stream pb.Federation_ParticipateClient, rs *pb.RoundStart) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	start := time.Now()
	fr, err := c.learner.fit(ctx, rs, c.global, c.delta)
	if err != nil {
		return err
	}
	secs := time.Since(start).Seconds()
	c.env.log.Debug("federated round trained", "job", c.a.JobId, "client", c.a.Rank, "round", rs.Round, "loss", fr.loss, "seconds", secs)
	if secs > 0 {
		c.res.ImagesPerSecond = float64(fr.numExamples*int64(max(rs.LocalEpochs, 1))) / secs
	}
	up := &pb.ClientUpdate{Round: rs.Round, NumExamples: fr.numExamples, TrainLoss: fr.loss, Metrics: fr.metrics}
	for _, v := range fr.hist {
		up.LabelHistogram = append(up.LabelHistogram, int64(v))
	}
	if err := stream.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Update{Update: up}}); err != nil {
		return err
	}
	c.res.TrainLoss, c.res.Epochs, c.res.Steps = fr.loss, rs.Round, int64(rs.Round)
	return c.sp.Frames(&pb.TensorFrame{JobId: c.a.JobId, Generation: c.a.Generation, Op: pb.Op_OP_PUSH_GRADIENT, Step: int64(rs.Round), Rank: c.a.Rank},
		c.delta, func(f *pb.TensorFrame) error {
			return stream.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Delta{Delta: f}})
		})
}

// evaluate has the learner evaluate c.global and sends the result.
func (c *fedClient) evaluate(ctx context.Context, stream pb.Federation_ParticipateClient, round int32) error {
	ev, err := c.learner.evaluate(ctx, round, c.global)
	if err != nil {
		return err
	}
	c.res.TestAccuracy, c.res.TestLoss = ev.TestAccuracy, ev.TestLoss
	return stream.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Eval{Eval: ev}})
}

// fit implements fedLearner with federated.Trainer.
func (l *engineLearner) fit(_ context.Context, rs *pb.RoundStart, global, delta []float32) (fitResult, error) {
	if w := rs.ClassWeights; len(w) != 0 && len(w) != l.train.Classes {
		return fitResult{}, fmt.Errorf("round %d: %d class weights for %d classes", rs.Round, len(w), l.train.Classes)
	}
	var cw []float32
	if len(rs.ClassWeights) > 0 {
		cw = rs.ClassWeights
	}
	loss := l.trainer.Train(l.train, l.idx, global, nil, federated.LocalConfig{
		Epochs: int(rs.LocalEpochs), Batch: int(rs.LocalBatchSize), LR: float32(rs.ClientLr), Mu: float32(rs.Mu),
		ClassWeights: cw, Seed: l.a.Spec.GetSeed(), Round: int(rs.Round), Client: int(l.a.Rank)})
	for i, p := range l.trainer.Network().Params() {
		delta[i] = p - global[i]
	}
	l.res.SkippedSteps += int64(l.trainer.Skipped())
	return fitResult{numExamples: int64(len(l.idx)), hist: l.hist, loss: loss}, nil
}

// evaluate implements fedLearner on the test split.
func (l *engineLearner) evaluate(ctx context.Context, round int32, global []float32) (*pb.ClientEval, error) {
	net := l.trainer.Network()
	copy(net.Params(), global)
	res := &pb.JobResult{}
	if err := l.obj.evaluate(ctx, net, res); err != nil {
		return nil, err
	}
	l.res.ClassAccuracy, l.res.ConfusionMatrix = res.ClassAccuracy, res.ConfusionMatrix
	return &pb.ClientEval{Round: round, TestAccuracy: res.TestAccuracy, TestLoss: res.TestLoss, TestExamples: int64(l.obj.test.Len())}, nil
}
