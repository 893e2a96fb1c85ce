package jobspec

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// Limits of the streamed data sets' fields.
const (
	maxImageSide = 4096
	maxJitter    = 10
	maxJitterHue = 0.5
	// MaxClasses bounds a data set's label space.
	MaxClasses = 1 << 20
	// MaxClassAccuracyClasses is the largest label space whose per-class
	// accuracies a job result carries (65,536 doubles = 512 KiB, well
	// inside a message). Above it the result has the test accuracy alone;
	// the evaluation itself takes any label space up to MaxClasses (its
	// confusion matrix is held sparse beyond eval.DenseConfusionClasses).
	MaxClassAccuracyClasses = 1 << 16
	// MaxRoundHistogramCounts bounds a federated round's label
	// histograms, participants × classes counts: every closed round's
	// record carries each participant's histogram in one message (≤ 4 MiB;
	// a count below 2^21 takes at most 3 bytes). Label spaces of up to 256
	// classes are not held to it (they never were).
	MaxRoundHistogramCounts = 1 << 19
	// MaxConfusionClasses is the largest label space whose confusion
	// matrix a job result carries (256² entries; a larger one would not
	// fit a message). Above it the result has the per-class accuracies
	// only.
	MaxConfusionClasses = 256
	// DefaultCacheMB is a worker's decoded-image cache for the streamed
	// sets when dataset.cache_mb is unset.
	DefaultCacheMB = 1024
	maxCacheMB     = 1 << 20
	// DefaultImageFolderChannels is torchvision's RGB loader's.
	DefaultImageFolderChannels = 3
)

// Streamed reports whether spec's data set is one of the streamed ones
// (imagefolder, cifar10, cifar100): opened from its folder by every
// worker, its shape resolved by the submitting client.
func Streamed(d *pb.DatasetSpec) bool {
	return slices.Contains(data.SourceNames(), d.GetName())
}

// normalizeDataset fills the dataset defaults and checks its fields and
// its resolved shape against each other.
func normalizeDataset(d *pb.DatasetSpec) error {
	if err := normalizeDatasetFields(d); err != nil {
		return err
	}
	if !Streamed(d) {
		if d.Shape == nil {
			return nil
		}
		c, h, w, k := idxShape(d.Name)
		if sh := d.Shape; sh.Channels != int32(c) || sh.Height != int32(h) || sh.Width != int32(w) || sh.Classes != int32(k) || sh.MultiLabel != (d.Name == MultiLabelMNIST) {
			return errf("dataset.shape", "%s for dataset %s, which is %s; leave it out", shapeString(sh), d.Name, shapeString(idxDataShape(d.Name)))
		}
		return nil
	}
	return checkStreamedShape(d)
}

// normalizeDatasetFields fills the defaults of the dataset's fields and
// checks them, all but the resolved shape.
func normalizeDatasetFields(d *pb.DatasetSpec) error {
	streamed := Streamed(d)
	if len(d.ImageSize) != 0 {
		if d.Name != data.ImageFolderSet {
			return errf("dataset.image_size", "applies to imagefolder only (dataset %s has a fixed size)", d.Name)
		}
		if len(d.ImageSize) != 2 {
			return errf("dataset.image_size", "has %d values; want [H, W]", len(d.ImageSize))
		}
		for _, v := range d.ImageSize {
			if v < 1 || v > maxImageSide {
				return errf("dataset.image_size", "%v out of range; each side 1..%d", d.ImageSize, maxImageSide)
			}
		}
	}
	switch {
	case d.Name == data.CIFAR100 && d.LabelGranularity == "":
		d.LabelGranularity = data.Fine.String()
	case d.Name == data.CIFAR100:
		if d.LabelGranularity != data.Fine.String() && d.LabelGranularity != data.Coarse.String() {
			return errf("dataset.label_granularity", "unknown granularity %q; allowed: fine (100 classes), coarse (20)", d.LabelGranularity)
		}
	case d.LabelGranularity != "":
		return errf("dataset.label_granularity", "applies to cifar100 only (fine: 100 classes, coarse: 20), not to %s", d.Name)
	}
	switch {
	case d.Name == data.ImageFolderSet && d.Channels == 0:
		d.Channels = DefaultImageFolderChannels
	case d.Name == data.ImageFolderSet:
		if d.Channels != 1 && d.Channels != 3 {
			return errf("dataset.channels", "%d: allowed 1 (grayscale) or 3 (RGB)", d.Channels)
		}
	case d.Channels != 0:
		return errf("dataset.channels", "applies to imagefolder only (dataset %s has a fixed channel count)", d.Name)
	}
	if len(d.Mean) != 0 || len(d.Std) != 0 {
		if !streamed {
			return errf("dataset.mean", "applies to imagefolder, cifar10 and cifar100 (dataset %s is standardised with its training split's pixel mean and std)", d.Name)
		}
		if len(d.Mean) != len(d.Std) {
			return errf("dataset.mean", "%d means but %d standard deviations; give as many of each", len(d.Mean), len(d.Std))
		}
		for c := range d.Mean {
			m, s := d.Mean[c], d.Std[c]
			if math.IsNaN(m) || math.IsInf(m, 0) || !(s > 0) || math.IsInf(s, 0) {
				return errf("dataset.std", "channel %d: mean %v, std %v: want finite values and std > 0", c, m, s)
			}
		}
	}
	for _, j := range []struct {
		field string
		v     float64
		max   float64
		why   string // how the factors are drawn, for the range error
	}{
		{"dataset.jitter_brightness", d.JitterBrightness, maxJitter, "factors are drawn from [max(0, 1 − v), 1 + v]"},
		{"dataset.jitter_contrast", d.JitterContrast, maxJitter, "factors are drawn from [max(0, 1 − v), 1 + v]"},
		{"dataset.jitter_saturation", d.JitterSaturation, maxJitter, "factors are drawn from [max(0, 1 − v), 1 + v]"},
		{"dataset.jitter_hue", d.JitterHue, maxJitterHue, "as torchvision's ColorJitter, the hue turns by a factor drawn from [−v, v] of a full turn, and half a turn either way reaches every hue"},
	} {
		if j.v == 0 {
			continue
		}
		if !streamed {
			return errf(j.field, "applies to imagefolder, cifar10 and cifar100 (colour jitter of decoded pixels), not to %s", d.Name)
		}
		if !(j.v > 0 && j.v <= j.max) {
			return errf(j.field, "%v out of range; allowed 0 (off) to %v: %s", j.v, j.max, j.why)
		}
	}
	if d.CacheMb != nil {
		if !streamed {
			return errf("dataset.cache_mb", "applies to imagefolder, cifar10 and cifar100 (dataset %s is held in memory)", d.Name)
		}
		if v := d.GetCacheMb(); v < 0 || v > maxCacheMB {
			return errf("dataset.cache_mb", "%d out of range; allowed 0 (no cache)..%d", v, maxCacheMB)
		}
	}
	return nil
}

