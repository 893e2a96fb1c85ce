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
// 2): client index = its rank, training on its own data — its training
// split (Config.DataDir or the spec's), or, when the spec has a
// partition, part `rank` of that partitioner over it (so one machine can
// demo Non-IID clients). It joins the coordinator's Federation stream,
// trains each round it is sampled for from the global model the server
// sends (federated.Trainer: the simulation's local training, with the
// same seeded shuffles, so a client's update is the one the simulation
// computes for it), and, as the evaluator, evaluates the global models it
// is sent on its test split. Batch-norm buffers stay local: each client
// trains and evaluates with its own.
type fedClient struct {
	a       *pb.Assignment
	env     *taskEnv
	train   *data.Dataset
	idx     []int // this client's training examples
	hist    []int
	trainer *federated.Trainer
	obj     *classification
	idle    time.Duration // a stream silent this long (not training) is dead
	global  []float32     // the model being received
	delta   []float32
	sp      wire.Splitter
	res     *pb.JobResult
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
	c := &fedClient{
		a: a, env: env, train: train, idx: idx, hist: train.LabelHistogram(idx),
		trainer: trainer, obj: newClassification(train, test, spec),
		idle:   2*time.Duration(f.GetRoundDeadlineSeconds()*float64(time.Second)) + 30*time.Second,
		global: make([]float32, p), delta: make([]float32, p), res: &pb.JobResult{GemmBackend: kernels.Backend()},
	}
	env.log.Info("federated client", "job", a.JobId, "client", k, "of", a.WorldSize, "examples", len(idx), "labels", c.hist)
	for {
		done, err := c.session(ctx)
		if done {
			return c.res, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if status.Code(err) != codes.Aborted {
			return nil, fmt.Errorf("federated client %d: %w", k, err)
		}
		// A late update: the round closed without it. Join again for the
		// next round this client is sampled for.
		env.log.Info("federated update refused; joining again", "job", a.JobId, "client", k, "reason", status.Convert(err).Message())
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
		NumParams: int64(len(c.global)), NumExamples: int64(len(c.idx))}
	for _, v := range c.hist {
		join.LabelHistogram = append(join.LabelHistogram, int64(v))
	}
	if err := stream.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Join{Join: join}}); err != nil {
		return false, err
	}
	recv := func() (*pb.ParticipateResponse, error) {
		m, err := stream.Recv()
		if err == nil {
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
			watchdog.Stop() // training is not waiting
			err := c.trainAndSend(ctx, stream, rs)
			watchdog.Reset(c.idle)
			if err != nil {
				return false, err
			}
		case *pb.ParticipateResponse_Eval:
			round := m.Eval.Round
			if err := c.receiveModel(recv, int64(round), 1); err != nil {
				return false, err
			}
			watchdog.Stop()
			err := c.evaluate(ctx, stream, round)
			watchdog.Reset(c.idle)
			if err != nil {
				return false, err
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

// trainAndSend trains the round from c.global and sends the update.
func (c *fedClient) trainAndSend(ctx context.Context, stream pb.Federation_ParticipateClient, rs *pb.RoundStart) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if w := rs.ClassWeights; len(w) != 0 && len(w) != c.train.Classes {
		return fmt.Errorf("round %d: %d class weights for %d classes", rs.Round, len(w), c.train.Classes)
	}
	start := time.Now()
	var cw []float32
	if len(rs.ClassWeights) > 0 {
		cw = rs.ClassWeights
	}
	loss := c.trainer.Train(c.train, c.idx, c.global, nil, federated.LocalConfig{
		Epochs: int(rs.LocalEpochs), Batch: int(rs.LocalBatchSize), LR: float32(rs.ClientLr), Mu: float32(rs.Mu),
		ClassWeights: cw, Seed: c.a.Spec.GetSeed(), Round: int(rs.Round), Client: int(c.a.Rank)})
	for i, p := range c.trainer.Network().Params() {
		c.delta[i] = p - c.global[i]
	}
	c.res.SkippedSteps += int64(c.trainer.Skipped())
	secs := time.Since(start).Seconds()
	c.env.log.Debug("federated round trained", "job", c.a.JobId, "client", c.a.Rank, "round", rs.Round, "loss", loss, "seconds", secs)
	if secs > 0 {
		c.res.ImagesPerSecond = float64(len(c.idx)*max(int(rs.LocalEpochs), 1)) / secs
	}
	up := &pb.ClientUpdate{Round: rs.Round, NumExamples: int64(len(c.idx)), TrainLoss: loss}
	for _, v := range c.hist {
		up.LabelHistogram = append(up.LabelHistogram, int64(v))
	}
	if err := stream.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Update{Update: up}}); err != nil {
		return err
	}
	c.res.TrainLoss, c.res.Epochs, c.res.Steps = loss, rs.Round, int64(rs.Round)
	return c.sp.Frames(&pb.TensorFrame{JobId: c.a.JobId, Generation: c.a.Generation, Op: pb.Op_OP_PUSH_GRADIENT, Step: int64(rs.Round), Rank: c.a.Rank},
		c.delta, func(f *pb.TensorFrame) error {
			return stream.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Delta{Delta: f}})
		})
}

// evaluate evaluates c.global on the test split and sends the result.
func (c *fedClient) evaluate(ctx context.Context, stream pb.Federation_ParticipateClient, round int32) error {
	net := c.trainer.Network()
	copy(net.Params(), c.global)
	res := &pb.JobResult{}
	if err := c.obj.evaluate(ctx, net, res); err != nil {
		return err
	}
	c.res.TestAccuracy, c.res.TestLoss = res.TestAccuracy, res.TestLoss
	c.res.ClassAccuracy, c.res.ConfusionMatrix = res.ClassAccuracy, res.ConfusionMatrix
	return stream.Send(&pb.ParticipateRequest{Msg: &pb.ParticipateRequest_Eval{Eval: &pb.ClientEval{
		Round: round, TestAccuracy: res.TestAccuracy, TestLoss: res.TestLoss, TestExamples: int64(c.obj.test.Len())}}})
}
