package jobspec

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gradsync/gradsync/models"
	"github.com/gradsync/gradsync/pipeline"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// maxMicroBatches bounds parallelism.pipeline.micro_batches.
const maxMicroBatches = 1024

const pipelineField = "parallelism.pipeline."

// PipelineStages is a normalized spec's pipeline stages S (1: no
// pipeline, every worker holds the whole model).
func PipelineStages(s *pb.JobSpec) int {
	return max(int(s.GetParallelism().GetPipeline().GetStages()), 1)
}

// Pipelined reports whether a normalized spec splits its model into two
// or more pipeline stages.
func Pipelined(s *pb.JobSpec) bool { return PipelineStages(s) > 1 }

// PipelinePlan is a normalized pipelined spec's schedule, laid out.
func PipelinePlan(s *pb.JobSpec) (pipeline.Plan, error) {
	p := s.GetParallelism().GetPipeline()
	return pipeline.New(pipeline.Schedule(p.GetSchedule()), PipelineStages(s), int(p.GetMicroBatches()))
}

// PipelinePartition cuts net into a normalized spec's stages.
func PipelinePartition(s *pb.JobSpec, net *models.Network) ([]models.Stage, error) {
	return models.Partition(net, PipelineStages(s), PipelineBalance(s))
}

// PipelineBalance is how a pipeline job's model is cut (models.Partition,
// models.NewStage): at the spec's boundaries, else by parameter count.
func PipelineBalance(s *pb.JobSpec) models.Balance {
	return models.Balance{Boundaries: s.GetParallelism().GetPipeline().GetBoundaries()}
}

// pipelineMode is the mode a spec that leaves it empty gets: pipeline
// jobs all-reduce each stage's gradients over a ring.
func pipelineMode(s *pb.JobSpec) string {
	if p := s.GetParallelism(); p.GetPipeline().GetStages() > 1 || p.GetLabelShards() > 1 || p.GetTensor() > 1 {
		return "ring"
	}
	return DefaultMode
}

// pipelineWorkers is the worker count a spec that leaves it unset gets:
// data × stages × label shards × tensor ranks.
func pipelineWorkers(s *pb.JobSpec) int32 {
	p := s.GetParallelism()
	return max(p.GetData(), 1) * max(p.GetPipeline().GetStages(), 1) * max(p.GetLabelShards(), 1) * max(p.GetTensor(), 1)
}

