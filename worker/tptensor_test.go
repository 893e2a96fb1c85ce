package worker

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/gradsync/gradsync/checkpoint"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
	"github.com/gradsync/gradsync/tensorpar"
	"google.golang.org/protobuf/proto"
)

// TestTensorParallelMatchesSingleWorker trains 20 steps tensor-parallel,
// every rank in this process over loopback gRPC, and compares rank 0's
// checkpoint (whole tensors and optimiser state gathered from the
// shards) with a single worker's on the same global batch: within 1e-5
// of each tensor's largest entry (measured: mlp ≤ 3.2e-7, vit-tiny ≤ 1.9e-6,
// logged); every rank
// reports the same checksum, and the evaluation is the single worker's
// within rounding. mlp with fc1 and fc2 split over T = 2, 3 (uneven: 85,
// 85, 86 hidden units) and 4 ranks of one replica and over 2 replicas ×
// 2 ranks; vit-tiny with its two transformer blocks split over T = 2 and
// 4 (its 4 heads and 128 MLP units: T must divide both) and 2 × 2. Each
// rank's tensor-rank-R.json counts exactly the formula's all-reduces —
// mlp: one of b·128 values a step; vit-tiny: 2 forward and 2 backward of
// b·s·D values per block (s = 17 tokens, D = 64) — and the rank held its
// share of the hidden units (and heads) alone.
func TestTensorParallelMatchesSingleWorker(t *testing.T) {
	for _, tc := range []struct {
		model           string
		replicas, ranks int32
	}{{"mlp", 1, 2}, {"mlp", 1, 3}, {"mlp", 1, 4}, {"mlp", 2, 2}, {"vit-tiny", 1, 2}, {"vit-tiny", 1, 4}, {"vit-tiny", 2, 2}} {
		name := fmt.Sprintf("%s D=%d T=%d", tc.model, tc.replicas, tc.ranks)
		t.Run(name, func(t *testing.T) {
			if tc.model != "mlp" && testing.Short() {
				t.Skip("vit-tiny: -short")
			}
			const b = 16
			// the formula per step: all-reduces and values; the hidden
			// units (and heads) of each block a rank holds.
			ops, values, hidden, heads := int64(1), int64(b*128), 256, 0
			if tc.model == "vit-tiny" {
				v := models.ViTTiny()
				ops, values, hidden, heads = int64(4*v.Depth), int64(4*v.Depth*b*17*v.D), v.MLP, v.Heads
			}
			wantDir, gotDir := t.TempDir(), t.TempDir()
			want := runJob(t, normalized(t, labelSpec(tc.model, 1, b*tc.replicas)), "", func(a *pb.Assignment) { a.CheckpointDir = wantDir })
			spec := labelSpec(tc.model, tc.replicas*tc.ranks, b)
			spec.Parallelism = &pb.ParallelismSpec{Tensor: tc.ranks}
			runs := t.TempDir()
			got := runJob(t, normalized(t, spec), runs, func(a *pb.Assignment) { a.CheckpointDir = gotDir })
			for r := range got {
				raw, err := os.ReadFile(filepath.Join(runs, "job-p", fmt.Sprintf("tensor-rank-%d.json", r)))
				if err != nil {
					t.Fatal(err)
				}
				var s tensorSummary
				if err := json.Unmarshal(raw, &s); err != nil {
					t.Fatal(err)
				}
				lo, hi := tensorpar.Span(hidden, int(tc.ranks), s.TensorRank)
				hlo, hhi := tensorpar.Span(heads, int(tc.ranks), s.TensorRank)
				if s.Model != tc.model || s.Steps != 20 || s.AllReduceOps != 20*ops || s.AllReduceOps != s.FormulaAllReduceOps ||
					s.AllReduceValues != 20*values || s.AllReduceValues != s.FormulaAllReduceValues || s.AllGatherOps != 0 ||
					s.HiddenHeld != hi-lo || s.HeadsHeld != hhi-hlo {
					t.Errorf("rank %d: summary %+v", r, s)
				}
				n := float64(tc.ranks)
				t.Logf("rank %d (tensor rank %d/%d, replica %d): %d all-reduces of %d values in 20 steps (formula %d of %d); group ring sent %d bytes, a ring's payload %.0f; held %d hidden units, %d heads, %d of %d sharded parameters",
					r, s.TensorRank, s.Tensor, s.Replica, s.AllReduceOps, s.AllReduceValues, s.FormulaAllReduceOps, s.FormulaAllReduceValues,
					s.GroupBytesSent, 4*2*(n-1)/n*float64(s.AllReduceValues), s.HiddenHeld, s.HeadsHeld, s.ShardedParamsHeld, s.ShardedParamsWhole)
			}
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

// TestTensorParallelResumeOnAnotherMesh checkpoints a T = 2 job at step
// 10 and resumes it on T = 4 and on one whole-model worker: both end at
// step 20 within float rounding of the job that never stopped, and on
// the same mesh bit for bit (resumeOnMeshes). mlp steps SGD with
// momentum, vit-tiny Adam, so that both optimisers' state is gathered
// into the checkpoint and sharded again from it. With Adam, vit-tiny's
// key biases (in_proj_bias[D:2D] of each block) are left out of the
// comparison: their gradient is zero but for rounding (a query's scores
// all move by q·b_k, which the softmax ignores), and Adam normalises
// that noise into steps of up to lr, which differ with the order of any
// sum — between two whole-model runs too (measured: up to 0.4 of the
// tensor's largest entry, whole model against T = 2 after 10 steps,
// while the q and v biases agree within 2e-8).
func TestTensorParallelResumeOnAnotherMesh(t *testing.T) {
	for _, model := range []string{"mlp", "vit-tiny"} {
		t.Run(model, func(t *testing.T) {
			if model != "mlp" && testing.Short() {
				t.Skip("vit-tiny: -short")
			}
			var keyBiasesLeftOut func(*checkpoint.State)
			if model == "vit-tiny" {
				keyBiasesLeftOut = func(st *checkpoint.State) {
					d := models.ViTTiny().D
					for i := range models.ViTTiny().Depth {
						name := fmt.Sprintf("blocks.%d.attn.in_proj_bias", i)
						v, err := st.Tensors[name].Float32s()
						if err != nil {
							t.Fatal(err)
						}
						clear(v[d : 2*d])
						st.Tensors[name] = models.F32Tensor(st.Tensors[name].Shape, v)
					}
				}
			}
			resumeOnMeshes(t, "T", func(tr int32) *pb.JobSpec {
				s := labelSpec(model, max(tr, 1), 16)
				s.Checkpoint.EverySteps = 10
				if model == "vit-tiny" {
					s.Optimizer = &pb.OptimizerSpec{Name: "adam", Lr: proto.Float64(0.001)}
				}
				if tr > 0 {
					s.Parallelism = &pb.ParallelismSpec{Tensor: tr}
				}
				return normalized(t, s)
			}, keyBiasesLeftOut)
		})
	}
}