// checkStreamedShape checks a streamed data set's resolved shape.
func checkStreamedShape(d *pb.DatasetSpec) error {
	sh := d.Shape
	if sh == nil {
		return errf("dataset.shape", "missing: dataset %s needs its shape (channels, height, width, classes), which the submitting client reads from the data — gradsync submit and gradsync local fill it from dataset.data_dir (or --data-dir); a client of its own must set it", d.Name)
	}
	if sh.Channels != 1 && sh.Channels != 3 {
		return errf("dataset.shape.channels", "%d: allowed 1 or 3", sh.Channels)
	}
	if sh.Height < 1 || sh.Height > maxImageSide || sh.Width < 1 || sh.Width > maxImageSide {
		return errf("dataset.shape", "%s: height and width must be 1..%d", shapeString(sh), maxImageSide)
	}
	if sh.Classes < 1 || sh.Classes > MaxClasses {
		return errf("dataset.shape.classes", "%d out of range; allowed 1..%d", sh.Classes, MaxClasses)
	}
	if n := len(sh.ClassNames); n != 0 && n != int(sh.Classes) {
		return errf("dataset.shape.class_names", "has %d names for %d classes", n, sh.Classes)
	}
	if sh.MultiLabel && d.Name != data.ImageFolderSet {
		return errf("dataset.shape.multi_label", "applies to imagefolder (with a labels.csv) only")
	}
	if n := len(d.Mean); n != 0 && n != 1 && n != int(sh.Channels) {
		return errf("dataset.mean", "%d values for %d channels; want 1 or %d", n, sh.Channels, sh.Channels)
	}
	switch d.Name {
	case data.ImageFolderSet:
		if sh.Channels != d.Channels {
			return errf("dataset.shape.channels", "%d, but dataset.channels is %d", sh.Channels, d.Channels)
		}
		if len(d.ImageSize) == 2 && (sh.Height != d.ImageSize[0] || sh.Width != d.ImageSize[1]) {
			return errf("dataset.shape", "%s, but dataset.image_size is %v", shapeString(sh), d.ImageSize)
		}
	case data.CIFAR10, data.CIFAR100:
		want := int32(10)
		if d.Name == data.CIFAR100 {
			want = 100
			if d.LabelGranularity == data.Coarse.String() {
				want = 20
			}
		}
		if sh.Channels != 3 || sh.Height != data.CIFARSide || sh.Width != data.CIFARSide || sh.Classes != want {
			return errf("dataset.shape", "%s, but %s %s is 3×32×32 with %d classes", shapeString(sh), d.Name, d.LabelGranularity, want)
		}
	}
	return nil
}

// checkModelShape builds the model for the data's shape, so a shape the
// architecture cannot take (an input too small for its pools, say) is
// refused at submission rather than on the workers. A layer that panics on
// an impossible geometry (the models package's shape checks are panics in
// some constructors) is turned into the same refusal.
func checkModelShape(s *pb.JobSpec) (err error) {
	c, h, w, classes := InputShape(s)
	refuse := func(why any) error {
		return errf("model", "%s cannot be built for dataset %s's %d×%d×%d inputs and %d classes: %v",
			s.Model, s.GetDataset().GetName(), c, h, w, classes, strings.TrimPrefix(fmt.Sprint(why), "models: "))
	}
	defer func() {
		if r := recover(); r != nil {
			err = refuse(r)
		}
	}()
	if _, err := models.New(s.Model, models.Options{Channels: c, Height: h, Width: w, Classes: classes, Seed: s.GetSeed()}); err != nil {
		return refuse(err)
	}
	return nil
}

