package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"

	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/internal/eval"
	"github.com/gradsync/gradsync/jobspec"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// streamAugmentPad is the random-crop padding of the streamed sets'
// "crop" augmentation: torchvision's CIFAR recipe, RandomCrop(32,
// padding=4). (The 28×28 IDX sets keep padding 2.)
const streamAugmentPad = 4

// streamed is a task's streamed data set (imagefolder, cifar10, cifar100):
// its two splits, decoded on demand by a [data.Loader] per epoch (and one
// per evaluation) with prefetch and a bounded [data.ImageCache], and
// normalised per channel. It implements the objective interface for
// single-label (softmax cross-entropy) and multi-label (BCE-with-logits,
// labels.csv) sets.
//
// The Trainer announces each epoch's order with startEpoch; batch then
// takes the loader's batches in that order (the Trainer's micro-batches of
// the order, as forwardBackward cuts them) and checks that they are.
// It is used by the task's one goroutine.
type streamed struct {
	srcs        *data.Sources
	info        data.Info // of the training split
	test        data.Info
	norm        *data.Normalizer
	mean, std   []float64 // what norm applies
	fill        []float32 // per channel: the normalised value of a black pixel
	aug         *data.Augmenter
	jitter      *data.ColorJitter // nil: off
	jitterBuf   []float32         // one image on the [0, 1] scale
	trainCache  *data.ImageCache
	testCache   *data.ImageCache
	multi       bool
	classes     int
	posWeight   []float32 // multi-label: (N−P)/P per class, as torch's pos_weight
	workers     int       // decoding goroutines per loader (0: GOMAXPROCS)
	ctx         context.Context
	loader      *data.Loader // this epoch's; nil between epochs
	loaderTotal data.LoaderStats

	yc []int32   // single-label targets of the last batch
	ym []float32 // multi-label targets of the last batch
}

// openStreamed opens a streamed data set for a task, checks it against
// the spec's resolved shape, and gets its per-channel statistics (the
// spec's, else computed once and cached beside the data).
func openStreamed(ctx context.Context, spec *pb.JobSpec, dir string, log *slog.Logger) (_ *streamed, err error) {
	ds := spec.GetDataset()
	opt := jobspec.SourceOptions(ds, dir)
	srcs, err := data.OpenSources(ctx, opt)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			srcs.Close()
		}
	}()
	if err := jobspec.CheckShape(ds, jobspec.ShapeOf(srcs)); err != nil {
		return nil, err
	}
	s := &streamed{srcs: srcs, info: srcs.Train.Info(), test: srcs.Test.Info(), multi: srcs.MultiLabel, ctx: ctx}
	s.classes = s.info.Classes
	mean, std := ds.GetMean(), ds.GetStd()
	if len(mean) == 0 {
		fp, ok := srcs.Train.(data.Fingerprinted)
		if !ok {
			return nil, fmt.Errorf("dataset %s: its training split cannot be fingerprinted for the statistics cache", ds.GetName())
		}
		st, err := data.CachedChannelStats(ctx, fp, filepath.Join(opt.Dir, data.StatsCacheFile), 0)
		if errors.Is(err, data.ErrStatsNotSaved) {
			log.Warn("channel statistics not cached beside the data", "err", err)
		} else if err != nil {
			return nil, err
		}
		mean, std = st.Mean, st.Std
	}
	s.mean, s.std = mean, std
	if s.norm, err = data.NewNormalizer(s.info, mean, std); err != nil {
		return nil, err
	}
	s.fill = make([]float32, s.info.C)
	black := make([]uint8, s.info.ImageSize())
	one := make([]float32, len(black))
	s.norm.Apply(one, black)
	for c := range s.fill {
		s.fill[c] = one[c*s.info.H*s.info.W]
	}
	if a := ds.GetAugment(); a == "crop" || a == "crop-flip" {
		s.aug = &data.Augmenter{Pad: streamAugmentPad, Flip: a == "crop-flip", Seed: spec.GetSeed()}
	}
	if j := (data.ColorJitter{Brightness: ds.GetJitterBrightness(), Contrast: ds.GetJitterContrast(),
		Saturation: ds.GetJitterSaturation(), Hue: ds.GetJitterHue(), Seed: spec.GetSeed()}); j.Enabled() {
		s.jitter, s.jitterBuf = &j, make([]float32, s.info.ImageSize())
	}
	limit := int64(jobspec.DefaultCacheMB) << 20
	if ds.CacheMb != nil {
		limit = int64(ds.GetCacheMb()) << 20
	}
	trainBytes := int64(s.info.N) * int64(s.info.ImageSize())
	testBytes := int64(s.test.N) * int64(s.test.ImageSize())
	testLimit := limit * testBytes / max(trainBytes+testBytes, 1)
	if limit > 0 {
		s.trainCache = data.NewImageCache(srcs.Train, limit-testLimit)
		s.testCache = data.NewImageCache(srcs.Test, testLimit)
	}
	if s.multi {
		if err := s.multiLabelWeights(); err != nil {
			return nil, err
		}
	}
	log.Info("data opened", "dataset", ds.GetName(), "train", s.info.N, "test", s.test.N,
		"shape", fmt.Sprintf("%d×%d×%d", s.info.C, s.info.H, s.info.W), "classes", s.classes, "multi_label", s.multi,
		"mean", mean, "std", std, "cache_bytes", limit, "fits_cache", trainBytes+testBytes <= limit)
	return s, nil
}

