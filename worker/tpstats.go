package worker

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gradsync/gradsync/aggregator/ringrpc"
	"github.com/gradsync/gradsync/tensorpar"
)

// labelSummary is one label shard's communication over its task's
// training steps, beside the formulas it should follow, written as
// <runs-dir>/<job-id>/labels-rank-<r>.json on its worker (and logged).
// Per step of batch b, the label group of L ranks does 4 all-reduces
// (tensorpar.Head: the max, the sum of exponentials and the target logit,
// b values each, then the features' gradient, b·In values), and no
// all-gather; the shard's replica ring, with D > 1, all-reduces the body's
// gradient and the head rows' once each. Counted values are exact (the
// Group's calls, evaluation and checksums left out); bytes are what the
// group's gRPC ring sent over the same steps (frames with their headers),
// against the payload of a ring: the max is an all-gather ((L−1)·b values
// sent per rank), each Sum all-reduce of m values 2(L−1)/L·m per rank on
// average.
type labelSummary struct {
	Rank         int   `json:"rank"`
	Shard        int   `json:"shard"`
	Shards       int   `json:"shards"`
	Replica      int   `json:"replica"`
	Replicas     int   `json:"replicas"`
	Steps        int64 `json:"steps"`
	ClassesHeld  int   `json:"classes_held"`
	HeadParams   int   `json:"head_params_held"`
	BodyParams   int   `json:"body_params_held"`
	HeadFeatures int   `json:"head_in_features"`

	// The label group's collectives over the training steps: counted,
	// and the formula's.
	AllReduceOps           int64 `json:"group_all_reduce_ops"`
	AllReduceValues        int64 `json:"group_all_reduce_values"`
	AllGatherOps           int64 `json:"group_all_gather_ops"`
	AllGatherValues        int64 `json:"group_all_gather_values"`
	FormulaAllReduceOps    int64 `json:"formula_all_reduce_ops"`
	FormulaAllReduceValues int64 `json:"formula_all_reduce_values"`
	// Bytes the label group's ring sent over the training steps, and the
	// formula's payload bytes (ring algorithms, 4 bytes a value).
	GroupBytesSent        int64   `json:"group_bytes_sent"`
	FormulaGroupBytesSent float64 `json:"formula_group_payload_bytes_sent"`
	// Bytes the shard's replica ring sent (D > 1), in all.
	ShardRingBytesSent int64 `json:"shard_ring_bytes_sent"`
}

// labelCounts accumulates a label task's training communication.
type labelCounts struct {
	steps                     int64
	train                     tensorpar.Counts // the group's calls in training steps
	formulaOps, formulaValues int64
	formulaBytes              float64
	groupBytes                int64
}

// add records one training step of batch b: what the group did in it
// (before and after its counts and ring bytes) and the formula's.
func (c *labelCounts) add(b, in, l int, before, after tensorpar.Counts, sentBefore, sentAfter int64) {
	c.steps++
	c.train.AllReduceOps += after.AllReduceOps - before.AllReduceOps
	c.train.AllReduceValues += after.AllReduceValues - before.AllReduceValues
	c.train.AllGatherOps += after.AllGatherOps - before.AllGatherOps
	c.train.AllGatherValues += after.AllGatherValues - before.AllGatherValues
	c.train.BroadcastOps += after.BroadcastOps - before.BroadcastOps
	c.train.BroadcastValues += after.BroadcastValues - before.BroadcastValues
	c.formulaOps += 4
	c.formulaValues += int64(3*b + b*in)
	n := float64(l)
	c.formulaBytes += 4 * ((n-1)*float64(b) + 2*(n-1)/n*float64(2*b+b*in))
	c.groupBytes += sentAfter - sentBefore
}

func (t *labelTask) summary() labelSummary {
	c := t.counts
	s := labelSummary{Rank: int(t.a.Rank), Shard: t.coord.shard, Shards: t.coord.shards, Replica: t.coord.replica, Replicas: t.coord.replicas,
		Steps: c.steps, ClassesHeld: len(t.head.Owned), HeadParams: len(t.hp), BodyParams: t.net.NumParams(), HeadFeatures: t.lh.In,
		AllReduceOps: c.train.AllReduceOps, AllReduceValues: c.train.AllReduceValues,
		AllGatherOps: c.train.AllGatherOps + c.train.BroadcastOps, AllGatherValues: c.train.AllGatherValues + c.train.BroadcastValues,
		FormulaAllReduceOps: c.formulaOps, FormulaAllReduceValues: c.formulaValues,
		GroupBytesSent: c.groupBytes, FormulaGroupBytesSent: c.formulaBytes}
	if t.replicaRing != nil {
		s.ShardRingBytesSent, _, _, _ = t.replicaRing.Traffic()
	}
	return s
}

// report logs the shard's communication and writes it to its worker's
// run directory (when it has one).
func (t *labelTask) report() {
	if t.meshGroup == nil || t.head == nil || t.counts.steps == 0 {
		return
	}
	s := t.summary()
	t.env.log.Info("label shard", "job", t.a.JobId, "rank", s.Rank, "shard", s.Shard, "replica", s.Replica, "steps", s.Steps,
		"all_reduce_values", s.AllReduceValues, "formula", s.FormulaAllReduceValues, "group_bytes_sent", s.GroupBytesSent)
	if t.env.runsDir == "" {
		return
	}
	if err := writeSummary(filepath.Join(t.env.runsDir, t.a.JobId), fmt.Sprintf("labels-rank-%d.json", s.Rank), s); err != nil {
		t.env.log.Warn("writing the label shard's summary", "job", t.a.JobId, "err", err)
	}
}

