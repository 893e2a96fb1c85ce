package jobspec

import (
	"slices"
	"strconv"
	"strings"

	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
	"github.com/gradsync/gradsync/tensorpar"
)

// This file checks the model-parallel strategies of package tensorpar as
// a job's parallelism: label shards of the classifier head
// (parallelism.label_shards, label_groups).

const labelField = "parallelism.label_shards"

// LabelShards is a normalized spec's label shards L (1: none, every
// worker holds the whole head).
func LabelShards(s *pb.JobSpec) int {
	return max(int(s.GetParallelism().GetLabelShards()), 1)
}

// LabelSharded reports whether a normalized spec splits its classifier
// head's classes over two or more workers.
func LabelSharded(s *pb.JobSpec) bool { return LabelShards(s) > 1 }

// LabelShardClasses is the classes of each of a normalized label-sharded
// spec's L shards (shard r's, in the order its rows hold them):
// contiguous ranges (tensorpar.Contiguous), or the spec's label_groups
// given out in contiguous runs (tensorpar.FromGroups).
func LabelShardClasses(s *pb.JobSpec) ([][]int, error) {
	_, _, _, classes := InputShape(s)
	l := LabelShards(s)
	groups := s.GetParallelism().GetLabelGroups()
	if len(groups) == 0 {
		return tensorpar.Contiguous(classes, l)
	}
	gs := make([][]int, len(groups))
	for i, g := range groups {
		for _, c := range g.GetClasses() {
			gs[i] = append(gs[i], int(c))
		}
	}
	return tensorpar.FromGroups(gs, classes, l)
}

// LabelHead is the block of a model that a label-sharded job splits by
// classes, and the body before it: the model's last block, which must be
// one Linear layer onto the classes (its weight (classes, in)).
type LabelHead struct {
	Body, Head models.Stage // the blocks before the head, and the head
	In         int          // the head's input features
}

// LabelHeadOf finds net's classifier head (see LabelHead); net is the
// whole model or a stage of it (its Blocks and WholeSegments are the
// whole model's).
func LabelHeadOf(net *models.Network) (LabelHead, error) {
	blocks := net.Blocks()
	if len(blocks) < 2 {
		return LabelHead{}, errf("model", "%s has %d block(s); a label-sharded head needs a body before its classifier", net.Name(), len(blocks))
	}
	last := blocks[len(blocks)-1]
	kinds := net.LayerKinds()
	segs := net.WholeSegments()
	var w *models.Segment
	for i := range segs {
		if segs[i].Offset == last.ParamOffset {
			w = &segs[i]
		}
	}
	classes := net.Options().Classes
	if last.End-last.First != 1 || kinds[last.First] != "Linear" || w == nil || len(w.Shape) != 2 || w.Shape[0] != classes ||
		last.ParamLen != classes*(w.Shape[1]+1) {
		return LabelHead{}, errf("model", "%s's last block %s is not one Linear layer onto its %d classes; label shards split such a head only", net.Name(), last.Name, classes)
	}
	parts, err := models.Partition(net, 2, models.Balance{Boundaries: []string{last.Name}})
	if err != nil {
		return LabelHead{}, errf("model", "%s: cutting off its head %s: %v", net.Name(), last.Name, err)
	}
	return LabelHead{Body: parts[0], Head: parts[1], In: w.Shape[1]}, nil
}

// LabelHeadBalance is the cut models.NewStage makes between a
// label-sharded model's body (stage 0) and its head (stage 1).
func LabelHeadBalance(h LabelHead) models.Balance {
	return models.Balance{Boundaries: []string{h.Head.Blocks[0].Name}}
}