// normalizePipeline checks and defaults parallelism. It runs last, on an
// otherwise normalized spec (the model's blocks decide the cuts).
func normalizePipeline(s *pb.JobSpec) error {
	par := s.GetParallelism()
	if par == nil {
		return nil
	}
	if par.LabelShards < 0 || par.LabelShards > 1 || len(par.LabelGroups) > 0 {
		return normalizeLabelShards(s) // tensor.go
	}
	if par.Tensor != 0 {
		if err := normalizeTensor(s); err != nil || par.Tensor > 1 { // tensor.go
			return err
		}
	}
	workers := s.GetWorkers()
	if par.Data < 0 {
		return errf("parallelism.data", "%d is negative; allowed 1..%d (0: workers / stages)", par.Data, MaxWorkers)
	}
	p := par.Pipeline
	if p == nil {
		p = &pb.PipelineSpec{}
		par.Pipeline = p
	}
	if p.Stages < 0 {
		return errf(pipelineField+"stages", "%d is negative; allowed 1 up to the model's blocks (0: 1, no pipeline)", p.Stages)
	}
	if p.Stages == 0 {
		p.Stages = 1
	}
	S := p.Stages
	if S == 1 {
		if p.MicroBatches != 0 || p.Schedule != "" || len(p.Boundaries) > 0 || p.DebugStageCost != "" || p.Balance != "" {
			return errf(pipelineField+"stages", "micro_batches, schedule, boundaries, balance and debug_stage_cost apply to 2 or more stages; stages is 1")
		}
		if par.Data != 0 && par.Data != workers {
			return errf("parallelism.data", "%d data replicas of 1 stage on %d workers; want data = workers", par.Data, workers)
		}
		par.Data = workers
		return nil
	}
	if workers%S != 0 {
		return errf(pipelineField+"stages", "%d stages do not divide %d workers; workers = data × stages", S, workers)
	}
	if par.Data == 0 {
		par.Data = workers / S
	}
	if par.Data*S != workers {
		return errf("parallelism.data", "%d replicas × %d stages is %d workers, but workers is %d; workers = data × stages", par.Data, S, par.Data*S, workers)
	}
	if s.Mode != "ring" {
		return errf("mode", "pipeline jobs run in mode ring (the replicas of a stage all-reduce its gradients over a ring); mode %s with stages %d %s", s.Mode, S, notImplementedSuffix)
	}
	if p.MicroBatches < 0 || p.MicroBatches > maxMicroBatches {
		return errf(pipelineField+"micro_batches", "%d out of range; allowed 1..%d (0: stages, %d)", p.MicroBatches, maxMicroBatches, S)
	}
	if p.MicroBatches == 0 {
		p.MicroBatches = S
	}
	if b := s.GetBatchSize(); b%p.MicroBatches != 0 {
		return errf(pipelineField+"micro_batches", "batch %d is not a multiple of %d; batch_size (a replica's step batch) must split into micro_batches equal parts", b, p.MicroBatches)
	}
	if p.Schedule == "" {
		p.Schedule = string(pipeline.ScheduleOneFOneB)
	}
	if _, _, err := StageCost(p.DebugStageCost); err != nil {
		return errf(pipelineField+"debug_stage_cost", "%v", err)
	}
	switch p.Balance {
	case "":
		p.Balance = BalanceParams
	case BalanceParams, BalanceTime:
	default:
		return errf(pipelineField+"balance", "unknown balance %q; allowed: %s, %s", p.Balance, BalanceParams, BalanceTime)
	}
	if !slices.Contains(pipeline.Schedules(), pipeline.Schedule(p.Schedule)) {
		return errf(pipelineField+"schedule", "unknown schedule %q; allowed: 1f1b, gpipe", p.Schedule)
	}
	// What does not compose with stages yet.
	switch {
	case s.GradAccumSteps != 1:
		return errf("grad_accum_steps", "%d with pipeline stages: the micro-batches are the accumulation; set parallelism.pipeline.micro_batches instead", s.GradAccumSteps)
	case s.MinWorkers != workers && (s.MinWorkers%S != 0 || par.Data < 2):
		// An elastic pipeline job loses whole replicas: its generations
		// run on a multiple of the stages, at least one replica.
		return errf("min_workers", "%d for a pipeline of %d stages × %d replicas; an elastic pipeline job needs 2 or more replicas and min_workers a multiple of the stages (%d..%d)", s.MinWorkers, S, par.Data, S, workers)
	case s.GetCompression().GetType() != defaultCompression:
		return errf("compression.type", "%s compression with pipeline stages %s", s.GetCompression().GetType(), notImplementedSuffix)
	case s.GradClipNorm != 0:
		return errf("grad_clip_norm", "clipping needs the norm over all stages; with pipeline stages it %s", notImplementedSuffix)
	case s.Precision != "" && s.Precision != "fp32":
		return errf("precision", "%s with pipeline stages %s; use fp32", s.Precision, notImplementedSuffix)
	case s.ActivationCheckpointing != "" && s.ActivationCheckpointing != "none":
		return errf("activation_checkpointing", "%s with pipeline stages %s; use none", s.ActivationCheckpointing, notImplementedSuffix)
	case Streamed(s.GetDataset()):
		return errf("dataset.name", "streamed data set %s with pipeline stages %s; use an IDX or synthetic data set", s.GetDataset().GetName(), notImplementedSuffix)
	case s.NonfinitePolicy == "skip":
		return errf("nonfinite_policy", "skip with pipeline stages %s (the stages would have to agree to skip a step); use fail", notImplementedSuffix)
	case s.GetCheckpoint().GetEverySeconds() > 0:
		return errf("checkpoint.every_seconds", "timed checkpoints of pipeline jobs %s (every stage must agree when one is due); use every_steps or every_epochs", notImplementedSuffix)
	}
	// The cuts: stages ≤ the model's blocks, boundaries at block starts.
	c, h, w, classes := InputShape(s)
	net, err := models.New(s.Model, models.Options{Channels: c, Height: h, Width: w, Classes: classes, Seed: s.GetSeed()})
	if err != nil {
		return errf("model", "%v", err)
	}
	defer net.Close()
	if p.Balance == BalanceTime && len(p.Boundaries) == 0 {
		b, err := timedBoundaries(net, int(S), int(s.GetBatchSize()/p.MicroBatches))
		if err != nil {
			return errf(pipelineField+"balance", "%v", err)
		}
		p.Boundaries = b
	}
	if _, err := models.Partition(net, int(S), models.Balance{Boundaries: p.Boundaries}); err != nil {
		var pe *models.PartitionError
		if errors.As(err, &pe) {
			return errf(pe.Field, "%s", strings.TrimPrefix(pe.Msg, "models: "))
		}
		return errf(pipelineField+"boundaries", "%v", err)
	}
	return nil
}

// The values of parallelism.pipeline.balance.
const (
	BalanceParams = "params"
	BalanceTime   = "time"
)

// balanceReps is how many timed steps balance time measures.
const balanceReps = 5