func idxShape(name string) (c, h, w, classes int) {
	if name == MultiLabelMNIST {
		return 1, 28, 56, 10
	}
	return 1, 28, 28, 10
}

func idxDataShape(name string) *pb.DataShape {
	c, h, w, k := idxShape(name)
	return &pb.DataShape{Channels: int32(c), Height: int32(h), Width: int32(w), Classes: int32(k), MultiLabel: name == MultiLabelMNIST}
}

func shapeString(sh *pb.DataShape) string {
	s := fmt.Sprintf("%d×%d×%d with %d classes", sh.GetChannels(), sh.GetHeight(), sh.GetWidth(), sh.GetClasses())
	if sh.GetMultiLabel() {
		s += " (multi-label)"
	}
	return s
}

// InputShape is the model shape (channels, height, width, classes) a
// normalized spec's data set needs: its resolved dataset.shape, or the
// fixed shape of the IDX and synthetic sets (1×28×28, 10 classes;
// mnist-pairs 1×28×56).
func InputShape(spec *pb.JobSpec) (c, h, w, classes int) {
	if sh := spec.GetDataset().GetShape(); sh != nil {
		return int(sh.Channels), int(sh.Height), int(sh.Width), int(sh.Classes)
	}
	return idxShape(spec.GetDataset().GetName())
}

// SourceOptions maps a streamed data set's spec to the data package's
// options; dir, if set, overrides dataset.data_dir (a worker's
// --data-dir).
func SourceOptions(d *pb.DatasetSpec, dir string) data.SourceOptions {
	if dir == "" {
		dir = d.GetDataDir()
	}
	opt := data.SourceOptions{Name: d.GetName(), Dir: dir}
	if d.GetName() == data.ImageFolderSet {
		opt.Image.Channels = int(d.GetChannels())
		if opt.Image.Channels == 0 {
			opt.Image.Channels = DefaultImageFolderChannels
		}
		if s := d.GetImageSize(); len(s) == 2 {
			opt.Image.Transform = data.Transform{H: int(s[0]), W: int(s[1])}
		}
	}
	if d.GetLabelGranularity() == data.Coarse.String() {
		opt.Labels = data.Coarse
	}
	return opt
}

// ShapeOf is the resolved shape of opened sources.
func ShapeOf(s *data.Sources) *pb.DataShape {
	in := s.Train.Info()
	return &pb.DataShape{Channels: int32(in.C), Height: int32(in.H), Width: int32(in.W), Classes: int32(in.Classes),
		MultiLabel: s.MultiLabel, ClassNames: in.ClassNames}
}

// ResolveShape is the submitting client's half of a streamed data set: it
// opens the data (folder listing and image headers, or CIFAR's label
// bytes; no pixel is decoded when the size and channels are known) and
// fills dataset.shape, so the coordinator holds no data. dir, if set,
// overrides dataset.data_dir. Other data sets and a spec whose shape is
// already set are left as they are (Normalize checks them).
func ResolveShape(ctx context.Context, spec *pb.JobSpec, dir string) error {
	d := spec.GetDataset()
	if !Streamed(d) || d.Shape != nil {
		return nil
	}
	c := &pb.DatasetSpec{Name: d.Name, ImageSize: d.ImageSize, LabelGranularity: d.LabelGranularity, Channels: d.Channels}
	if err := normalizeDatasetFields(c); err != nil {
		return err
	}
	srcs, err := data.OpenSources(ctx, SourceOptions(c, firstNonEmpty(dir, d.DataDir)))
	if err != nil {
		return err
	}
	defer srcs.Close()
	d.Shape = ShapeOf(srcs)
	return nil
}

// CheckShape is a worker's check of its data against the spec's resolved
// shape: a mismatch (another folder, other files, another size) is an
// error naming both.
func CheckShape(d *pb.DatasetSpec, got *pb.DataShape) error {
	want := d.GetShape()
	if want.GetChannels() != got.Channels || want.GetHeight() != got.Height || want.GetWidth() != got.Width ||
		want.GetClasses() != got.Classes || want.GetMultiLabel() != got.MultiLabel {
		return fmt.Errorf("dataset %s here is %s but the job's spec says %s (resolved by the submitting client): the workers' data differs from the submitter's",
			d.GetName(), shapeString(got), shapeString(want))
	}
	if w := want.GetClassNames(); len(w) != 0 && len(got.ClassNames) != 0 && !slices.Equal(w, got.ClassNames) {
		return fmt.Errorf("dataset %s here has classes %s but the job's spec says %s: the workers' data differs from the submitter's",
			d.GetName(), strings.Join(got.ClassNames, ","), strings.Join(w, ","))
	}
	return nil
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// lowPrecisionChecked: the model may run in bf16 or fp16 (models.LowPrecisionChecked).
func lowPrecisionChecked(model string) bool { return models.LowPrecisionChecked(model) }