// normalizeLabelShards checks and defaults a label-sharded spec's
// parallelism (label_shards > 1, or anything else of it set): workers = data × L, data-parallel
// replicas of L ranks in ring mode, over a model whose last block is its
// classifier, with the classes split as the spec says.
func normalizeLabelShards(s *pb.JobSpec) error {
	par := s.GetParallelism()
	l := par.GetLabelShards()
	if l < 0 {
		return errf(labelField, "%d is negative; allowed 1 up to the classes (0: 1, no label shards)", l)
	}
	if l <= 1 {
		return errf("parallelism.label_groups", "apply to 2 or more label shards; label_shards is %d", l)
	}
	if par.GetPipeline().GetStages() > 1 {
		return errf(labelField, "%d label shards with %d pipeline stages %s; use one or the other", l, par.GetPipeline().GetStages(), notImplementedSuffix)
	}
	workers := s.GetWorkers()
	if workers%l != 0 {
		return errf(labelField, "%d label shards do not divide %d workers; workers = data × label_shards", l, workers)
	}
	if par.Data == 0 {
		par.Data = workers / l
	}
	if par.Data*l != workers {
		return errf("parallelism.data", "%d replicas × %d label shards is %d workers, but workers is %d; workers = data × label_shards", par.Data, l, par.Data*l, workers)
	}
	if s.Mode != "ring" {
		return errf("mode", "label-sharded jobs run in mode ring (the replicas of a shard all-reduce its gradients over a ring); mode %s with label_shards %d %s", s.Mode, l, notImplementedSuffix)
	}
	if par.GetTensor() != 0 {
		return errf("parallelism.tensor", "%d with %d label shards %s; use one or the other", par.GetTensor(), l, notImplementedSuffix)
	}
	if err := modelParallelLimits(s, "label shards"); err != nil {
		return err
	}
	c, h, w, classes := InputShape(s)
	if int(l) > classes {
		return errf(labelField, "%d label shards for %d classes; allowed 1..%d", l, classes, classes)
	}
	if _, err := LabelShardClasses(s); err != nil {
		return errf("parallelism.label_groups", "%v", err)
	}
	net, err := models.New(s.Model, models.Options{Channels: c, Height: h, Width: w, Classes: classes, Seed: s.GetSeed()})
	if err != nil {
		return errf("model", "%v", err)
	}
	defer net.Close()
	if _, err := LabelHeadOf(net); err != nil {
		return err
	}
	return nil
}

// modelParallelLimits refuses what does not compose with a tensorpar
// strategy (what: "label shards", "tensor parallelism") yet.
func modelParallelLimits(s *pb.JobSpec, what string) error {
	workers := s.GetWorkers()
	switch {
	case s.GetDataset().GetName() == MultiLabelMNIST:
		return errf("dataset.name", "%s (multi-label, BCE) with %s %s; use a single-label data set", MultiLabelMNIST, what, notImplementedSuffix)
	case Streamed(s.GetDataset()):
		return errf("dataset.name", "streamed data set %s with %s %s; use an IDX or synthetic data set", s.GetDataset().GetName(), what, notImplementedSuffix)
	case s.GradAccumSteps != 1:
		return errf("grad_accum_steps", "%d with %s %s; use 1", s.GradAccumSteps, what, notImplementedSuffix)
	case s.MinWorkers != workers:
		return errf("min_workers", "elastic jobs with %s (min_workers %d < workers %d) %s", what, s.MinWorkers, workers, notImplementedSuffix)
	case s.GetCompression().GetType() != defaultCompression:
		return errf("compression.type", "%s compression with %s %s", s.GetCompression().GetType(), what, notImplementedSuffix)
	case s.GradClipNorm != 0:
		return errf("grad_clip_norm", "clipping needs the norm over all shards; with %s it %s", what, notImplementedSuffix)
	case s.Precision != "" && s.Precision != "fp32":
		return errf("precision", "%s with %s %s; use fp32", s.Precision, what, notImplementedSuffix)
	case s.ActivationCheckpointing != "" && s.ActivationCheckpointing != "none":
		return errf("activation_checkpointing", "%s with %s %s; use none", s.ActivationCheckpointing, what, notImplementedSuffix)
	case s.NonfinitePolicy == "skip":
		return errf("nonfinite_policy", "skip with %s %s; use fail", what, notImplementedSuffix)
	case SharedMemory(s):
		return errf("collective.transport", "%s with %s %s", s.GetCollective().GetTransport(), what, notImplementedSuffix)
	case s.GetCheckpoint().GetEverySeconds() > 0:
		return errf("checkpoint.every_seconds", "timed checkpoints with %s %s (every shard must agree when one is due); use every_steps or every_epochs", what, notImplementedSuffix)
	}
	return nil
}

