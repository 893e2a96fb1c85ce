package jobspec

import (
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// TestModelMetadata: the checkpoint metadata names the architecture,
// shape, classes and their names, and the normalisation — given, from the
// spec, one value spread over the channels, or left out when unknown.
func TestModelMetadata(t *testing.T) {
	spec, err := Normalize(&pb.JobSpec{Model: "resnet8", Mode: "ring", Workers: proto.Int32(2), Dataset: &pb.DatasetSpec{Name: "cifar100",
		LabelGranularity: "coarse", Mean: []float64{0.5}, Std: []float64{0.25},
		Shape: &pb.DataShape{Channels: 3, Height: 32, Width: 32, Classes: 20, ClassNames: make([]string, 20)}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := ModelMetadata(spec, nil, nil)
	for k, want := range map[string]string{MetaArchitecture: "resnet8", MetaDataset: "cifar100", MetaInputShape: "[3,32,32]",
		MetaClasses: "20", MetaMultiLabel: "false", MetaMean: "[0.5,0.5,0.5]", MetaStd: "[0.25,0.25,0.25]",
		MetaClassNames: `["","","","","","","","","","","","","","","","","","","",""]`} {
		if m[k] != want {
			t.Errorf("%s = %q, want %q", k, m[k], want)
		}
	}
	m = ModelMetadata(spec, []float64{0.1, 0.2, 0.3}, []float64{1, 2, 3})
	if m[MetaMean] != "[0.1,0.2,0.3]" || m[MetaStd] != "[1,2,3]" {
		t.Errorf("given statistics: mean %s, std %s", m[MetaMean], m[MetaStd])
	}
	mnist, err := Normalize(&pb.JobSpec{Model: "mlp", Dataset: &pb.DatasetSpec{Name: "mnist"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m = ModelMetadata(mnist, nil, nil)
	if _, ok := m[MetaMean]; ok || m[MetaInputShape] != "[1,28,28]" || m[MetaClasses] != "10" {
		t.Errorf("mnist without statistics: %v; want shape [1,28,28], 10 classes, no mean", m)
	}
	if _, ok := m[MetaClassNames]; ok {
		t.Errorf("mnist: class names %s, but none are known", m[MetaClassNames])
	}
}
