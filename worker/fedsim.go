package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/federated"
	"github.com/gradsync/gradsync/internal/kernels"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
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
		return data.PartitionIIDN(train.N, k, seed), nil
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
//
// With checkpoints the worker writes one after a closed round when the
// spec says (a round counts as a step and as an epoch) and when the job
// stops early: the global model (model.safetensors), the server
// optimiser's state (extra.safetensors, "server.<state>.<param>"), and in
// meta.json Step = rounds closed, Epoch = the last closed round's number.
// A resume continues with the next round exactly as an undisturbed run
// would (sampling and shuffles are drawn from the seed and the round).
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
	var resumed *federated.Snapshot
	var firstDone int64 // rounds closed before this task started
	if a.ResumeFrom != "" {
		if resumed, err = loadFederated(a.ResumeFrom, spec); err != nil {
			return nil, err
		}
		firstDone = int64(resumed.Completed)
		env.log.Info("resumed from a checkpoint", "job", a.JobId, "path", a.ResumeFrom, "rounds", resumed.Completed)
	}
	start := time.Now()
	lastRound, examples := start, 0 // for images/s: examples trained by the clients
	res := &pb.JobResult{GemmBackend: kernels.Backend()}
	prec, err := models.ParsePrecision(spec.GetPrecision())
	if err != nil {
		return nil, err
	}
	var skipped int64 // local steps the clients skipped (fp16)
	cfg := federated.SimConfig{
		Precision: prec,
		Train:     train, Test: test, Partition: parts, Model: spec.GetModel(), Rounds: int(rounds),
		Fraction: f.GetFraction(), LocalEpochs: int(f.GetLocalEpochs()), LocalBatch: int(f.GetLocalBatchSize()),
		ClientLR: float32(f.GetClientLr()), Mu: float32(f.GetMu()),
		Strategy: federated.StrategyConfig{Name: f.GetStrategy(), Weighting: weighting,
			ServerLR: f.GetServerLr(), ServerMomentum: f.GetServerMomentum()},
		Reweighting: f.GetReweighting(), Beta: f.GetBeta(), MinClients: int(f.GetMinClients()),
		EvalEvery: int(f.GetEvalEveryRounds()), Seed: spec.GetSeed(),
		Progress: func(r federated.Record) {
			now := time.Now()
			elapsed := now.Sub(start).Seconds()
			done := int64(r.Round)
			ips := float64(r.Examples) / max(now.Sub(lastRound).Seconds(), 1e-9)
			lastRound, examples = now, examples+r.Examples
			skipped += int64(r.Skipped)
			env.rep.trySend(&pb.ConnectRequest{Msg: &pb.ConnectRequest_Progress{Progress: &pb.TaskProgress{
				JobId: a.JobId, Generation: a.Generation, Rank: a.Rank, Progress: &pb.Progress{
					Epoch: int32(r.Round), Step: done, TotalSteps: rounds, Loss: r.TrainLoss, SkippedSteps: skipped,
					LearningRate: f.GetClientLr(), ElapsedSeconds: elapsed, ImagesPerSecond: ips,
					EtaSeconds: elapsed / float64(max(done-firstDone, 1)) * float64(rounds-done),
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
	cfg.Resume = resumed
	var sim *federated.Sim
	var ckpt *checkpointer
	if a.CheckpointDir != "" {
		ckpt = &checkpointer{dir: a.CheckpointDir, spec: spec, jobID: a.JobId, world: 1, lastSave: time.Now(), meta: jobspec.ModelMetadata(spec, nil, nil)}
		cfg.AfterRound = func(r federated.Record) error {
			done := int64(r.Round)
			if snap := sim.Snapshot(); ckpt.due(int64(snap.Completed), true, snap.Completed-1, time.Now()) {
				path, err := ckpt.saveFederated(snap, time.Now())
				if err != nil {
					return fmt.Errorf("round %d: writing a checkpoint: %w", done, err)
				}
				env.log.Debug("checkpoint written", "job", a.JobId, "path", path)
			}
			return nil
		}
	}
	if sim, err = federated.NewSim(cfg); err != nil {
		return nil, err
	}
	h, err := sim.Run(ctx)
	if err != nil {
		// Stopped early (cancelled, or the job ended elsewhere): keep the
		// rounds closed since the start, so a resume loses nothing.
		if snap := sim.Snapshot(); ckpt != nil && ctx.Err() != nil && int64(snap.Completed) > firstDone {
			if _, serr := ckpt.saveFederated(snap, time.Now()); serr != nil {
				env.log.Warn("checkpoint at cancellation failed", "job", a.JobId, "err", serr)
			}
		}
		return nil, err
	}
	res.TestAccuracy, res.TestLoss = h.FinalAcc, h.FinalLoss
	if train.MultiLabel() {
		res.MicroF1, res.MacroF1, res.MeanAveragePrecision = h.FinalMicroF1, h.FinalMacroF1, h.FinalMAP
	}
	res.ParameterChecksum = models.Checksum(sim.Global())
	res.ImagesPerSecond = float64(examples) / max(time.Since(start).Seconds(), 1e-9)
	res.SkippedSteps = skipped
	if n := len(h.Records); n > 0 {
		res.TrainLoss = h.Records[n-1].TrainLoss
		res.Epochs, res.Steps = int32(h.Records[n-1].Round), int64(h.Records[n-1].Round)
	}
	return res, nil
}

// saveFederated writes a fedavg simulation's snapshot as a checkpoint
// (federated.SaveCheckpoint: the format the coordinator's real-client
// jobs write too).
func (c *checkpointer) saveFederated(snap federated.Snapshot, now time.Time) (string, error) {
	meta := checkpoint.Meta{JobID: c.jobID, SpecHash: specHash(c.spec), WorldSize: c.world, Seed: c.spec.GetSeed()}
	path, err := federated.SaveCheckpoint(c.dir, snap, meta, c.meta, int(c.spec.GetCheckpoint().GetKeep()))
	if err != nil {
		return "", err
	}
	c.lastSave = now
	return path, nil
}

// loadFederated reads a fedavg checkpoint as the snapshot to resume from.
func loadFederated(path string, spec *pb.JobSpec) (*federated.Snapshot, error) {
	return federated.LoadCheckpoint(path, specHash(spec))
}