// timedBoundaries is the cut of net into stages that minimises the
// slowest stage's time, as measured here on micro-batches of micro
// samples (models.BlockTimes: the measurement trains net, which normalize
// builds only to check the cut), written as boundaries: the first block
// name of stages 1..S−1.
func timedBoundaries(m *models.Network, stages, micro int) ([]string, error) {
	times, err := models.BlockTimes(m, max(micro, 1), balanceReps)
	if err != nil {
		return nil, err
	}
	parts, err := models.Partition(m, stages, models.Balance{By: models.ByTime, Times: times})
	if err != nil {
		return nil, err
	}
	b := make([]string, 0, stages-1)
	for _, st := range parts[1:] {
		b = append(b, st.Blocks[0].Name)
	}
	return b, nil
}

// maxStageCost bounds each duration of debug_stage_cost.
const maxStageCost = time.Minute

// StageCost parses parallelism.pipeline.debug_stage_cost,
// "fwd=20ms,bwd=40ms" (either part may be left out; empty: none).
func StageCost(s string) (fwd, bwd time.Duration, err error) {
	if s == "" {
		return 0, 0, nil
	}
	seen := map[string]bool{}
	for part := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || (k != "fwd" && k != "bwd") || seen[k] {
			return 0, 0, fmt.Errorf("%q is not fwd=DURATION or bwd=DURATION (each once), as in fwd=20ms,bwd=40ms", part)
		}
		seen[k] = true
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > maxStageCost {
			return 0, 0, fmt.Errorf("%s=%q is not a duration in [0, %v] (as in fwd=20ms,bwd=40ms)", k, v, maxStageCost)
		}
		if k == "fwd" {
			fwd = d
		} else {
			bwd = d
		}
	}
	return fwd, bwd, nil
}

// MemoryNeed is an estimate of what one rank of a job needs of its
// worker's memory, and what it is made of (for messages).
type MemoryNeed struct {
	Bytes uint64
	What  string
}

// MemoryNeeds estimates what the ranks of a normalized spec need of their
// workers' memory: one entry per pipeline stage (rank r holds stage r mod
// S), or one for every rank of other jobs, which hold the whole model.
// A rank holds its part's parameters, gradients, optimiser state
// (momentum: one more copy; Adam: two) and buffers, 4 bytes a value, and
// the activations of the samples it has in flight — a micro-batch
// (batch_size / micro_batches, or / grad_accum_steps) times the
// micro-batches a stage holds at once (M under GPipe, min(M, S−s) under
// 1F1B; each in-flight micro-batch runs on its own copy of the layers),
// at models.Footprints' bytes (fixed, and per sample). Data, the runtime
// and the transport's buffers come on top. It runs a 1- and a 2-sample
// training step of the model (on placeholder weights): not free for
// large models.
func MemoryNeeds(s *pb.JobSpec) ([]MemoryNeed, error) {
	S := max(PipelineStages(s), 1)
	c, h, w, classes := InputShape(s)
	fps, err := models.Footprints(s.Model, models.Options{Channels: c, Height: h, Width: w, Classes: classes, Seed: s.GetSeed()}, S, PipelineBalance(s))
	if err != nil {
		return nil, err
	}
	copies := 2 // parameters and gradients
	switch o := s.GetOptimizer(); {
	case o.GetName() == "adam" || o.GetName() == "adamw":
		copies += 2
	case o.GetMomentum() != 0:
		copies++
	}
	batch := int64(max(s.GetBatchSize(), 1))
	micro, inFlight := batch/int64(max(s.GetGradAccumSteps(), 1)), func(int) int64 { return 1 }
	if S > 1 {
		M := int64(max(s.GetParallelism().GetPipeline().GetMicroBatches(), 1))
		micro = batch / M
		inFlight = func(st int) int64 {
			if s.GetParallelism().GetPipeline().GetSchedule() == string(pipeline.ScheduleGPipe) {
				return M
			}
			return min(M, int64(S-st))
		}
	}
	out := make([]MemoryNeed, len(fps))
	for st, f := range fps {
		params := int64(4 * copies * f.Params)
		bufs := int64(4 * f.Buffers)
		acts := (f.ActivationBytesFixed + f.ActivationBytesPerSample*max(micro, 1)) * inFlight(st)
		what := "the whole model"
		if S > 1 {
			blocks := f.First
			if f.Last != f.First {
				blocks += " … " + f.Last
			}
			what = fmt.Sprintf("pipeline stage %d of %d (%s)", st, S, blocks)
		}
		out[st] = MemoryNeed{Bytes: uint64(params + bufs + acts),
			What: fmt.Sprintf("%s: parameters, gradients and optimiser state %s, buffers %s, activations %s",
				what, mib(params), mib(bufs), mib(acts))}
	}
	return out, nil
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