func (s *streamed) multiLabelWeights() error {
	ms, ok := s.srcs.Train.(data.MultiSource)
	if !ok {
		return errors.New("multi-label data set without label sets")
	}
	pos := make([]int, s.classes)
	for i := range s.info.N {
		for _, c := range ms.LabelSet(i) {
			pos[c]++
		}
	}
	s.posWeight = make([]float32, s.classes)
	for c, p := range pos {
		s.posWeight[c] = 1
		if p > 0 {
			s.posWeight[c] = float32(s.info.N-p) / float32(p)
		}
	}
	return nil
}

// close stops the epoch's loader and closes the files.
func (s *streamed) close() error {
	s.endEpoch()
	return s.srcs.Close()
}

func (s *streamed) shape() models.Options {
	return models.Options{Channels: s.info.C, Height: s.info.H, Width: s.info.W, Classes: s.classes}
}

func (s *streamed) trainLen() int { return s.info.N }

// startEpoch starts the loader of this rank's order for an epoch, in
// batches of micro examples.
func (s *streamed) startEpoch(ctx context.Context, order []int, micro int) error {
	s.endEpoch()
	l, err := data.NewLoader(ctx, s.srcs.Train, order, data.LoaderConfig{Batch: micro, Workers: s.workers, Cache: s.trainCache})
	if err != nil {
		return err
	}
	s.loader = l
	return nil
}

// endEpoch stops the epoch's loader, adding its figures to the totals.
func (s *streamed) endEpoch() {
	if s.loader == nil {
		return
	}
	s.loader.Close()
	st := s.loader.Stats()
	s.loaderTotal.Images += st.Images
	s.loaderTotal.Decoded += st.Decoded
	s.loaderTotal.CacheHits += st.CacheHits
	s.loaderTotal.Busy += st.Busy
	s.loaderTotal.Workers = st.Workers
	s.loader = nil
}

// loaderStats are the training loaders' figures so far, this epoch's
// included.
func (s *streamed) loaderStats() data.LoaderStats {
	t := s.loaderTotal
	if s.loader != nil {
		st := s.loader.Stats()
		t.Images += st.Images
		t.Decoded += st.Decoded
		t.CacheHits += st.CacheHits
		t.Busy += st.Busy
		t.Workers = st.Workers
	}
	return t
}

func (s *streamed) batch(indices []int, x []float32, epoch int) error {
	if s.loader == nil {
		return errors.New("streamed data: a batch was asked for outside an epoch")
	}
	b, err := s.loader.Next(s.ctx)
	if err == io.EOF {
		return fmt.Errorf("streamed data: the epoch's order ran out before indices %v", indices[:min(len(indices), 4)])
	}
	if err != nil {
		return err
	}
	if !slices.Equal(b.Indices, indices) {
		return fmt.Errorf("streamed data: the loader's batch (%d examples from %d) is not the step's (%d from %d)",
			len(b.Indices), b.Indices[0], len(indices), indices[0])
	}
	s.fillInputs(x, b, s.srcs.Train, indices, epoch, true)
	return nil
}

// fillInputs normalises b's pixels into x, augments them (training), and
// keeps their targets.
func (s *streamed) fillInputs(x []float32, b *data.Batch, src data.Pixels, indices []int, epoch int, train bool) {
	n := len(indices)
	in := s.info
	if train && s.jitter != nil {
		sz := in.ImageSize()
		for j := range n {
			s.jitter.Apply(s.jitterBuf, b.Pix[j*sz:(j+1)*sz], in.C, in.H, in.W, epoch, indices[j])
			s.norm.ApplyScaled(x[j*sz:(j+1)*sz], s.jitterBuf)
		}
	} else {
		s.norm.Apply(x, b.Pix)
	}
	if train && s.aug != nil {
		sz, plane := in.ImageSize(), in.H*in.W
		for j := range n {
			for c := range in.C {
				o := j*sz + c*plane
				s.aug.Apply(x[o:o+plane], 1, 1, in.H, in.W, indices[j:j+1], epoch, s.fill[c])
			}
		}
	}
	if !s.multi {
		s.yc = slices.Grow(s.yc[:0], n)[:n]
		copy(s.yc, b.Labels)
		return
	}
	ms := src.(data.MultiSource)
	s.ym = slices.Grow(s.ym[:0], n*s.classes)[:n*s.classes]
	clear(s.ym)
	for j, i := range indices {
		for _, c := range ms.LabelSet(i) {
			s.ym[j*s.classes+int(c)] = 1
		}
	}
}

