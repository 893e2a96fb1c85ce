package jobspec

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

func labelSpec(model string, workers, l int32) *pb.JobSpec {
	return &pb.JobSpec{Model: model, Workers: proto.Int32(workers), Parallelism: &pb.ParallelismSpec{LabelShards: l}}
}

func TestNormalizeLabelShards(t *testing.T) {
	s, err := Normalize(labelSpec("cnn", 4, 2), nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.Mode != "ring" || s.GetParallelism().GetData() != 2 || LabelShards(s) != 2 || !LabelSharded(s) || Pipelined(s) {
		t.Errorf("normalized to mode %s, %v", s.Mode, s.GetParallelism())
	}
	shards, err := LabelShardClasses(s)
	if err != nil || !slices.Equal(shards[0], []int{0, 1, 2, 3, 4}) || !slices.Equal(shards[1], []int{5, 6, 7, 8, 9}) {
		t.Errorf("shards %v, %v", shards, err)
	}
	// Workers default to data × label shards.
	s, err = Normalize(&pb.JobSpec{Model: "mlp", Parallelism: &pb.ParallelismSpec{Data: 3, LabelShards: 2}}, nil)
	if err != nil || s.GetWorkers() != 6 || s.Mode != "ring" {
		t.Errorf("workers %d, mode %s, %v; want 6, ring", s.GetWorkers(), s.GetMode(), err)
	}
	// Groups go to the shards in contiguous runs.
	s = labelSpec("mlp", 2, 2)
	s.Parallelism.LabelGroups = []*pb.LabelGroup{{Classes: []int32{9, 0}}, {Classes: []int32{1, 2, 3}}, {Classes: []int32{4, 5, 6, 7, 8}}}
	if s, err = Normalize(s, nil); err != nil {
		t.Fatal(err)
	}
	shards, err = LabelShardClasses(s)
	if err != nil || !slices.Equal(shards[0], []int{9, 0}) || !slices.Equal(shards[1], []int{1, 2, 3, 4, 5, 6, 7, 8}) {
		t.Errorf("grouped shards %v, %v", shards, err)
	}
}

func TestNormalizeLabelShardsRejects(t *testing.T) {
	with := func(s *pb.JobSpec, f func(*pb.JobSpec)) *pb.JobSpec { f(s); return s }
	groups := func(gs ...[]int32) func(*pb.JobSpec) {
		return func(s *pb.JobSpec) {
			for _, g := range gs {
				s.Parallelism.LabelGroups = append(s.Parallelism.LabelGroups, &pb.LabelGroup{Classes: g})
			}
		}
	}
	for _, tc := range []struct {
		name, field, msg string
		spec             *pb.JobSpec
	}{
		{"negative", "parallelism.label_shards", "negative", labelSpec("cnn", 2, -1)},
		{"more shards than classes", "parallelism.label_shards", "11 label shards for 10 classes", labelSpec("cnn", 11, 11)},
		{"workers not a multiple", "parallelism.label_shards", "do not divide 3 workers", labelSpec("cnn", 3, 2)},
		{"data × L ≠ workers", "parallelism.data", "workers = data × label_shards", with(labelSpec("cnn", 4, 2), func(s *pb.JobSpec) { s.Parallelism.Data = 3 })},
		{"groups miss a class", "parallelism.label_groups", "class 9 is in no label group", with(labelSpec("cnn", 2, 2), groups([]int32{0, 1, 2}, []int32{3, 4, 5, 6, 7, 8}))},
		{"class twice", "parallelism.label_groups", "in two groups", with(labelSpec("cnn", 2, 2), groups([]int32{0, 1, 2, 3, 4}, []int32{4, 5, 6, 7, 8, 9}))},
		{"class out of range", "parallelism.label_groups", "outside [0, 10)", with(labelSpec("cnn", 2, 2), groups([]int32{0, 1, 2, 3, 4, 10}, []int32{5, 6, 7, 8, 9}))},
		{"fewer groups than shards", "parallelism.label_groups", "3 label groups to 4", with(labelSpec("cnn", 4, 4), groups([]int32{0, 1, 2, 3}, []int32{4, 5, 6}, []int32{7, 8, 9}))},
		{"groups without shards", "parallelism.label_groups", "2 or more label shards", with(labelSpec("cnn", 1, 0), groups([]int32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}))},
		{"ps mode", "mode", "mode ring", with(labelSpec("cnn", 2, 2), func(s *pb.JobSpec) { s.Mode = "ps" })},
		{"with stages", "parallelism.label_shards", "pipeline stages", with(labelSpec("cnn", 4, 2), func(s *pb.JobSpec) { s.Parallelism.Pipeline = &pb.PipelineSpec{Stages: 2} })},
		{"clipping", "grad_clip_norm", "norm over all shards", with(labelSpec("cnn", 2, 2), func(s *pb.JobSpec) { s.GradClipNorm = 1 })},
		{"elastic", "min_workers", "elastic", with(labelSpec("cnn", 2, 2), func(s *pb.JobSpec) { s.MinWorkers = 1 })},
		{"multi-label", "dataset.name", "multi-label", with(labelSpec("cnn", 2, 2), func(s *pb.JobSpec) { s.Dataset = &pb.DatasetSpec{Name: MultiLabelMNIST} })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Normalize(tc.spec, nil)
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Msg, tc.msg) {
				t.Errorf("got %v; want %s: …%s…", err, tc.field, tc.msg)
			}
		})
	}
}