const tensorField = "parallelism.tensor"

// TensorRanks is a normalized spec's tensor-parallel ranks T (1: none).
func TensorRanks(s *pb.JobSpec) int { return max(int(s.GetParallelism().GetTensor()), 1) }

// TensorParallel reports whether a normalized spec splits its model's
// layers over two or more tensor-parallel ranks.
func TensorParallel(s *pb.JobSpec) bool { return TensorRanks(s) > 1 }

// TensorModels are the models a tensor-parallel job can split.
var TensorModels = []string{"mlp", "vit-tiny"}

// normalizeTensor checks and defaults a tensor-parallel spec's
// parallelism (tensor set): workers = data × T, data-parallel replicas of
// T ranks in ring mode, over a model it knows how to split.
func normalizeTensor(s *pb.JobSpec) error {
	par := s.GetParallelism()
	tr := par.GetTensor()
	if tr < 0 || tr == 1 {
		if tr == 1 {
			par.Tensor = 0
			return nil
		}
		return errf(tensorField, "%d is negative; allowed 1 up to the model's split units (0: 1, none)", tr)
	}
	if par.GetPipeline().GetStages() > 1 {
		return errf(tensorField, "%d tensor-parallel ranks with %d pipeline stages %s; use one or the other", tr, par.GetPipeline().GetStages(), notImplementedSuffix)
	}
	if !slices.Contains(TensorModels, s.Model) {
		return errf(tensorField, "tensor parallelism splits models %s so far, not %s", strings.Join(TensorModels, ", "), s.Model)
	}
	workers := s.GetWorkers()
	if workers%tr != 0 {
		return errf(tensorField, "%d tensor-parallel ranks do not divide %d workers; workers = data × tensor", tr, workers)
	}
	if par.Data == 0 {
		par.Data = workers / tr
	}
	if par.Data*tr != workers {
		return errf("parallelism.data", "%d replicas × %d tensor-parallel ranks is %d workers, but workers is %d; workers = data × tensor", par.Data, tr, par.Data*tr, workers)
	}
	if s.Mode != "ring" {
		return errf("mode", "tensor-parallel jobs run in mode ring (the replicas of a tensor rank all-reduce its gradients over a ring); mode %s with tensor %d %s", s.Mode, tr, notImplementedSuffix)
	}
	if err := modelParallelLimits(s, "tensor parallelism"); err != nil {
		return err
	}
	switch s.Model {
	case "mlp":
		if hidden := 256; int(tr) > hidden { // mlp's fc1 → fc2 units
			return errf(tensorField, "%d tensor-parallel ranks for mlp's %d hidden units; allowed 1..%d", tr, hidden, hidden)
		}
	case "vit-tiny":
		// Every rank holds whole heads and an equal share of each MLP's
		// hidden units.
		v := models.ViTTiny()
		if v.Heads%int(tr) != 0 || v.MLP%int(tr) != 0 {
			return errf(tensorField, "%d tensor-parallel ranks do not divide vit-tiny's %d attention heads and %d MLP hidden units; allowed: %s",
				tr, v.Heads, v.MLP, strings.Join(commonDivisors(v.Heads, v.MLP), ", "))
		}
	}
	return nil
}

// commonDivisors lists the common divisors of a and b, from 1 up.
func commonDivisors(a, b int) []string {
	var out []string
	for d := 1; d <= min(a, b); d++ {
		if a%d == 0 && b%d == 0 {
			out = append(out, strconv.Itoa(d))
		}
	}
	return out
}
