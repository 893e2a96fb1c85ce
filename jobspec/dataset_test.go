package jobspec

import (
	"context"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gradsync/gradsync/data"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// TestNormalizeDatasetFields: the streamed sets' fields get their
// defaults, and each misuse is refused naming the field.
func TestNormalizeDatasetFields(t *testing.T) {
	shape := func(c, h, w, k int32) *pb.DataShape {
		return &pb.DataShape{Channels: c, Height: h, Width: w, Classes: k}
	}
	got, err := Normalize(&pb.JobSpec{Dataset: &pb.DatasetSpec{Name: "cifar100", Shape: shape(3, 32, 32, 100)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := got.Dataset; d.LabelGranularity != "fine" || d.Channels != 0 {
		t.Errorf("cifar100 defaults: granularity %q, channels %d; want fine, 0", d.LabelGranularity, d.Channels)
	}
	if c, h, w, k := InputShape(got); c != 3 || h != 32 || w != 32 || k != 100 {
		t.Errorf("InputShape = %d×%d×%d, %d classes; want 3×32×32, 100", c, h, w, k)
	}
	if _, err = Normalize(&pb.JobSpec{Dataset: &pb.DatasetSpec{Name: "imagefolder", Shape: shape(3, 20, 30, 1000), ImageSize: []int32{20, 30}}}, nil); err != nil {
		t.Errorf("1000 single-label classes: %v", err)
	}
	for _, k := range []int32{3000, 21_841, MaxClasses} { // ImageNet-21k's label space, and the bound
		if _, err = Normalize(&pb.JobSpec{Dataset: &pb.DatasetSpec{Name: "imagefolder", Shape: shape(3, 20, 30, k), ImageSize: []int32{20, 30}}}, nil); err != nil {
			t.Errorf("%d single-label classes: %v", k, err)
		}
	}
	_, err = Normalize(&pb.JobSpec{Dataset: &pb.DatasetSpec{Name: "imagefolder", Shape: shape(3, 20, 30, MaxClasses+1), ImageSize: []int32{20, 30}}}, nil)
	if fe, ok := err.(*FieldError); !ok || fe.Field != "dataset.shape.classes" {
		t.Errorf("%d classes: %v; want refused naming dataset.shape.classes", MaxClasses+1, err)
	}
	got, err = Normalize(&pb.JobSpec{Dataset: &pb.DatasetSpec{Name: "imagefolder",
		Shape: &pb.DataShape{Channels: 3, Height: 20, Width: 30, Classes: 1000, MultiLabel: true}, ImageSize: []int32{20, 30}}}, nil)
	if err != nil {
		t.Fatalf("multi-label with 1000 classes: %v", err)
	}
	if got.Dataset.Channels != 3 {
		t.Errorf("imagefolder channels default %d, want 3", got.Dataset.Channels)
	}
	for _, h := range []float64{1e-3, 0.1, 0.5} {
		if _, err := Normalize(&pb.JobSpec{Dataset: &pb.DatasetSpec{Name: "cifar10", JitterHue: h, JitterBrightness: 0.4, Shape: shape(3, 32, 32, 10)}}, nil); err != nil {
			t.Errorf("jitter_hue %v: %v", h, err)
		}
	}
	_, err = Normalize(&pb.JobSpec{Dataset: &pb.DatasetSpec{Name: "cifar10", JitterHue: 0.75, Shape: shape(3, 32, 32, 10)}}, nil)
	if fe, ok := err.(*FieldError); !ok || !strings.Contains(fe.Msg, "0.75 out of range; allowed 0 (off) to 0.5") {
		t.Errorf("jitter_hue 0.75: %v; want the allowed range named", err)
	}
	// fedavg trains a multi-label set partitioned iid with simulated
	// clients; not with real clients or class-balanced reweighting.
	ml := func() *pb.JobSpec {
		return &pb.JobSpec{Mode: "fedavg", Dataset: &pb.DatasetSpec{Name: "imagefolder",
			Shape: &pb.DataShape{Channels: 3, Height: 8, Width: 8, Classes: 4, MultiLabel: true}}}
	}
	if _, err := Normalize(ml(), nil); err != nil {
		t.Errorf("fedavg on a multi-label set, iid: %v", err)
	}
	real := ml()
	real.Workers = proto.Int32(3)
	rw := ml()
	rw.Federated = &pb.FederatedSpec{Reweighting: "class-balanced"}
	for field, s := range map[string]*pb.JobSpec{"workers": real, "federated.reweighting": rw} {
		if _, err := Normalize(s, nil); !isFieldError(err, field) {
			t.Errorf("fedavg on a multi-label set: %v; want a FieldError on %s", err, field)
		}
	}
	// fedavg holds any label space in memory (int32 labels): 300 classes
	// over 100 clients, 10 a round, normalise.
	if _, err := Normalize(&pb.JobSpec{Mode: "fedavg", Dataset: &pb.DatasetSpec{Name: "imagefolder", Shape: shape(3, 8, 8, 300)},
		Federated: &pb.FederatedSpec{Clients: 100, Fraction: 0.1}}, nil); err != nil {
		t.Errorf("fedavg over 300 classes: %v", err)
	}
	if c, _, _, _ := InputShape(&pb.JobSpec{Dataset: &pb.DatasetSpec{Name: "mnist-pairs"}}); c != 1 {
		t.Errorf("mnist-pairs InputShape channels %d", c)
	}
	for _, c := range []struct {
		name  string
		d     *pb.DatasetSpec
		model string
		mode  string
		field string
	}{
		{"no shape", &pb.DatasetSpec{Name: "imagefolder"}, "", "", "dataset.shape"},
		{"granularity off cifar100", &pb.DatasetSpec{Name: "cifar10", LabelGranularity: "coarse", Shape: shape(3, 32, 32, 10)}, "", "", "dataset.label_granularity"},
		{"granularity unknown", &pb.DatasetSpec{Name: "cifar100", LabelGranularity: "medium", Shape: shape(3, 32, 32, 100)}, "", "", "dataset.label_granularity"},
		{"coarse with 100 classes", &pb.DatasetSpec{Name: "cifar100", LabelGranularity: "coarse", Shape: shape(3, 32, 32, 100)}, "", "", "dataset.shape"},
		{"image size off imagefolder", &pb.DatasetSpec{Name: "cifar10", ImageSize: []int32{8, 8}, Shape: shape(3, 32, 32, 10)}, "", "", "dataset.image_size"},
		{"image size of one value", &pb.DatasetSpec{Name: "imagefolder", ImageSize: []int32{8}, Shape: shape(3, 8, 8, 2)}, "", "", "dataset.image_size"},
		{"image size 0", &pb.DatasetSpec{Name: "imagefolder", ImageSize: []int32{0, 8}, Shape: shape(3, 8, 8, 2)}, "", "", "dataset.image_size"},
		{"shape against image size", &pb.DatasetSpec{Name: "imagefolder", ImageSize: []int32{9, 8}, Shape: shape(3, 8, 8, 2)}, "", "", "dataset.shape"},
		{"channels 2", &pb.DatasetSpec{Name: "imagefolder", Channels: 2, Shape: shape(3, 8, 8, 2)}, "", "", "dataset.channels"},
		{"channels against shape", &pb.DatasetSpec{Name: "imagefolder", Channels: 1, Shape: shape(3, 8, 8, 2)}, "", "", "dataset.shape.channels"},
		{"channels off imagefolder", &pb.DatasetSpec{Name: "mnist", Channels: 1}, "", "", "dataset.channels"},
		{"mean off the streamed sets", &pb.DatasetSpec{Name: "mnist", Mean: []float64{0.1}, Std: []float64{0.3}}, "", "", "dataset.mean"},
		{"mean without std", &pb.DatasetSpec{Name: "cifar10", Mean: []float64{0.1}, Shape: shape(3, 32, 32, 10)}, "", "", "dataset.mean"},
		{"std 0", &pb.DatasetSpec{Name: "cifar10", Mean: []float64{0.1}, Std: []float64{0}, Shape: shape(3, 32, 32, 10)}, "", "", "dataset.std"},
		{"two means for 3 channels", &pb.DatasetSpec{Name: "cifar10", Mean: []float64{0.1, 0.2}, Std: []float64{1, 1}, Shape: shape(3, 32, 32, 10)}, "", "", "dataset.mean"},
		{"cache off the streamed sets", &pb.DatasetSpec{Name: "mnist", CacheMb: proto.Int32(5)}, "", "", "dataset.cache_mb"},
		{"negative cache", &pb.DatasetSpec{Name: "cifar10", CacheMb: proto.Int32(-1), Shape: shape(3, 32, 32, 10)}, "", "", "dataset.cache_mb"},
		{"mnist with another shape", &pb.DatasetSpec{Name: "mnist", Shape: shape(1, 28, 28, 11)}, "", "", "dataset.shape"},
		{"class names of the wrong count", &pb.DatasetSpec{Name: "cifar10", Shape: &pb.DataShape{Channels: 3, Height: 32, Width: 32, Classes: 10, ClassNames: []string{"a"}}}, "", "", "dataset.shape.class_names"},
		{"multi-label cifar", &pb.DatasetSpec{Name: "cifar10", Shape: &pb.DataShape{Channels: 3, Height: 32, Width: 32, Classes: 10, MultiLabel: true}}, "", "", "dataset.shape.multi_label"},
		{"input too small for the model", &pb.DatasetSpec{Name: "imagefolder", Shape: shape(3, 4, 4, 2)}, "lenet5", "", "model"},
		{"fedavg on a multi-label set, Dirichlet", &pb.DatasetSpec{Name: "imagefolder", Shape: &pb.DataShape{Channels: 3, Height: 8, Width: 8, Classes: 4, MultiLabel: true}}, "", "fedavg", "partition.type"},
		{"jitter on an IDX set", &pb.DatasetSpec{Name: "mnist", JitterBrightness: 0.4}, "", "", "dataset.jitter_brightness"},
		{"negative jitter", &pb.DatasetSpec{Name: "imagefolder", JitterContrast: -0.1, Shape: shape(3, 8, 8, 2)}, "", "", "dataset.jitter_contrast"},
		{"NaN jitter", &pb.DatasetSpec{Name: "imagefolder", JitterSaturation: math.NaN(), Shape: shape(3, 8, 8, 2)}, "", "", "dataset.jitter_saturation"},
		{"hue on an IDX set", &pb.DatasetSpec{Name: "fashion-mnist", JitterHue: 0.1}, "", "", "dataset.jitter_hue"},
		{"hue above 0.5", &pb.DatasetSpec{Name: "cifar10", JitterHue: 0.6, Shape: shape(3, 32, 32, 10)}, "", "", "dataset.jitter_hue"},
		{"negative hue", &pb.DatasetSpec{Name: "cifar10", JitterHue: -0.1, Shape: shape(3, 32, 32, 10)}, "", "", "dataset.jitter_hue"},
		{"NaN hue", &pb.DatasetSpec{Name: "imagefolder", JitterHue: math.NaN(), Shape: shape(3, 8, 8, 2)}, "", "", "dataset.jitter_hue"},
		{"fedavg on mnist-pairs (multi-label)", &pb.DatasetSpec{Name: "mnist-pairs"}, "", "fedavg", "dataset.name"},
		// 2,000 clients per round × 300 classes of label histograms in
		// each round's record: more than one message holds.
		{"fedavg's round histograms too wide", &pb.DatasetSpec{Name: "imagefolder", Shape: shape(3, 8, 8, 300)}, "", "fedavg", "federated.fraction"},
	} {
		spec := &pb.JobSpec{Dataset: c.d, Model: c.model, Mode: c.mode}
		switch c.field {
		case "federated.fraction":
			spec.Federated = &pb.FederatedSpec{Clients: 2000, Fraction: 1}
		case "partition.type":
			spec.Partition = &pb.PartitionSpec{Type: "dirichlet"}
		}
		_, err := Normalize(spec, nil)
		fe, ok := err.(*FieldError)
		if !ok || fe.Field != c.field {
			t.Errorf("%s: %v; want a FieldError on %s", c.name, err, c.field)
		}
	}
}

// TestResolveShape: the submitting client fills the shape from the data
// (ImageFolder folders, CIFAR-100 granularity), and a spec so resolved
// normalises; other data sets are left alone.
func TestResolveShape(t *testing.T) {
	dir := t.TempDir()
	if err := data.WriteColorSet(dir, 10, 5, 1); err != nil {
		t.Fatal(err)
	}
	for gran, want := range map[string]int32{"": 100, "fine": 100, "coarse": 20} {
		s := &pb.JobSpec{Model: "resnet8", Dataset: &pb.DatasetSpec{Name: "cifar100", DataDir: dir, LabelGranularity: gran}}
		if err := ResolveShape(context.Background(), s, ""); err != nil {
			t.Fatal(err)
		}
		if sh := s.Dataset.Shape; sh.Classes != want || sh.Channels != 3 || sh.Height != 32 || len(sh.ClassNames) != int(want) {
			t.Errorf("granularity %q: shape %v, want 3×32×32 with %d named classes", gran, sh, want)
		}
		if _, err := Normalize(s, nil); err != nil {
			t.Errorf("granularity %q: %v", gran, err)
		}
	}
	folder := t.TempDir()
	pix := make([]uint8, 3*5*14)
	if err := data.WriteImageFolder(context.Background(), folder, "train", pix, []uint8{0, 1, 2}, 3, 1, 5, 14, 3); err != nil {
		t.Fatal(err)
	}
	if err := data.WriteImageFolder(context.Background(), folder, "val", pix[:70], []uint8{1}, 1, 1, 5, 14, 3); err != nil {
		t.Fatal(err)
	}
	s := &pb.JobSpec{Model: "mlp", Dataset: &pb.DatasetSpec{Name: "imagefolder", Channels: 1}}
	if err := ResolveShape(context.Background(), s, folder); err != nil {
		t.Fatal(err)
	}
	if sh := s.Dataset.Shape; sh.Channels != 1 || sh.Height != 5 || sh.Width != 14 || sh.Classes != 3 || sh.MultiLabel {
		t.Errorf("imagefolder shape %v, want 1×5×14 with 3 classes", sh)
	}
	s = &pb.JobSpec{Dataset: &pb.DatasetSpec{Name: "imagefolder", ImageSize: []int32{4, 4}}}
	if err := ResolveShape(context.Background(), s, folder); err != nil {
		t.Fatal(err)
	}
	if sh := s.Dataset.Shape; sh.Channels != 3 || sh.Height != 4 || sh.Width != 4 {
		t.Errorf("imagefolder with image_size [4, 4] and default channels: shape %v, want 3×4×4", sh)
	}
	if err := CheckShape(s.Dataset, &pb.DataShape{Channels: 3, Height: 4, Width: 5, Classes: 3}); err == nil || !strings.Contains(err.Error(), "3×4×5") {
		t.Errorf("CheckShape of another width: %v", err)
	}
	if err := CheckShape(s.Dataset, proto.Clone(s.Dataset.Shape).(*pb.DataShape)); err != nil {
		t.Errorf("CheckShape of the same shape: %v", err)
	}
	m := &pb.JobSpec{Dataset: &pb.DatasetSpec{Name: "mnist"}}
	if err := ResolveShape(context.Background(), m, ""); err != nil || m.Dataset.Shape != nil {
		t.Errorf("mnist: %v, shape %v; want nothing done", err, m.Dataset.Shape)
	}
	missing := &pb.JobSpec{Dataset: &pb.DatasetSpec{Name: "cifar10", DataDir: filepath.Join(dir, "nope")}}
	if err := ResolveShape(context.Background(), missing, ""); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("missing folder: %v; want an error naming it", err)
	}
}

// TestParseDatasetFields: a YAML job file knows the new fields, and an
// unknown field is still refused.
func TestParseDatasetFields(t *testing.T) {
	s, err := Parse([]byte("dataset:\n  name: imagefolder\n  data_dir: /d\n  image_size: [64, 48]\n  channels: 1\n  mean: [0.5]\n  std: [0.25]\n  cache_mb: 0\n  augment: crop-flip\n  jitter_hue: 0.1\n"))
	if err != nil {
		t.Fatal(err)
	}
	d := s.Dataset
	if len(d.ImageSize) != 2 || d.ImageSize[0] != 64 || d.Channels != 1 || d.Mean[0] != 0.5 || d.CacheMb == nil || d.GetCacheMb() != 0 || d.JitterHue != 0.1 {
		t.Errorf("parsed %v", d)
	}
	if _, err := Parse([]byte("dataset:\n  name: cifar100\n  granularity: coarse\n")); err == nil {
		t.Error("unknown field dataset.granularity accepted")
	}
	if _, err := Parse([]byte("dataset:\n  labelGranularity: coarse\n  shape: {channels: 3, height: 32, width: 32, classes: 20}\n")); err != nil {
		t.Errorf("JSON names: %v", err)
	}
}

func isFieldError(err error, field string) bool {
	fe, ok := err.(*FieldError)
	return ok && fe.Field == field
}
