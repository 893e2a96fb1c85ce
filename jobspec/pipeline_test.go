package jobspec

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

func pipeSpec(workers, stages, micro int32) *pb.JobSpec {
	return &pb.JobSpec{Model: "lenet5", Workers: proto.Int32(workers),
		Parallelism: &pb.ParallelismSpec{Pipeline: &pb.PipelineSpec{Stages: stages, MicroBatches: micro}}}
}

func TestNormalizePipeline(t *testing.T) {
	s, err := Normalize(pipeSpec(4, 2, 4), nil)
	if err != nil {
		t.Fatal(err)
	}
	p := s.GetParallelism()
	if s.Mode != "ring" || p.Data != 2 || p.Pipeline.Schedule != "1f1b" || p.Pipeline.MicroBatches != 4 || !Pipelined(s) || PipelineStages(s) != 2 {
		t.Errorf("normalized to mode %s, %v", s.Mode, p)
	}
	if _, err := PipelinePlan(s); err != nil {
		t.Errorf("PipelinePlan: %v", err)
	}
	// Workers default to data × stages; micro-batches to stages.
	s, err = Normalize(&pb.JobSpec{Model: "mlp", Parallelism: &pb.ParallelismSpec{Data: 3, Pipeline: &pb.PipelineSpec{Stages: 2, Schedule: "gpipe"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.GetWorkers() != 6 || s.GetParallelism().GetPipeline().GetMicroBatches() != 2 {
		t.Errorf("workers %d, micro-batches %d; want 6, 2", s.GetWorkers(), s.GetParallelism().GetPipeline().GetMicroBatches())
	}
	// Explicit cuts at block boundaries (lenet5's modules are Sequential indices).
	s = pipeSpec(2, 2, 2)
	s.Parallelism.Pipeline.Boundaries = []string{"3"}
	if _, err := Normalize(s, nil); err != nil {
		t.Errorf("boundary 3 of lenet5: %v", err)
	}
	// Elastic: whole replicas may be lost.
	s = pipeSpec(4, 2, 2)
	s.MinWorkers = 2
	if _, err := Normalize(s, nil); err != nil {
		t.Errorf("4 workers, 2 stages, min_workers 2: %v", err)
	}
	// One stage: no pipeline.
	s, err = Normalize(&pb.JobSpec{Workers: proto.Int32(2), Parallelism: &pb.ParallelismSpec{}}, nil)
	if err != nil || Pipelined(s) || s.Mode != "ps" || s.GetParallelism().GetData() != 2 {
		t.Errorf("no stages: %v, %v", s, err)
	}
}

func TestNormalizePipelineRejects(t *testing.T) {
	with := func(s *pb.JobSpec, f func(*pb.JobSpec)) *pb.JobSpec { f(s); return s }
	for _, tc := range []struct {
		name, field, msg string
		spec             *pb.JobSpec
	}{
		{"negative stages", "parallelism.pipeline.stages", "negative", pipeSpec(2, -1, 0)},
		{"workers not a multiple", "parallelism.pipeline.stages", "do not divide 3 workers", pipeSpec(3, 2, 0)},
		{"data × stages", "parallelism.data", "workers = data × stages", with(pipeSpec(4, 2, 0), func(s *pb.JobSpec) { s.Parallelism.Data = 3 })},
		{"negative data", "parallelism.data", "negative", with(pipeSpec(4, 2, 0), func(s *pb.JobSpec) { s.Parallelism.Data = -1 })},
		{"negative micro-batches", "parallelism.pipeline.micro_batches", "out of range", pipeSpec(2, 2, -1)},
		{"batch not a multiple", "parallelism.pipeline.micro_batches", "batch 32 is not a multiple of 3", pipeSpec(2, 2, 3)},
		{"schedule", "parallelism.pipeline.schedule", "allowed: 1f1b, gpipe", with(pipeSpec(2, 2, 2), func(s *pb.JobSpec) { s.Parallelism.Pipeline.Schedule = "zb" })},
		{"mode ps", "mode", "mode ring", with(pipeSpec(2, 2, 2), func(s *pb.JobSpec) { s.Mode = "ps" })},
		{"more stages than blocks", "parallelism.pipeline.stages", "blocks", pipeSpec(8, 8, 8)},
		{"boundary inside a block", "parallelism.pipeline.boundaries[0]", "allowed", with(pipeSpec(2, 2, 2), func(s *pb.JobSpec) { s.Parallelism.Pipeline.Boundaries = []string{"1"} })},
		{"boundary count", "parallelism.pipeline.boundaries", "want 1", with(pipeSpec(2, 2, 2), func(s *pb.JobSpec) { s.Parallelism.Pipeline.Boundaries = []string{"3", "6"} })},
		{"grad accum", "grad_accum_steps", "micro_batches", with(pipeSpec(2, 2, 2), func(s *pb.JobSpec) { s.GradAccumSteps = 2 })},
		{"clip", "grad_clip_norm", "not implemented", with(pipeSpec(2, 2, 2), func(s *pb.JobSpec) { s.GradClipNorm = 1 })},
		{"schedule on one stage", "parallelism.pipeline.stages", "2 or more stages", with(pipeSpec(2, 1, 0), func(s *pb.JobSpec) { s.Parallelism.Pipeline.Schedule = "gpipe" })},
		{"stage cost", "parallelism.pipeline.debug_stage_cost", "fwd=20ms,bwd=40ms", with(pipeSpec(2, 2, 2), func(s *pb.JobSpec) { s.Parallelism.Pipeline.DebugStageCost = "fwd=1" })},
		{"stage cost twice", "parallelism.pipeline.debug_stage_cost", "each once", with(pipeSpec(2, 2, 2), func(s *pb.JobSpec) { s.Parallelism.Pipeline.DebugStageCost = "fwd=1ms,fwd=2ms" })},
		{"skip non-finite steps", "nonfinite_policy", "use fail", with(pipeSpec(2, 2, 2), func(s *pb.JobSpec) { s.NonfinitePolicy = "skip" })},
		{"elastic with one replica", "min_workers", "2 or more replicas", with(pipeSpec(2, 2, 2), func(s *pb.JobSpec) { s.MinWorkers = 1 })},
		{"elastic by a part of a replica", "min_workers", "multiple of the stages", with(pipeSpec(4, 2, 2), func(s *pb.JobSpec) { s.MinWorkers = 3 })},
		{"balance", "parallelism.pipeline.balance", "allowed: params, time", with(pipeSpec(2, 2, 2), func(s *pb.JobSpec) { s.Parallelism.Pipeline.Balance = "flops" })},
		{"balance on one stage", "parallelism.pipeline.stages", "2 or more stages", with(pipeSpec(2, 1, 0), func(s *pb.JobSpec) { s.Parallelism.Pipeline.Balance = "time" })},
		{"timed checkpoints", "checkpoint.every_seconds", "every_steps", with(pipeSpec(2, 2, 2), func(s *pb.JobSpec) { s.Checkpoint = &pb.CheckpointSpec{EverySeconds: 10} })},
	} {
		_, err := Normalize(tc.spec, nil)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Msg, tc.msg) {
			t.Errorf("%s: got %v; want a FieldError on %s saying %q", tc.name, err, tc.field, tc.msg)
		}
	}
}

// TestBalanceTime: balance time measures the blocks once, at
// normalization, and writes its cut into boundaries, which a second
// normalization (a resume, a worker) keeps; params is the default.
func TestBalanceTime(t *testing.T) {
	s := &pb.JobSpec{Model: "resnet8", Workers: proto.Int32(3), Parallelism: &pb.ParallelismSpec{Pipeline: &pb.PipelineSpec{Stages: 3, MicroBatches: 4, Balance: "time"}}}
	n, err := Normalize(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := n.GetParallelism().GetPipeline()
	if p.GetBalance() != "time" || len(p.GetBoundaries()) != 2 {
		t.Fatalf("balance %q, boundaries %q; want time and 2 boundaries", p.GetBalance(), p.GetBoundaries())
	}
	again, err := Normalize(proto.Clone(n).(*pb.JobSpec), nil)
	if err != nil {
		t.Fatal(err)
	}
	if b := again.GetParallelism().GetPipeline().GetBoundaries(); !slices.Equal(b, p.GetBoundaries()) {
		t.Errorf("normalized again: boundaries %q, first %q", b, p.GetBoundaries())
	}
	d, err := Normalize(pipeSpec(2, 2, 2), nil)
	if err != nil {
		t.Fatal(err)
	}
	if p := d.GetParallelism().GetPipeline(); p.GetBalance() != "params" || len(p.GetBoundaries()) != 0 {
		t.Errorf("default: balance %q, boundaries %q; want params and none (cut when the job runs)", p.GetBalance(), p.GetBoundaries())
	}
}

func TestStageCost(t *testing.T) {
	f, b, err := StageCost("fwd=20ms,bwd=40ms")
	if err != nil || f != 20*time.Millisecond || b != 40*time.Millisecond {
		t.Errorf("fwd=20ms,bwd=40ms: %v %v %v", f, b, err)
	}
	if f, b, err := StageCost("bwd=1s"); err != nil || f != 0 || b != time.Second {
		t.Errorf("bwd=1s: %v %v %v", f, b, err)
	}
	for _, bad := range []string{"fwd", "x=1ms", "fwd=-1ms", "fwd=2h", "fwd=1ms,"} {
		if _, _, err := StageCost(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestCollectiveTransport: collective.transport takes grpc, shm or auto;
// shared memory only for ring jobs of whole-model workers, otherwise
// InvalidArgument naming the field.
func TestCollectiveTransport(t *testing.T) {
	ring := func(tr string) *pb.JobSpec {
		return &pb.JobSpec{Model: "mlp", Mode: "ring", Workers: proto.Int32(2), Collective: &pb.CollectiveSpec{Transport: tr}}
	}
	for _, tr := range []string{"", "grpc", "shm", "auto"} {
		if _, err := Normalize(ring(tr), nil); err != nil {
			t.Errorf("transport %q: %v", tr, err)
		}
	}
	ps := ring("shm")
	ps.Mode = "ps"
	piped := ring("shm")
	piped.Parallelism = &pb.ParallelismSpec{Pipeline: &pb.PipelineSpec{Stages: 2, MicroBatches: 2}}
	for name, c := range map[string]struct {
		spec *pb.JobSpec
		msg  string
	}{
		"unknown":  {ring("rdma"), `unknown transport "rdma"`},
		"ps":       {ps, "shm with mode ps is not implemented yet"},
		"pipeline": {piped, "shm with pipeline stages is not implemented yet"},
	} {
		_, err := Normalize(c.spec, nil)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "collective.transport" || !strings.Contains(fe.Msg, c.msg) {
			t.Errorf("%s: %v; want a collective.transport error saying %q", name, err, c.msg)
		}
	}
}

// TestCollectiveAlgorithm: collective.algorithm takes auto or ring for
// training; halving_doubling and tree are known but refused as not
// implemented for training; anything else is refused as unknown, both
// naming the field.
func TestCollectiveAlgorithm(t *testing.T) {
	ring := func(a string) *pb.JobSpec {
		return &pb.JobSpec{Model: "mlp", Mode: "ring", Workers: proto.Int32(2), Collective: &pb.CollectiveSpec{Algorithm: a}}
	}
	for _, a := range []string{"", "auto", "ring"} {
		if _, err := Normalize(ring(a), nil); err != nil {
			t.Errorf("algorithm %q: %v", a, err)
		}
	}
	for a, msg := range map[string]string{
		"halving_doubling": notImplementedSuffix,
		"tree":             notImplementedSuffix,
		"nccl":             `unknown algorithm "nccl"; allowed: auto, ring, halving_doubling, tree`,
		"Ring":             "unknown algorithm",
	} {
		_, err := Normalize(ring(a), nil)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "collective.algorithm" || !strings.Contains(fe.Msg, msg) {
			t.Errorf("%s: %v; want a collective.algorithm error saying %q", a, err, msg)
		}
	}
}

// MemoryNeeds: one need per stage, each the stage's parameters, gradients
// and optimiser state plus its in-flight activations; the stages' state
// sums to the whole model's; a whole-model job has one need.
func TestMemoryNeeds(t *testing.T) {
	spec := func(stages int32, opt string) *pb.JobSpec {
		s := &pb.JobSpec{Model: "mlp", Workers: proto.Int32(max(stages, 1)), BatchSize: proto.Int32(32), MaxSteps: 1,
			Dataset: &pb.DatasetSpec{Name: "synthetic"}, Optimizer: &pb.OptimizerSpec{Name: opt, Lr: proto.Float64(0.01)}}
		if stages > 1 {
			s.Parallelism = &pb.ParallelismSpec{Pipeline: &pb.PipelineSpec{Stages: stages, MicroBatches: 4, Schedule: "gpipe"}}
		}
		n, err := Normalize(s, nil)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	whole, err := MemoryNeeds(spec(1, "adam"))
	if err != nil {
		t.Fatal(err)
	}
	net, err := models.New("mlp", models.Options{})
	if err != nil {
		t.Fatal(err)
	}
	stateBytes := uint64(4 * 4 * net.NumParams()) // parameters, gradients, Adam's two moments
	if len(whole) != 1 || whole[0].Bytes <= stateBytes || !strings.Contains(whole[0].What, "the whole model") {
		t.Fatalf("whole model: %+v; want one need above %d bytes of state", whole, stateBytes)
	}
	staged, err := MemoryNeeds(spec(3, "adam"))
	if err != nil {
		t.Fatal(err)
	}
	if len(staged) != 3 || !strings.Contains(staged[2].What, "pipeline stage 2 of 3 (fc3)") {
		t.Fatalf("3 stages: %+v", staged)
	}
	var largest uint64
	for _, n := range staged {
		largest = max(largest, n.Bytes)
	}
	if largest >= whole[0].Bytes {
		t.Errorf("the largest stage needs %d bytes, the whole model %d", largest, whole[0].Bytes)
	}
	sgdSpec := spec(1, "sgd")
	sgd, err := MemoryNeeds(sgdSpec)
	if err != nil {
		t.Fatal(err)
	}
	extra := 2 // Adam's two moments
	if sgdSpec.GetOptimizer().GetMomentum() != 0 {
		extra-- // against SGD's momentum buffer
	}
	if d := whole[0].Bytes - sgd[0].Bytes; d != uint64(4*extra*net.NumParams()) {
		t.Errorf("Adam needs %d bytes more than SGD (momentum %v); want %d", d, sgdSpec.GetOptimizer().GetMomentum(), 4*extra*net.NumParams())
	}
}