// tensorSummary is one tensor rank's communication over its task's
// training steps beside the formula, written as
// <runs-dir>/<job-id>/tensor-rank-<r>.json on its worker (and logged):
// mlp's Megatron pair does one all-reduce of b·Out values a step
// (forward's g) and none backward (no input gradient at the network's
// input); each of vit-tiny's transformer blocks does 2 all-reduces of
// b·s·D values forward and 2 backward (Megatron's four per layer).
// Counted values are exact (the Group's calls, evaluation and checksums
// left out).
type tensorSummary struct {
	Rank       int    `json:"rank"`
	TensorRank int    `json:"tensor_rank"`
	Tensor     int    `json:"tensor"`
	Replica    int    `json:"replica"`
	Replicas   int    `json:"replicas"`
	Model      string `json:"model"`
	Steps      int64  `json:"steps"`
	// HiddenHeld is the MLP hidden units this rank holds (of each block),
	// HeadsHeld its attention heads (of each block; vit-tiny).
	HiddenHeld int `json:"hidden_units_held"`
	HeadsHeld  int `json:"heads_held,omitempty"`
	// ShardedParamsHeld is what this rank holds of the sharded layers
	// (mlp: fc1 and fc2; vit-tiny: the transformer blocks, whose layer
	// norms every rank holds whole), ShardedParamsWhole the whole of
	// them; ReplicatedParams the rest of the model, held whole by every
	// rank (mlp: fc3; vit-tiny: the patch embedding, the final norm and
	// the head).
	ShardedParamsHeld      int   `json:"sharded_params_held"`
	ShardedParamsWhole     int   `json:"sharded_params_whole"`
	ReplicatedParams       int   `json:"replicated_params"`
	AllReduceOps           int64 `json:"group_all_reduce_ops"`
	AllReduceValues        int64 `json:"group_all_reduce_values"`
	AllGatherOps           int64 `json:"group_all_gather_ops"`
	FormulaAllReduceOps    int64 `json:"formula_all_reduce_ops"`
	FormulaAllReduceValues int64 `json:"formula_all_reduce_values"`
	GroupBytesSent         int64 `json:"group_bytes_sent"`
}

func (t *tensorTask) summary() tensorSummary {
	s := tensorSummary{Rank: int(t.a.Rank), TensorRank: t.coord.shard, Tensor: t.coord.shards, Replica: t.coord.replica, Replicas: t.coord.replicas,
		Model: t.cut.model, Steps: t.trainSteps, ShardedParamsHeld: t.shardedParams(), ShardedParamsWhole: t.cut.sharded.ParamLen,
		ReplicatedParams: t.net.NumParams(),
		AllReduceOps:     t.counted.AllReduceOps, AllReduceValues: t.counted.AllReduceValues, AllGatherOps: t.counted.AllGatherOps,
		FormulaAllReduceOps: t.formulaOps, FormulaAllReduceValues: t.formulaValues, GroupBytesSent: t.groupBytes}
	if t.stem != nil {
		s.ReplicatedParams += t.stem.NumParams()
	}
	switch u := t.units[0].(type) {
	case *mlpUnit:
		s.HiddenHeld = u.m.Hi - u.m.Lo
	case *blockUnit:
		s.HiddenHeld, s.HeadsHeld = u.b.MLP.Hi-u.b.MLP.Lo, u.b.Attn.HeadHi-u.b.Attn.HeadLo
	}
	return s
}

func (t *tensorTask) report() {
	if len(t.units) == 0 || t.trainSteps == 0 {
		return
	}
	s := t.summary()
	t.env.log.Info("tensor rank", "job", t.a.JobId, "rank", s.Rank, "tensor_rank", s.TensorRank, "replica", s.Replica, "steps", s.Steps,
		"all_reduce_ops", s.AllReduceOps, "formula_ops", s.FormulaAllReduceOps,
		"all_reduce_values", s.AllReduceValues, "formula", s.FormulaAllReduceValues, "group_bytes_sent", s.GroupBytesSent)
	if t.env.runsDir == "" {
		return
	}
	if err := writeSummary(filepath.Join(t.env.runsDir, t.a.JobId), fmt.Sprintf("tensor-rank-%d.json", s.Rank), s); err != nil {
		t.env.log.Warn("writing the tensor rank's summary", "job", t.a.JobId, "err", err)
	}
}

// writeSummary writes v as JSON to dir/name, atomically.
func writeSummary(dir, name string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, name)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ringBytes reports a ring's traffic to the Prometheus byte counters as
// it grows.
type ringBytes struct {
	sent, recv int64 // reported so far
}

func (b *ringBytes) flush(env *taskEnv, job string, r *ringrpc.Ring) {
	if r == nil || env.metrics == nil {
		return
	}
	sent, recv, right, left := r.Traffic()
	env.metrics.AddBytesSent(job, right, int(sent-b.sent))
	env.metrics.AddBytesReceived(job, left, int(recv-b.recv))
	b.sent, b.recv = sent, recv
}
