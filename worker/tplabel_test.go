package worker

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// labelSpec is a 20-step job on the synthetic set; batch is per replica.
func labelSpec(model string, workers, batch int32) *pb.JobSpec {
	return &pb.JobSpec{Model: model, Mode: "ring", Workers: proto.Int32(workers), BatchSize: proto.Int32(batch),
		MaxSteps: 20, Seed: proto.Int64(3), LogEverySteps: 5, Checkpoint: &pb.CheckpointSpec{EverySteps: 20},
		Dataset: &pb.DatasetSpec{Name: "synthetic", SyntheticTrain: 800, SyntheticTest: 200}}
}

// tensorDiffs compares two checkpoints' tensors (model and optimiser
// state): for each, the largest difference relative to want's largest
// entry; it fails on missing or extra names.
func tensorDiffs(t *testing.T, got, want map[string]models.Tensor) (worst float64, name string) {
	t.Helper()
	if !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want))) {
		t.Fatalf("tensors %v; want %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}
	for n, w := range want {
		wv, err := w.Float32s()
		if err != nil {
			t.Fatal(err)
		}
		gv, err := got[n].Float32s()
		if err != nil || len(gv) != len(wv) || !slices.Equal(got[n].Shape, w.Shape) {
			t.Fatalf("%s: shape %v (%v); want %v", n, got[n].Shape, err, w.Shape)
		}
		var d, m float64
		for i := range wv {
			d = max(d, math.Abs(float64(gv[i])-float64(wv[i])))
			m = max(m, math.Abs(float64(wv[i])))
		}
		if m > 0 && d/m > worst || math.IsNaN(d) {
			worst, name = d/m, n
		}
	}
	return worst, name
}

// TestLabelShardsMatchSingleWorker trains 20 steps label-sharded — cnn
// on L = 2 and 4 shards of one replica, mlp on 2 replicas × 2 shards and
// on 3 shards of the user's 4 label groups (uneven, not contiguous) —
// every rank in this process over loopback gRPC, and compares the
// checkpoint rank 0 writes (the whole model's tensors and optimiser
// state, gathered from the shards, under PyTorch's names) with a single
// worker's training on the same global batch: within 1e-5 of each
// tensor's largest entry. Every rank reports the same whole-model
// checksum, and the evaluation, computed from the shards, is the single
// worker's within float rounding.
func TestLabelShardsMatchSingleWorker(t *testing.T) {
	for _, tc := range []struct {
		model            string
		replicas, shards int32
		groups           [][]int32
	}{{"cnn", 1, 2, nil}, {"cnn", 1, 4, nil}, {"mlp", 2, 2, nil}, {"mlp", 1, 3, [][]int32{{9, 0}, {2, 4, 6}, {8, 1}, {3, 5, 7}}}} {
		name := fmt.Sprintf("%s D=%d L=%d groups=%v", tc.model, tc.replicas, tc.shards, tc.groups)
		t.Run(name, func(t *testing.T) {
			wantDir, gotDir := t.TempDir(), t.TempDir()
			want := runJob(t, normalized(t, labelSpec(tc.model, 1, 16*tc.replicas)), "", func(a *pb.Assignment) { a.CheckpointDir = wantDir })
			spec := labelSpec(tc.model, tc.replicas*tc.shards, 16)
			spec.Parallelism = &pb.ParallelismSpec{LabelShards: tc.shards}
			for _, g := range tc.groups {
				spec.Parallelism.LabelGroups = append(spec.Parallelism.LabelGroups, &pb.LabelGroup{Classes: g})
			}
			spec = normalized(t, spec)
			shards, err := jobspec.LabelShardClasses(spec)
			if err != nil {
				t.Fatal(err)
			}
			runs := t.TempDir()
			got := runJob(t, spec, runs, func(a *pb.Assignment) { a.CheckpointDir = gotDir })
			checkLabelSummaries(t, runs, len(got), shards)
			for r, g := range got {
				if g.ParameterChecksum != got[0].ParameterChecksum || g.Steps != 20 {
					t.Errorf("rank %d: checksum %x after %d steps; rank 0 %x", r, g.ParameterChecksum, g.Steps, got[0].ParameterChecksum)
				}
			}
			ws, err := checkpoint.Load(filepath.Join(wantDir, "ckpt-20"))
			if err != nil {
				t.Fatal(err)
			}
			gs, err := checkpoint.Load(filepath.Join(gotDir, "ckpt-20"))
			if err != nil {
				t.Fatal(err)
			}
			pw, pn := tensorDiffs(t, gs.Tensors, ws.Tensors)
			ow, on := tensorDiffs(t, gs.Optim, ws.Optim)
			t.Logf("%s: after 20 steps, largest difference relative to the tensor's largest entry: parameters %.2g (%s), momentum %.2g (%s); accuracy %.4f vs %.4f, loss %.6f vs %.6f",
				name, pw, pn, ow, on, got[0].TestAccuracy, want[0].TestAccuracy, got[0].TestLoss, want[0].TestLoss)
			if pw > 1e-5 || ow > 1e-5 {
				t.Errorf("%s: parameters differ by %.3g (%s), momentum by %.3g (%s) of the largest entry; want ≤ 1e-5", name, pw, pn, ow, on)
			}
			if math.Abs(got[0].TestAccuracy-want[0].TestAccuracy) > 0.011 || math.Abs(got[0].TestLoss-want[0].TestLoss) > 1e-4*math.Abs(want[0].TestLoss) {
				t.Errorf("%s: evaluation accuracy %v, loss %v; single worker %v, %v", name, got[0].TestAccuracy, got[0].TestLoss, want[0].TestAccuracy, want[0].TestLoss)
			}
		})
	}
}

// TestLabelShardsResumeOnAnotherMesh checkpoints an mlp job on 2 label
// shards at step 10 and resumes it on 4 shards and on a single whole-model
// worker: the checkpoint holds the whole model and optimiser (Adam here), so both end
// at step 20 with the 2-shard job's tensors (within float rounding: the
// head's products are split differently), and a resume on the same mesh
// ends with its checksum, bit for bit.
func TestLabelShardsResumeOnAnotherMesh(t *testing.T) {
	spec := func(l int32) *pb.JobSpec {
		s := labelSpec("mlp", max(l, 1), 16)
		s.Checkpoint.EverySteps = 10
		s.Optimizer = &pb.OptimizerSpec{Name: "adam", Lr: proto.Float64(0.001)} // (the other tests step SGD)
		if l > 0 {
			s.Parallelism = &pb.ParallelismSpec{LabelShards: l}
		}
		return normalized(t, s)
	}
	resumeOnMeshes(t, "L", spec, nil)
}

// resumeOnMeshes runs spec(2) (a job of 2 label shards or tensor ranks,
// what names them: L, T) to step 20 with a checkpoint at step 10, and
// resumes from that on spec(2), spec(4) and spec(0) (one whole-model
// worker): each ends at step 20 within 1e-5 (relative to each tensor's
// largest entry) of the job that never stopped, parameters and optimiser
// state, and spec(2) with its checksum, bit for bit. prep, unless nil,
// edits both checkpoints before they are compared.
func resumeOnMeshes(t *testing.T, what string, spec func(n int32) *pb.JobSpec, prep func(*checkpoint.State)) {
	t.Helper()
	dir := t.TempDir()
	want := runJob(t, spec(2), "", func(a *pb.Assignment) { a.CheckpointDir = dir })
	ws, err := checkpoint.Load(filepath.Join(dir, "ckpt-20"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int32{2, 4, 0} {
		out := t.TempDir()
		got := runJob(t, spec(n), "", func(a *pb.Assignment) {
			a.ResumeFrom, a.CheckpointDir = filepath.Join(dir, "ckpt-10"), out
		})
		if got[0].Steps != 20 || n == 2 && got[0].ParameterChecksum != want[0].ParameterChecksum {
			t.Errorf("%s=%d resumed at step 10: checksum %x after %d steps; the %s=2 job's %x after 20", what, n, got[0].ParameterChecksum, got[0].Steps, what, want[0].ParameterChecksum)
		}
		gs, err := checkpoint.Load(filepath.Join(out, "ckpt-20"))
		if err != nil {
			t.Fatal(err)
		}
		if prep != nil {
			prep(gs)
			prep(ws)
		}
		pw, pn := tensorDiffs(t, gs.Tensors, ws.Tensors)
		ow, on := tensorDiffs(t, gs.Optim, ws.Optim)
		t.Logf("%s %s=%d (0: one whole-model worker) resumed at step 10: at step 20 parameters within %.2g (%s), optimiser state %.2g (%s) of the %s=2 job's",
			spec(2).Model, what, n, pw, pn, ow, on, what)
		if pw > 1e-5 || ow > 1e-5 {
			t.Errorf("%s=%d resumed: parameters differ by %.3g (%s), optimiser state by %.3g (%s); want ≤ 1e-5", what, n, pw, pn, ow, on)
		}
	}
}

// checkLabelSummaries reads every rank's labels-rank-R.json and checks
// the label group's communication against the formula exactly (4
// all-reduces of 3b + b·In values a step, no all-gather) and that each
// shard held its classes' rows alone (shards[s]: shard s's classes).
func checkLabelSummaries(t *testing.T, runs string, ranks int, shards [][]int) {
	t.Helper()
	for r := range ranks {
		b, err := os.ReadFile(filepath.Join(runs, "job-p", fmt.Sprintf("labels-rank-%d.json", r)))
		if err != nil {
			t.Fatal(err)
		}
		var s labelSummary
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatal(err)
		}
		held := len(shards[s.Shard])
		if s.Rank != r || s.Steps != 20 || s.AllReduceOps != s.FormulaAllReduceOps || s.AllReduceValues != s.FormulaAllReduceValues ||
			s.AllReduceOps != 4*20 || s.AllGatherOps != 0 || s.ClassesHeld != held || s.HeadParams != held*(s.HeadFeatures+1) {
			t.Errorf("rank %d: summary %+v", r, s)
		}
		t.Logf("rank %d (shard %d/%d, replica %d): %d all-reduces of %d values in 20 steps (formula %d of %d); group ring sent %d bytes, payload formula %.0f (%.3f×); held %d classes, %d head parameters",
			r, s.Shard, s.Shards, s.Replica, s.AllReduceOps, s.AllReduceValues, s.FormulaAllReduceOps, s.FormulaAllReduceValues,
			s.GroupBytesSent, s.FormulaGroupBytesSent, float64(s.GroupBytesSent)/s.FormulaGroupBytesSent, s.ClassesHeld, s.HeadParams)
	}
}
