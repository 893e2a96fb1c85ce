package jobspec

import (
	"encoding/json"
	"strconv"

	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Keys of a checkpoint's model.safetensors __metadata__ that describe the
// weights for a user elsewhere (PyTorch): what the network is and how its
// inputs were prepared. Values are strings, as safetensors requires; the
// lists are JSON arrays.
const (
	MetaArchitecture = "gradsync.architecture" // models name, e.g. "resnet18"
	MetaDataset      = "gradsync.dataset"      // dataset.name
	MetaInputShape   = "gradsync.input_shape"  // [C, H, W]
	MetaClasses      = "gradsync.classes"      // number of outputs, decimal
	MetaMultiLabel   = "gradsync.multi_label"  // "true": sigmoid per class (BCE), else softmax
	MetaClassNames   = "gradsync.class_names"  // ["name of class 0", …], when known
	// MetaMean and MetaStd are the per-channel statistics the inputs were
	// normalised with, one per channel: x = (p/255 − mean[c]) / std[c]
	// for a pixel p in 0..255 — torchvision's ToTensor then
	// Normalize(mean, std). Absent when the writer does not know them (a
	// parameter server of a job whose spec leaves them to the workers).
	MetaMean = "gradsync.mean"
	MetaStd  = "gradsync.std"
)

// ModelMetadata returns the __metadata__ entries that describe spec's
// model for a user of its checkpoint: architecture, data set, input
// shape, classes and their names (dataset.shape.class_names) and the
// normalisation. mean and std are what the inputs were normalised with
// (one value, or one per channel); nil falls back to the spec's
// dataset.mean and dataset.std, and the keys are left out when neither
// gives them.
func ModelMetadata(spec *pb.JobSpec, mean, std []float64) map[string]string {
	c, h, w, classes := InputShape(spec)
	m := map[string]string{
		MetaArchitecture: spec.GetModel(),
		MetaDataset:      spec.GetDataset().GetName(),
		MetaInputShape:   jsonString([]int{c, h, w}),
		MetaClasses:      strconv.Itoa(classes),
		MetaMultiLabel:   strconv.FormatBool(spec.GetDataset().GetShape().GetMultiLabel() || spec.GetDataset().GetName() == MultiLabelMNIST),
	}
	if names := spec.GetDataset().GetShape().GetClassNames(); len(names) == classes {
		m[MetaClassNames] = jsonString(names)
	}
	if mean == nil && std == nil {
		mean, std = spec.GetDataset().GetMean(), spec.GetDataset().GetStd()
	}
	if len(mean) == 1 && len(std) == 1 && c > 1 {
		m0, s0 := mean[0], std[0]
		mean, std = make([]float64, c), make([]float64, c)
		for i := range c {
			mean[i], std[i] = m0, s0
		}
	}
	if len(mean) == c && len(std) == c {
		m[MetaMean], m[MetaStd] = jsonString(mean), jsonString(std)
	}
	return m
}

func jsonString(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // ints, strings and finite floats always marshal
	}
	return string(b)
}
