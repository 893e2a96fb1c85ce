package jobspec

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/gradsync/gradsync/internal/optim"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

func TestNormalizeDefaults(t *testing.T) {
	got, err := Normalize(&pb.JobSpec{}, nil)
	if err != nil {
		t.Fatalf("Normalize(empty): %v", err)
	}
	want := &pb.JobSpec{
		Name:               "mlp-mnist",
		Model:              "mlp",
		Dataset:            &pb.DatasetSpec{Name: "mnist", Augment: "none"},
		Mode:               "ps",
		Workers:            proto.Int32(1),
		MinWorkers:         1,
		MaxWorkers:         1,
		BatchSize:          proto.Int32(32),
		Epochs:             proto.Int32(1),
		Optimizer:          &pb.OptimizerSpec{Name: "sgd", Lr: proto.Float64(0.05), Momentum: proto.Float64(0.9)},
		LrSchedule:         &pb.ScheduleSpec{Name: "cosine"},
		Seed:               proto.Int64(1),
		Compression:        &pb.CompressionSpec{Type: "none"},
		Partition:          &pb.PartitionSpec{Type: "iid"},
		ParameterServer:    &pb.ParameterServerSpec{Shards: 1, Consistency: "sync"},
		GradAccumSteps:     1,
		LogEverySteps:      20,
		EvalEveryEpoch:     proto.Bool(true),
		StepTimeoutSeconds: 60,
		NonfinitePolicy:    "fail",
	}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
		t.Errorf("Normalize(empty) (-want +got):\n%s", diff)
	}
	// A nil spec is the empty spec.
	if n, err := Normalize(nil, nil); err != nil || !proto.Equal(n, got) {
		t.Errorf("Normalize(nil) = %v, %v; want the defaults", n, err)
	}
}