func TestNormalizeTensor(t *testing.T) {
	s, err := Normalize(&pb.JobSpec{Model: "mlp", Workers: proto.Int32(4), Parallelism: &pb.ParallelismSpec{Tensor: 2}}, nil)
	if err != nil || s.Mode != "ring" || s.GetParallelism().GetData() != 2 || TensorRanks(s) != 2 || !TensorParallel(s) {
		t.Errorf("normalized to %v, %v", s, err)
	}
	if s, err = Normalize(&pb.JobSpec{Model: "mlp", Parallelism: &pb.ParallelismSpec{Tensor: 3}}, nil); err != nil || s.GetWorkers() != 3 {
		t.Errorf("workers default: %v, %v", s, err)
	}
	for _, tr := range []int32{2, 4} { // vit-tiny: 4 heads, MLP 128
		if s, err = Normalize(&pb.JobSpec{Model: "vit-tiny", Parallelism: &pb.ParallelismSpec{Tensor: tr}}, nil); err != nil || s.GetWorkers() != tr || TensorRanks(s) != int(tr) {
			t.Errorf("vit-tiny T=%d: %v, %v", tr, s, err)
		}
	}
	for _, tc := range []struct {
		name, field, msg string
		spec             *pb.JobSpec
	}{
		{"negative", "parallelism.tensor", "negative", &pb.JobSpec{Model: "mlp", Parallelism: &pb.ParallelismSpec{Tensor: -2}}},
		{"another model", "parallelism.tensor", "not cnn", &pb.JobSpec{Model: "cnn", Parallelism: &pb.ParallelismSpec{Tensor: 2}}},
		{"workers not a multiple", "parallelism.tensor", "do not divide 3 workers", &pb.JobSpec{Model: "mlp", Workers: proto.Int32(3), Parallelism: &pb.ParallelismSpec{Tensor: 2}}},
		{"with label shards", "parallelism.tensor", "one or the other", &pb.JobSpec{Model: "mlp", Workers: proto.Int32(4), Parallelism: &pb.ParallelismSpec{Tensor: 2, LabelShards: 2}}},
		{"ps", "mode", "mode ring", &pb.JobSpec{Model: "mlp", Mode: "ps", Workers: proto.Int32(2), Parallelism: &pb.ParallelismSpec{Tensor: 2}}},
		{"vit-tiny T=3", "parallelism.tensor", "3 tensor-parallel ranks do not divide vit-tiny's 4 attention heads and 128 MLP hidden units; allowed: 1, 2, 4",
			&pb.JobSpec{Model: "vit-tiny", Parallelism: &pb.ParallelismSpec{Tensor: 3}}},
		{"vit-tiny T=8", "parallelism.tensor", "8 tensor-parallel ranks do not divide vit-tiny's 4 attention heads",
			&pb.JobSpec{Model: "vit-tiny", Workers: proto.Int32(16), Parallelism: &pb.ParallelismSpec{Tensor: 8}}},
	} {
		_, err := Normalize(tc.spec, nil)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Msg, tc.msg) {
			t.Errorf("%s: got %v; want %s: …%s…", tc.name, err, tc.field, tc.msg)
		}
	}
}
