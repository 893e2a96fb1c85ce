package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/federated"
	"github.com/gradsync/gradsync/internal/tensor"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// partition splits the training set between the job's clients as the spec
// says (seeded; every example goes to exactly one client).
func partition(spec *pb.JobSpec, train *data.Dataset) ([][]int, error) {
	k := int(spec.GetFederated().GetClients())
	seed := spec.GetSeed()
	p := spec.GetPartition()
	switch p.GetType() {
	case "iid":
		return data.PartitionIID(train.Labels, k, seed), nil
	case "dirichlet":
		return data.PartitionDirichlet(train.Labels, train.Classes, k, p.GetAlpha(), seed)
	case "shards":
		return data.PartitionShards(train.Labels, k, int(p.GetShardsPerClient()), seed)
	case "label":
		return data.PartitionLabel(train.Labels, train.Classes, k, seed)
	}
	return nil, fmt.Errorf("unknown partitioning %q", p.GetType())
}

// runFederated runs a fedavg job's rounds with every client simulated in
// this worker (as Flower's simulation does): each round the sampled clients
// train in turn from the global model, and the server rule aggregates their
// updates. Each closed round is reported as progress and an evaluation.
func runFederated(ctx context.Context, a *pb.Assignment, env *taskEnv, train, test *data.Dataset) (*pb.JobResult, error) {
	spec := a.Spec
	f := spec.GetFederated()
	parts, err := partition(spec, train)
	if err != nil {
		return nil, err
	}
	weighting, err := federated.ParseWeighting(f.GetWeighting())
	if err != nil {
		return nil, err
	}
	rounds := int64(f.GetRounds())
	start := time.Now()
	res := &pb.JobResult{GemmBackend: tensor.Backend()}
	cfg := federated.SimConfig{
		Train: train, Test: test, Partition: parts, Model: spec.GetModel(), Rounds: int(rounds),
		Fraction: f.GetFraction(), LocalEpochs: int(f.GetLocalEpochs()), LocalBatch: int(f.GetLocalBatchSize()),
		ClientLR: float32(f.GetClientLr()), Mu: float32(f.GetMu()),
		Strategy: federated.StrategyConfig{Name: f.GetStrategy(), Weighting: weighting,
			ServerLR: f.GetServerLr(), ServerMomentum: f.GetServerMomentum()},
		Reweighting: f.GetReweighting(), Beta: f.GetBeta(), MinClients: int(f.GetMinClients()),
		EvalEvery: int(f.GetEvalEveryRounds()), Seed: spec.GetSeed(),
		Progress: func(r federated.Record) {
			elapsed := time.Since(start).Seconds()
			done := int64(r.Round)
			env.rep.trySend(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Progress{Progress: &pb.TaskProgress{
				JobId: a.JobId, Generation: a.Generation, Rank: a.Rank, Progress: &pb.Progress{
					Epoch: int32(r.Round), Step: done, TotalSteps: rounds, Loss: r.TrainLoss,
					LearningRate: f.GetClientLr(), ElapsedSeconds: elapsed,
					EtaSeconds: elapsed / float64(max(done, 1)) * float64(rounds-done),
				}}}})
			if !r.Evaluated {
				return
			}
			info := &pb.RoundInfo{Round: int32(r.Round), UpdateNorm: r.UpdateNorm}
			for _, c := range r.Participants {
				info.Participants = append(info.Participants, int32(c))
			}
			for _, c := range r.Missing {
				info.Missing = append(info.Missing, int32(c))
			}
			for _, h := range r.LabelHists {
				lh := &pb.LabelHistogram{}
				for _, n := range h {
					lh.Counts = append(lh.Counts, int32(n))
				}
				info.LabelHistograms = append(info.LabelHistograms, lh)
			}
			env.rep.send(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Eval{Eval: &pb.TaskEval{JobId: a.JobId, Rank: a.Rank, Generation: a.Generation,
				Epoch: int32(r.Round), Step: done, TestAccuracy: r.TestAcc, TestLoss: r.TestLoss, TrainLoss: r.TrainLoss, Round: info}}})
			res.Epochs, res.Steps = int32(r.Round), done
		},
	}
	if f.GetFullBatch() {
		cfg.LocalBatch = 0
	}
	h, err := federated.Simulate(ctx, cfg)
	if err != nil {
		return nil, err
	}
	res.TestAccuracy, res.TestLoss = h.FinalAcc, h.FinalLoss
	if n := len(h.Records); n > 0 {
		res.TrainLoss = h.Records[n-1].TrainLoss
		res.Epochs, res.Steps = int32(h.Records[n-1].Round), int64(h.Records[n-1].Round)
	}
	return res, nil
}