func TestNormalizeKeepsExplicitValues(t *testing.T) {
	in := &pb.JobSpec{
		Name: "x", Model: "logreg", Workers: proto.Int32(3), BatchSize: proto.Int32(7), Epochs: proto.Int32(2), MaxSteps: 9,
		Dataset:        &pb.DatasetSpec{Name: "synthetic", SyntheticTrain: 100, SyntheticTest: 10},
		Optimizer:      &pb.OptimizerSpec{Lr: proto.Float64(0.5), Momentum: proto.Float64(0)},
		Seed:           proto.Int64(0),
		EvalEveryEpoch: proto.Bool(false),
		LrSchedule:     &pb.ScheduleSpec{Name: "step", StepSize: 10},
	}
	orig := proto.Clone(in)
	got, err := Normalize(in, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(in, orig) {
		t.Error("Normalize modified its input")
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"name", got.Name, "x"},
		{"model", got.Model, "logreg"},
		{"workers", got.GetWorkers(), int32(3)},
		{"batch_size", got.GetBatchSize(), int32(7)},
		{"epochs", got.GetEpochs(), int32(2)},
		{"max_steps", got.MaxSteps, int64(9)},
		{"synthetic_train", got.Dataset.SyntheticTrain, int32(100)},
		{"lr", got.Optimizer.GetLr(), 0.5},
		{"momentum 0 kept", got.Optimizer.GetMomentum(), 0.0},
		{"seed 0 kept", got.GetSeed(), int64(0)},
		{"eval_every_epoch false kept", got.GetEvalEveryEpoch(), false},
		{"gamma default", got.LrSchedule.Gamma, 0.1},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	// Synthetic sizes get defaults only for the synthetic set.
	s, err := Normalize(&pb.JobSpec{Dataset: &pb.DatasetSpec{Name: "synthetic"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.Dataset.SyntheticTrain != DefaultSyntheticTrain || s.Dataset.SyntheticTest != DefaultSyntheticTest {
		t.Errorf("synthetic sizes = %d/%d, want defaults %d/%d", s.Dataset.SyntheticTrain, s.Dataset.SyntheticTest, DefaultSyntheticTrain, DefaultSyntheticTest)
	}
}

// TestNormalizeRejects checks that each bad or not-implemented option is a
// *FieldError naming the field.
func TestNormalizeRejects(t *testing.T) {
	cases := []struct {
		name  string
		spec  *pb.JobSpec
		field string
		msg   string // substring of the message
	}{
		{"unknown model", &pb.JobSpec{Model: "gpt5"}, "model", "unknown model"},
		{"long name", &pb.JobSpec{Name: strings.Repeat("n", MaxNameLen+1)}, "name", "at most"},
		{"batch -1", &pb.JobSpec{BatchSize: proto.Int32(-1)}, "batch_size", "out of range"},
		{"batch too big", &pb.JobSpec{BatchSize: proto.Int32(MaxBatchSize + 1)}, "batch_size", "out of range"},
		{"epochs -1", &pb.JobSpec{Epochs: proto.Int32(-1)}, "epochs", "out of range"},
		{"max_steps -1", &pb.JobSpec{MaxSteps: -1}, "max_steps", "negative"},
		{"negative lr", &pb.JobSpec{Optimizer: &pb.OptimizerSpec{Lr: proto.Float64(-0.1)}}, "optimizer.lr", "out of range"},
		{"NaN lr", &pb.JobSpec{Optimizer: &pb.OptimizerSpec{Lr: proto.Float64(math.NaN())}}, "optimizer.lr", "out of range"},
		{"Inf lr", &pb.JobSpec{Optimizer: &pb.OptimizerSpec{Lr: proto.Float64(math.Inf(1))}}, "optimizer.lr", "out of range"},
		{"momentum 1", &pb.JobSpec{Optimizer: &pb.OptimizerSpec{Momentum: proto.Float64(1)}}, "optimizer.momentum", "out of range"},
		{"momentum NaN", &pb.JobSpec{Optimizer: &pb.OptimizerSpec{Momentum: proto.Float64(math.NaN())}}, "optimizer.momentum", "out of range"},
		{"nesterov without momentum", &pb.JobSpec{Optimizer: &pb.OptimizerSpec{Nesterov: true, Momentum: proto.Float64(0)}}, "optimizer.nesterov", "momentum"},
		{"weight decay negative", &pb.JobSpec{Optimizer: &pb.OptimizerSpec{WeightDecay: -1}}, "optimizer.weight_decay", "out of range"},
		{"adam betas on sgd", &pb.JobSpec{Optimizer: &pb.OptimizerSpec{Beta1: 0.9}}, "optimizer", "Adam"},
		{"adam with momentum", &pb.JobSpec{Optimizer: &pb.OptimizerSpec{Name: "adam", Momentum: proto.Float64(0.9)}}, "optimizer.momentum", "SGD"},
		{"adamw beta 1", &pb.JobSpec{Optimizer: &pb.OptimizerSpec{Name: "adamw", Beta2: 1}}, "optimizer.beta1", "[0, 1)"},
		{"sgd with betas", &pb.JobSpec{Optimizer: &pb.OptimizerSpec{Beta1: 0.8}}, "optimizer", "Adam settings"},
		{"warmup-linear without warmup", &pb.JobSpec{LrSchedule: &pb.ScheduleSpec{Name: "warmup-linear"}}, "lr_schedule.warmup_steps", ">= 1"},
		{"unknown optimizer", &pb.JobSpec{Optimizer: &pb.OptimizerSpec{Name: "lbfgs"}}, "optimizer.name", "unknown optimizer"},
		{"workers -1", &pb.JobSpec{Workers: proto.Int32(-1)}, "workers", "out of range"},
		{"workers too many", &pb.JobSpec{Workers: proto.Int32(MaxWorkers + 1)}, "workers", "out of range"},
		{"elastic", &pb.JobSpec{Workers: proto.Int32(2), MinWorkers: 1}, "min_workers", "not implemented"},
		{"negative min_workers", &pb.JobSpec{MinWorkers: -1}, "min_workers", "negative"},
		{"unknown dataset", &pb.JobSpec{Dataset: &pb.DatasetSpec{Name: "imagenet"}}, "dataset.name", "unknown dataset"},
		{"negative synthetic", &pb.JobSpec{Dataset: &pb.DatasetSpec{Name: "synthetic", SyntheticTrain: -1}}, "dataset.synthetic_train", "out of range"},
		{"augment unknown", &pb.JobSpec{Dataset: &pb.DatasetSpec{Augment: "rotate"}}, "dataset.augment", "crop-flip"},
		{"unknown augment", &pb.JobSpec{Dataset: &pb.DatasetSpec{Augment: "mixup"}}, "dataset.augment", "unknown augmentation"},
		{"growing job", &pb.JobSpec{Mode: "ring", Workers: proto.Int32(2), MaxWorkers: 3}, "max_workers", "not implemented"},
		{"real clients with another client count", &pb.JobSpec{Mode: "fedavg", Workers: proto.Int32(2), Federated: &pb.FederatedSpec{Clients: 5}}, "federated.clients", "one real client per worker"},
		{"real clients elastic", &pb.JobSpec{Mode: "fedavg", Workers: proto.Int32(3), MinWorkers: 2}, "min_workers", "use mode ring"},
		{"fedavg min clients above sampled", &pb.JobSpec{Mode: "fedavg", Workers: proto.Int32(4), Federated: &pb.FederatedSpec{Fraction: 0.5, MinClients: 3}}, "federated.min_clients", "samples only 2"},
		{"fedavg with momentum", &pb.JobSpec{Mode: "fedavg", Optimizer: &pb.OptimizerSpec{Momentum: proto.Float64(0.9)}}, "optimizer", "plain SGD"},
		{"fedavg with epochs", &pb.JobSpec{Mode: "fedavg", Epochs: proto.Int32(2)}, "epochs", "federated.rounds"},
		{"fedavg with batch size", &pb.JobSpec{Mode: "fedavg", BatchSize: proto.Int32(2)}, "batch_size", "local_batch_size"},
		{"fedavg bad fraction", &pb.JobSpec{Mode: "fedavg", Federated: &pb.FederatedSpec{Fraction: 1.5}}, "federated.fraction", "(0, 1]"},
		{"fedavg unknown strategy", &pb.JobSpec{Mode: "fedavg", Federated: &pb.FederatedSpec{Strategy: "fedsgd"}}, "federated.strategy", "fedavg"},
		{"fedavg mu without fedprox", &pb.JobSpec{Mode: "fedavg", Federated: &pb.FederatedSpec{Mu: 0.1}}, "federated.mu", "fedprox"},
		{"fedavg min clients above clients", &pb.JobSpec{Mode: "fedavg", Federated: &pb.FederatedSpec{Clients: 3, MinClients: 4}}, "federated.min_clients", "1..3"},
		{"unknown mode", &pb.JobSpec{Mode: "gossip"}, "mode", "unknown mode"},
		{"powersgd in fedavg", &pb.JobSpec{Mode: "fedavg", Compression: &pb.CompressionSpec{Type: "powersgd"}}, "compression.type", "use mode ring or ps"},
		{"topk in fedavg", &pb.JobSpec{Mode: "fedavg", Compression: &pb.CompressionSpec{Type: "topk"}}, "compression.type", "use mode ring or ps"},
		{"int8 in fedavg", &pb.JobSpec{Mode: "fedavg", Compression: &pb.CompressionSpec{Type: "int8"}}, "compression.type", "use mode ring or ps"},
		{"unknown compression", &pb.JobSpec{Compression: &pb.CompressionSpec{Type: "zip"}}, "compression", "unknown compression type"},
		{"compression knobs without type", &pb.JobSpec{Compression: &pb.CompressionSpec{Rank: 4}}, "compression", "does not apply"},
		{"topk ratio on powersgd", &pb.JobSpec{Mode: "ring", Compression: &pb.CompressionSpec{Type: "powersgd", Ratio: 0.1}}, "compression", "ratio does not apply"},
		{"topk ratio above 1", &pb.JobSpec{Mode: "ring", Compression: &pb.CompressionSpec{Type: "topk", Ratio: 2}}, "compression", "(0, 1]"},
		{"checkpoint keep without a condition", &pb.JobSpec{Checkpoint: &pb.CheckpointSpec{Keep: 2}}, "checkpoint.keep", "every_steps"},
		{"federated without fedavg", &pb.JobSpec{Federated: &pb.FederatedSpec{Rounds: 10}}, "federated", "mode fedavg"},
		{"dirichlet partition without fedavg", &pb.JobSpec{Partition: &pb.PartitionSpec{Type: "dirichlet"}}, "partition.type", "mode fedavg"},
		{"negative dirichlet alpha", &pb.JobSpec{Mode: "fedavg", Partition: &pb.PartitionSpec{Type: "dirichlet", Alpha: -1}}, "partition.alpha", "positive"},
		{"unknown partition", &pb.JobSpec{Partition: &pb.PartitionSpec{Type: "random"}}, "partition.type", "unknown partitioning"},
		{"alpha on iid", &pb.JobSpec{Partition: &pb.PartitionSpec{Alpha: 0.5}}, "partition", "alpha"},
		{"bucket_cap_mb outside ring mode", &pb.JobSpec{BucketCapMb: 25}, "bucket_cap_mb", "ring mode"},
		{"bucket_cap_mb negative", &pb.JobSpec{Mode: "ring", BucketCapMb: -1}, "bucket_cap_mb", "(0, 1024]"},
		{"ps shards 2 with compression", &pb.JobSpec{ParameterServer: &pb.ParameterServerSpec{Shards: 2}, Compression: &pb.CompressionSpec{Type: "fp16"}}, "parameter_server.shards", "not implemented"},
		{"ps shards 2 with checkpoints", &pb.JobSpec{ParameterServer: &pb.ParameterServerSpec{Shards: 2}, Checkpoint: &pb.CheckpointSpec{EverySteps: 10}}, "parameter_server.shards", "not implemented"},
		{"ps aggregators with checkpoints", &pb.JobSpec{ParameterServer: &pb.ParameterServerSpec{Addresses: []string{"h:1"}}, Checkpoint: &pb.CheckpointSpec{EveryEpochs: 1}}, "parameter_server.shards", "not implemented"},
		{"ps shards 2 with grad clip", &pb.JobSpec{ParameterServer: &pb.ParameterServerSpec{Shards: 2}, GradClipNorm: 1}, "parameter_server.shards", "global norm"},
		{"ps shards -1", &pb.JobSpec{ParameterServer: &pb.ParameterServerSpec{Shards: -1}}, "parameter_server.shards", "out of range"},
		{"ps shards 65", &pb.JobSpec{ParameterServer: &pb.ParameterServerSpec{Shards: 65}}, "parameter_server.shards", "out of range"},
		{"ps async with compression", &pb.JobSpec{ParameterServer: &pb.ParameterServerSpec{Consistency: "async"}, Compression: &pb.CompressionSpec{Type: "topk"}}, "parameter_server.consistency", "not implemented"},
		{"ps bounded with checkpoints", &pb.JobSpec{ParameterServer: &pb.ParameterServerSpec{Consistency: "bounded", Staleness: 1}, Checkpoint: &pb.CheckpointSpec{EverySteps: 5}}, "parameter_server.consistency", "not implemented"},
		{"ps staleness negative", &pb.JobSpec{ParameterServer: &pb.ParameterServerSpec{Consistency: "bounded", Staleness: -1}}, "parameter_server.staleness", "out of range"},
		{"ps staleness on async", &pb.JobSpec{ParameterServer: &pb.ParameterServerSpec{Consistency: "async", Staleness: 2}}, "parameter_server.staleness", "bounded"},
		{"ps addresses count", &pb.JobSpec{ParameterServer: &pb.ParameterServerSpec{Shards: 2, Addresses: []string{"h:1"}}}, "parameter_server.addresses", "1 addresses for 2"},
		{"ps address without port", &pb.JobSpec{ParameterServer: &pb.ParameterServerSpec{Addresses: []string{"host"}}}, "parameter_server.addresses", "host:port"},
		{"ps shards in ring mode", &pb.JobSpec{Mode: "ring", ParameterServer: &pb.ParameterServerSpec{Shards: 2}}, "parameter_server", "mode ps"},
		{"ps async in ring mode", &pb.JobSpec{Mode: "ring", ParameterServer: &pb.ParameterServerSpec{Consistency: "async"}}, "parameter_server", "mode ps"},
		{"ps unknown consistency", &pb.JobSpec{ParameterServer: &pb.ParameterServerSpec{Consistency: "eventual"}}, "parameter_server.consistency", "unknown consistency"},
		{"ps staleness on sync", &pb.JobSpec{ParameterServer: &pb.ParameterServerSpec{Staleness: 2}}, "parameter_server.staleness", "bounded"},
		{"grad_clip_norm fedavg", &pb.JobSpec{Mode: "fedavg", GradClipNorm: 1}, "grad_clip_norm", "ps and ring"},
		{"grad_clip_norm negative", &pb.JobSpec{GradClipNorm: -1}, "grad_clip_norm", "positive"},
		{"grad_clip_norm NaN", &pb.JobSpec{GradClipNorm: math.NaN()}, "grad_clip_norm", "positive"},
		{"grad_accum_steps fedavg", &pb.JobSpec{Mode: "fedavg", GradAccumSteps: 2}, "grad_accum_steps", "ps and ring"},
		{"grad_accum_steps -1", &pb.JobSpec{GradAccumSteps: -1}, "grad_accum_steps", "out of range"},
		{"log_every -1", &pb.JobSpec{LogEverySteps: -1}, "log_every_steps", "out of range"},
		{"step timeout negative", &pb.JobSpec{StepTimeoutSeconds: -1}, "step_timeout_seconds", "out of range"},
		{"step timeout NaN", &pb.JobSpec{StepTimeoutSeconds: math.NaN()}, "step_timeout_seconds", "out of range"},
		{"nonfinite policy", &pb.JobSpec{NonfinitePolicy: "ignore"}, "nonfinite_policy", "unknown policy"},
		{"activation checkpointing", &pb.JobSpec{ActivationCheckpointing: "layers"}, "activation_checkpointing", "allowed: none, blocks, sqrt"},
		{"precision", &pb.JobSpec{Precision: "fp8"}, "precision", "unknown precision"},
		{"fp16 in ps mode", &pb.JobSpec{Precision: "fp16"}, "precision", "modes ring and fedavg"},
		{"fp16 with powersgd", &pb.JobSpec{Mode: "ring", Precision: "fp16", Compression: &pb.CompressionSpec{Type: "powersgd"}}, "precision", "error feedback"},
		{"schedule unknown", &pb.JobSpec{LrSchedule: &pb.ScheduleSpec{Name: "exp"}}, "lr_schedule.name", "unknown schedule"},
		{"schedule step without size", &pb.JobSpec{LrSchedule: &pb.ScheduleSpec{Name: "step"}}, "lr_schedule.step_size", "step_size"},
		{"schedule step gamma 2", &pb.JobSpec{LrSchedule: &pb.ScheduleSpec{Name: "step", StepSize: 1, Gamma: 2}}, "lr_schedule.gamma", "out of range"},
		{"cosine with step_size", &pb.JobSpec{LrSchedule: &pb.ScheduleSpec{StepSize: 3}}, "lr_schedule", "do not apply"},
		{"warmup negative", &pb.JobSpec{LrSchedule: &pb.ScheduleSpec{Name: "warmup-linear", WarmupSteps: -1}}, "lr_schedule.warmup_steps", "negative"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Normalize(c.spec, nil)
			if err == nil {
				t.Fatalf("Normalize accepted the spec: %v", got)
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v (%T) is not a *FieldError", err, err)
			}
			if fe.Field != c.field {
				t.Errorf("field = %q, want %q (error %v)", fe.Field, c.field, err)
			}
			if !strings.Contains(err.Error(), c.msg) {
				t.Errorf("error %q does not contain %q", err, c.msg)
			}
			if !strings.HasPrefix(err.Error(), c.field+": ") {
				t.Errorf("error %q does not start with the field name", err)
			}
		})
	}
}

// TestNormalizeExplicitZero pins the presence contract: workers,
// batch_size, epochs and optimizer.lr left out get their defaults, while an
// explicit 0 is refused naming the field.
func TestNormalizeExplicitZero(t *testing.T) {
	got, err := Normalize(&pb.JobSpec{Optimizer: &pb.OptimizerSpec{}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.GetWorkers() != 1 || got.GetBatchSize() != DefaultBatchSize || got.GetEpochs() != DefaultEpochs || got.GetOptimizer().GetLr() != DefaultLR {
		t.Errorf("absent fields not defaulted: workers %d batch %d epochs %d lr %v", got.GetWorkers(), got.GetBatchSize(), got.GetEpochs(), got.GetOptimizer().GetLr())
	}
	cases := []struct {
		field string
		spec  *pb.JobSpec
	}{
		{"workers", &pb.JobSpec{Workers: proto.Int32(0)}},
		{"batch_size", &pb.JobSpec{BatchSize: proto.Int32(0)}},
		{"epochs", &pb.JobSpec{Epochs: proto.Int32(0)}},
		{"optimizer.lr", &pb.JobSpec{Optimizer: &pb.OptimizerSpec{Lr: proto.Float64(0)}}},
	}
	for _, c := range cases {
		_, err := Normalize(c.spec, nil)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("explicit 0 %s: err = %v; want a *FieldError for %s", c.field, err, c.field)
		}
	}
	// The same through Parse: JSON 0 is an explicit 0.
	spec, err := Parse([]byte(`{"workers": 0}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Normalize(spec, nil); err == nil {
		t.Error(`{"workers": 0} accepted`)
	}
}

func TestNormalizeModelsAvailable(t *testing.T) {
	// A known architecture the models package does not build yet.
	_, err := Normalize(&pb.JobSpec{Model: "resnet8"}, []string{"logreg", "mlp"})
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "model" || !strings.Contains(fe.Msg, "not implemented") || !strings.Contains(fe.Msg, "logreg, mlp") {
		t.Errorf("resnet8 with models [logreg mlp]: err = %v; want a model FieldError saying not implemented and listing the available ones", err)
	}
	if _, err := Normalize(&pb.JobSpec{Model: "logreg"}, []string{"logreg", "mlp"}); err != nil {
		t.Errorf("logreg: %v", err)
	}
}

func TestParse(t *testing.T) {
	want := &pb.JobSpec{
		Model: "logreg", BatchSize: proto.Int32(64), Workers: proto.Int32(2),
		Dataset:   &pb.DatasetSpec{Name: "synthetic", SyntheticTrain: 100},
		Optimizer: &pb.OptimizerSpec{Lr: proto.Float64(0.1), Momentum: proto.Float64(0)},
	}
	inputs := map[string]string{
		"yaml proto names": `
model: logreg
batch_size: 64
workers: 2
dataset:
  name: synthetic
  synthetic_train: 100
optimizer:
  lr: 0.1
  momentum: 0
`,
		"yaml camelCase": `
model: logreg
batchSize: 64
workers: 2
dataset: {name: synthetic, syntheticTrain: 100}
optimizer: {lr: 0.1, momentum: 0}
`,
		"json proto names": `{"model":"logreg","batch_size":64,"workers":2,"dataset":{"name":"synthetic","synthetic_train":100},"optimizer":{"lr":0.1,"momentum":0}}`,
		"json camelCase":   `{"model":"logreg","batchSize":64,"workers":2,"dataset":{"name":"synthetic","syntheticTrain":100},"optimizer":{"lr":0.1,"momentum":0}}`,
	}
	for name, in := range inputs {
		got, err := Parse([]byte(in))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
	}
	for _, empty := range []string{"", "null", "{}"} {
		got, err := Parse([]byte(empty))
		if err != nil || !proto.Equal(got, &pb.JobSpec{}) {
			t.Errorf("Parse(%q) = %v, %v; want an empty spec", empty, got, err)
		}
	}
}

func TestParseRejects(t *testing.T) {
	cases := map[string]struct{ in, msg string }{
		"unknown field":        {"model: mlp\nbatchsize: 3\n", "batchsize"},
		"unknown nested field": {`{"dataset":{"nme":"mnist"}}`, "nme"},
		"wrong type":           {"workers: two\n", "workers"},
		"not yaml":             {"model: [unclosed\n", "YAML"},
	}
	for name, c := range cases {
		_, err := Parse([]byte(c.in))
		if err == nil {
			t.Errorf("%s: Parse(%q) accepted it", name, c.in)
			continue
		}
		if !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: error %q does not mention %q", name, err, c.msg)
		}
	}
}

func TestLearningRate(t *testing.T) {
	const base = 0.1
	spec := func(s *pb.ScheduleSpec) *pb.JobSpec {
		return &pb.JobSpec{Optimizer: &pb.OptimizerSpec{Lr: proto.Float64(base)}, LrSchedule: s}
	}
	cosine := spec(&pb.ScheduleSpec{Name: "cosine"})
	step := spec(&pb.ScheduleSpec{Name: "step", StepSize: 10, Gamma: 0.5})
	warm := spec(&pb.ScheduleSpec{Name: "warmup-linear", WarmupSteps: 4})
	constant := spec(&pb.ScheduleSpec{Name: "constant"})
	cases := []struct {
		name        string
		spec        *pb.JobSpec
		step, total int64
		want        float64
	}{
		{"cosine start", cosine, 0, 100, base},
		{"cosine middle", cosine, 50, 100, base / 2},
		{"cosine end", cosine, 100, 100, 0},
		{"cosine past end clamps", cosine, 150, 100, 0},
		{"cosine negative step clamps", cosine, -5, 100, base},
		{"cosine total 0", cosine, 0, 0, base},
		{"step 0", step, 0, 100, base},
		{"step 9", step, 9, 100, base},
		{"step 10", step, 10, 100, base * 0.5},
		{"step 25", step, 25, 100, base * 0.25},
		{"warmup first", warm, 0, 20, base / 4},
		{"warmup last", warm, 3, 20, base},
		{"decay start", warm, 4, 20, base},
		{"decay middle", warm, 12, 20, base / 2},
		{"decay end", warm, 20, 20, 0},
		{"constant", constant, 77, 100, base},
	}
	for _, c := range cases {
		got := optim.LearningRate(c.spec, c.step, c.total)
		if math.Abs(got-c.want) > 1e-12 {
			t.Errorf("%s: LearningRate(step %d of %d) = %v, want %v", c.name, c.step, c.total, got, c.want)
		}
	}
	// Cosine decreases monotonically.
	prev := math.Inf(1)
	for s := int64(0); s <= 100; s++ {
		lr := optim.LearningRate(cosine, s, 100)
		if lr > prev {
			t.Fatalf("cosine increased at step %d: %v > %v", s, lr, prev)
		}
		prev = lr
	}
	// A normalized default spec uses cosine from the default LR.
	n, err := Normalize(&pb.JobSpec{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := optim.LearningRate(n, 0, 10); got != DefaultLR {
		t.Errorf("default spec at step 0: %v, want %v", got, DefaultLR)
	}
}

// TestCheckpointsInEveryMode: ps and fedavg jobs (simulated or with real
// clients) checkpoint as ring jobs do; keep defaults to 3.
func TestCheckpointsInEveryMode(t *testing.T) {
	for _, w := range []int32{1, 3} {
		for _, mode := range Modes {
			s, err := Normalize(&pb.JobSpec{Mode: mode, Workers: proto.Int32(w), Checkpoint: &pb.CheckpointSpec{EveryEpochs: 1}}, []string{"logreg", "mlp"})
			if err != nil {
				t.Errorf("mode %s on %d workers: %v", mode, w, err)
				continue
			}
			if !CheckpointsOn(s) || s.GetCheckpoint().GetKeep() != 3 {
				t.Errorf("mode %s on %d workers: checkpoint %v", mode, w, s.GetCheckpoint())
			}
		}
	}
}

func TestCheckpointDue(t *testing.T) {
	spec := &pb.JobSpec{Checkpoint: &pb.CheckpointSpec{EverySteps: 10, EveryEpochs: 2, EverySeconds: 30}}
	for _, c := range []struct {
		step     int64
		epochEnd bool
		epoch    int
		since    time.Duration
		want     bool
	}{
		{10, false, 0, 0, true},
		{11, false, 0, 0, false},
		{11, true, 0, 0, false},
		{11, true, 1, 0, true},
		{11, false, 1, 0, false},
		{11, false, 0, 30 * time.Second, true},
		{11, false, 0, 29 * time.Second, false},
	} {
		if got := CheckpointDue(spec, c.step, c.epochEnd, c.epoch, c.since); got != c.want {
			t.Errorf("CheckpointDue(step %d, end %v, epoch %d, %v) = %v, want %v", c.step, c.epochEnd, c.epoch, c.since, got, c.want)
		}
	}
	if CheckpointDue(&pb.JobSpec{}, 10, true, 0, time.Hour) {
		t.Error("no checkpoint settings, but a checkpoint is due")
	}
}

func TestCheckpointHashIgnoresWorkers(t *testing.T) {
	a := &pb.JobSpec{Model: "mlp", Workers: proto.Int32(2), Seed: proto.Int64(1)}
	b := &pb.JobSpec{Model: "mlp", Workers: proto.Int32(4), MinWorkers: 3, Seed: proto.Int64(1)}
	if CheckpointHash(a) != CheckpointHash(b) {
		t.Error("the number of workers changes the hash")
	}
	b.Seed = proto.Int64(2)
	if CheckpointHash(a) == CheckpointHash(b) {
		t.Error("another seed, the same hash")
	}
}

// TestRealClients: fedavg on N ≥ 2 workers runs N real clients (K = N),
// with or without a partition of each client's training split; workers: 1
// keeps the simulation and its default partition.
func TestRealClients(t *testing.T) {
	got, err := Normalize(&pb.JobSpec{Mode: "fedavg", Workers: proto.Int32(3), Federated: &pb.FederatedSpec{Fraction: 1, MinClients: 2}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !RealClients(got) || got.Federated.Clients != 3 || got.Partition != nil || got.Federated.MinClients != 2 {
		t.Errorf("3 workers: real %v, clients %d, partition %v, min_clients %d; want real, 3, none, 2",
			RealClients(got), got.Federated.Clients, got.Partition, got.Federated.MinClients)
	}
	got, err = Normalize(&pb.JobSpec{Mode: "fedavg", Workers: proto.Int32(3), Federated: &pb.FederatedSpec{Clients: 3},
		Partition: &pb.PartitionSpec{Type: "dirichlet"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Partition.GetType() != "dirichlet" || got.Partition.Alpha != DefaultDirichletAlpha {
		t.Errorf("partition %v, want dirichlet with the default alpha", got.Partition)
	}
	got, err = Normalize(&pb.JobSpec{Mode: "fedavg"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if RealClients(got) || got.Federated.Clients != DefaultClients || got.Partition.GetType() != defaultPartition {
		t.Errorf("1 worker: real %v, clients %d, partition %v; want a simulation of %d clients, %s", RealClients(got),
			got.Federated.Clients, got.Partition, DefaultClients, defaultPartition)
	}
}

// TestFedavgPrecision: fedavg clients train in bf16 or fp16 (a loss scaler
// per local run), so Normalize keeps either for mode fedavg.
func TestFedavgPrecision(t *testing.T) {
	for _, p := range []string{"bf16", "fp16"} {
		got, err := Normalize(&pb.JobSpec{Mode: "fedavg", Precision: p}, nil)
		if err != nil || got.Precision != p {
			t.Errorf("fedavg with %s: %v (precision %q)", p, err, got.GetPrecision())
		}
	}
}