func (s *streamed) loss(logits []float32, n int, dlogits []float32) float32 {
	if s.multi {
		return models.BCEWithLogits(logits, s.ym[:n*s.classes], s.posWeight, dlogits)
	}
	return models.SoftmaxCrossEntropy(logits, s.yc[:n], s.classes, dlogits)
}

// evaluate runs net over the test split, streamed in file order.
func (s *streamed) evaluate(ctx context.Context, net forwarder, res *pb.JobResult) error {
	order := make([]int, s.test.N)
	for i := range order {
		order[i] = i
	}
	l, err := data.NewLoader(ctx, s.srcs.Test, order, data.LoaderConfig{Batch: evalBatch, Workers: s.workers, Cache: s.testCache})
	if err != nil {
		return err
	}
	defer l.Close()
	inSize := net.InputSize()
	x := make([]float32, evalBatch*inSize)
	var conf *eval.Confusion
	var ml *eval.MultiLabel
	pred := make([]int, evalBatch)
	if s.multi {
		ml = eval.NewMultiLabel(s.classes)
	} else {
		conf = eval.NewConfusion(s.classes)
	}
	var lossSum float64
	for {
		b, err := l.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		k := len(b.Indices)
		s.fillInputs(x[:k*inSize], b, s.srcs.Test, b.Indices, 0, false)
		logits := net.Forward(x[:k*inSize], k, false)
		if s.multi {
			y := s.ym[:k*s.classes]
			lossSum += float64(models.BCEWithLogits(logits, y, nil, nil)) * float64(k)
			ml.Add(logits, y)
			continue
		}
		lossSum += float64(models.SoftmaxCrossEntropy(logits, s.yc[:k], s.classes, nil)) * float64(k)
		eval.Argmax(logits, s.classes, pred[:k])
		conf.AddPredictionsWide(pred[:k], s.yc[:k])
	}
	res.TestLoss = lossSum / float64(max(s.test.N, 1))
	if s.multi {
		res.TestAccuracy = ml.SubsetAccuracy()
		res.MicroF1, res.MacroF1, res.MeanAveragePrecision = ml.MicroF1(), ml.MacroF1(), ml.MAP()
		return nil
	}
	fillConfusion(res, conf)
	return nil
}

// fillConfusion puts a confusion matrix's figures in res.
func fillConfusion(res *pb.JobResult, conf *eval.Confusion) {
	res.TestAccuracy = conf.Accuracy()
	res.ConfusionMatrix = res.ConfusionMatrix[:0]
	if conf.Classes() > jobspec.MaxClassAccuracyClasses {
		res.ClassAccuracy = res.ClassAccuracy[:0]
		return // too many for a message: the test accuracy only
	}
	res.ClassAccuracy = conf.ClassAccuracy(res.ClassAccuracy[:0])
	for i, v := range res.ClassAccuracy {
		if v != v { // no test example of this class
			res.ClassAccuracy[i] = 0
		}
	}
	if conf.Classes() > jobspec.MaxConfusionClasses {
		return // too large for a message: the class accuracies only
	}
	for _, row := range conf.Matrix() {
		res.ConfusionMatrix = append(res.ConfusionMatrix, row...)
	}
}

// materializeStreamed reads a streamed data set's two splits into memory
// for a fedavg task (the federated clients and partitioners take
// in-memory Datasets, single- or multi-label), normalised per channel as
// openStreamed normalises them.
func materializeStreamed(ctx context.Context, spec *pb.JobSpec, dir string, log *slog.Logger) (train, test *data.Dataset, err error) {
	s, err := openStreamed(ctx, spec, dir, log)
	if err != nil {
		return nil, nil, err
	}
	defer s.close()
	if train, err = data.Materialize(ctx, s.srcs.Train, s.mean, s.std, s.workers); err != nil {
		return nil, nil, err
	}
	if test, err = data.Materialize(ctx, s.srcs.Test, s.mean, s.std, s.workers); err != nil {
		return nil, nil, err
	}
	return train, test, nil
}

// loaderRate turns the loader totals at two times into images per second
// of pool capacity over the interval (see [data.LoaderStats.Capacity]).
func loaderRate(from, to data.LoaderStats) float64 {
	d := data.LoaderStats{Decoded: to.Decoded - from.Decoded, CacheHits: to.CacheHits - from.CacheHits,
		Busy: to.Busy - from.Busy, Workers: to.Workers}
	return d.Capacity()
}
