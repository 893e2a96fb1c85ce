package data

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
)

// Stats are the per-channel pixel statistics of a data set's training
// split, on the [0, 1] scale (p/255): what normalisation subtracts and
// divides by, as torchvision's Normalize(mean, std).
type Stats struct {
	// N is the number of images they were computed over.
	N int `json:"n"`
	// Mean and Std have one entry per channel (R, G, B or one gray); Std is
	// the population standard deviation, 1 for a constant channel.
	Mean []float64 `json:"mean"`
	Std  []float64 `json:"std"`
	// OverallMean and OverallStd pool every channel's pixels: the one Mean
	// and Std a [Dataset] holds (see [Materialize]).
	OverallMean float64 `json:"overall_mean"`
	OverallStd  float64 `json:"overall_std"`
}

// statsBatch is the loader batch used to read a split for its statistics.
const statsBatch = 64

// ChannelStats reads every image of src (the training split) with a loader
// of the given number of workers (0: GOMAXPROCS) and returns its
// per-channel mean and standard deviation. The sums are exact integers, so
// the result does not depend on the order or the pool size. For one
// channel it is exactly the statistics [Load] uses for the IDX sets.
func ChannelStats(ctx context.Context, src Pixels, workers int) (Stats, error) {
	in := src.Info()
	order := make([]int, in.N)
	for i := range order {
		order[i] = i
	}
	l, err := NewLoader(ctx, src, order, LoaderConfig{Batch: statsBatch, Workers: workers})
	if err != nil {
		return Stats{}, err
	}
	defer l.Close()
	plane := in.H * in.W
	// ≤ 2^64 / 255² ≈ 2.8·10^14 pixels per channel before overflow.
	sum, ss := make([]uint64, in.C), make([]uint64, in.C)
	for {
		b, err := l.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			return Stats{}, err
		}
		for j := range b.Indices {
			img := b.Pix[j*in.ImageSize() : (j+1)*in.ImageSize()]
			for c := range in.C {
				var s, q uint64
				for _, p := range img[c*plane : (c+1)*plane] {
					v := uint64(p)
					s += v
					q += v * v
				}
				sum[c] += s
				ss[c] += q
			}
		}
	}
	st := Stats{N: in.N, Mean: make([]float64, in.C), Std: make([]float64, in.C)}
	var all, allSq uint64
	for c := range in.C {
		st.Mean[c], st.Std[c] = momentStats(sum[c], ss[c], float64(in.N*plane))
		all += sum[c]
		allSq += ss[c]
	}
	st.OverallMean, st.OverallStd = momentStats(all, allSq, float64(in.N*in.ImageSize()))
	return st, nil
}

// momentStats turns exact sums of p and p² over n pixels into the mean and
// standard deviation on the [0, 1] scale, with the formula (and the
// constant-image guard) of pixelStats in dataset.go, which the IDX loaders
// use; a test keeps the two equal.
func momentStats(sum, ss uint64, n float64) (mean, std float64) {
	if n == 0 {
		return 0, 1
	}
	m := float64(sum) / n
	variance := max(float64(ss)/n-m*m, 0)
	mean, std = m/255, math.Sqrt(variance)/255
	if std < 1e-6 {
		std = 1
	}
	return mean, std
}

// StatsCacheFile is the conventional name of the statistics cache beside a
// data set: filepath.Join(dir, StatsCacheFile).
const StatsCacheFile = "gradsync-stats.json"

// ErrStatsNotSaved is wrapped by the error [CachedChannelStats] returns
// together with valid statistics when it could not write its cache (a
// read-only data folder, say); callers may log it and go on.
var ErrStatsNotSaved = errors.New("channel statistics computed but not cached")

// maxStatsEntries bounds the cache file: one entry per fingerprint (file
// list × decoded shape), the most recent first.
const maxStatsEntries = 16

type statsEntry struct {
	Fingerprint string `json:"fingerprint"`
	Stats
}

type statsFile struct {
	Version int          `json:"version"`
	Entries []statsEntry `json:"entries"`
}

// Fingerprinted sources can say when their files change: [ImageFolder],
// [MultiLabelFolder] and [CIFAR] are.
type Fingerprinted interface {
	Pixels
	// Fingerprint changes whenever the source's files (names, sizes) or
	// decoded shape do.
	Fingerprint() string
}

// CachedChannelStats returns src's [ChannelStats], from the JSON cache at
// path when it holds an entry for src's current fingerprint, else computed
// and written there (atomically: a temporary file renamed over it), keeping
// entries for other fingerprints. An unreadable or corrupt cache is
// recomputed. If the cache cannot be written the statistics are returned
// with an error wrapping [ErrStatsNotSaved].
func CachedChannelStats(ctx context.Context, src Fingerprinted, path string, workers int) (Stats, error) {
	fp := src.Fingerprint()
	var file statsFile
	if b, err := os.ReadFile(path); err == nil && json.Unmarshal(b, &file) == nil && file.Version == 1 {
		for _, e := range file.Entries {
			if e.Fingerprint == fp && e.N == src.Info().N && len(e.Mean) == src.Info().C && len(e.Std) == src.Info().C {
				return e.Stats, nil
			}
		}
	} else {
		file = statsFile{}
	}
	st, err := ChannelStats(ctx, src, workers)
	if err != nil {
		return Stats{}, err
	}
	file.Version = 1
	file.Entries = slices.DeleteFunc(file.Entries, func(e statsEntry) bool { return e.Fingerprint == fp })
	file.Entries = append([]statsEntry{{Fingerprint: fp, Stats: st}}, file.Entries...)
	file.Entries = file.Entries[:min(len(file.Entries), maxStatsEntries)]
	if err := writeJSONAtomic(path, file); err != nil {
		return st, fmt.Errorf("data: %w: %w", ErrStatsNotSaved, err)
	}
	return st, nil
}

func writeJSONAtomic(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(append(b, '\n'))
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return nil
}

// maxMaterializeBytes bounds the pixels Materialize holds (as IDX files
// are bounded): larger sets should be streamed with a [Loader].
const maxMaterializeBytes = MaxIDXBytes

// Materialize reads every image of src into an in-memory [Dataset],
// standardised as (p/255 − mean)/std through the same 256-entry table the
// IDX loaders use, so that a source holding an IDX set's pixels gives a
// bit-identical Dataset. It is the bridge from sources to the in-memory
// training code (federated clients), and so has that code's limit, a clear
// error: at most 1 GiB of pixels. mean and std have one entry, or C entries; when
// those differ the channels are standardised separately through a
// [Normalizer] and the Dataset records them in ChannelMean and ChannelStd.
// Pass the training split's statistics for both splits. src is a [Source]
// (the Dataset has Labels) or a [MultiSource] (it has LabelSets).
func Materialize(ctx context.Context, src Pixels, mean, std []float64, workers int) (*Dataset, error) {
	in := src.Info()
	_, single := src.(Source)
	_, multi := src.(MultiSource)
	switch {
	case !single && !multi:
		return nil, fmt.Errorf("data: Materialize %s: a %T carries no labels (want a Source or a MultiSource)", in.Name, src)
	case len(mean) != len(std) || (len(mean) != 1 && len(mean) != in.C):
		return nil, fmt.Errorf("data: Materialize %s: %d means and %d standard deviations for %d channels: want 1 or %d of each", in.Name, len(mean), len(std), in.C, in.C)
	case int64(in.N)*int64(in.ImageSize()) > maxMaterializeBytes:
		return nil, fmt.Errorf("data: Materialize %s: %d images of %d bytes exceed %d bytes in memory; stream it with a Loader", in.Name, in.N, in.ImageSize(), maxMaterializeBytes)
	}
	var norm *Normalizer
	for c := 1; c < len(mean); c++ {
		if mean[c] != mean[0] || std[c] != std[0] {
			var err error
			if norm, err = NewNormalizer(in, mean, std); err != nil {
				return nil, err
			}
			break
		}
	}
	if std[0] <= 0 || math.IsNaN(std[0]) || math.IsInf(std[0], 0) || math.IsNaN(mean[0]) || math.IsInf(mean[0], 0) {
		return nil, fmt.Errorf("data: Materialize %s: mean %v and std %v: want finite values and std > 0", in.Name, mean[0], std[0])
	}
	order := make([]int, in.N)
	for i := range order {
		order[i] = i
	}
	l, err := NewLoader(ctx, src, order, LoaderConfig{Batch: statsBatch, Workers: workers})
	if err != nil {
		return nil, err
	}
	defer l.Close()
	pix := make([]uint8, 0, in.N*in.ImageSize())
	labels := make([]int32, 0, in.N)
	for {
		b, err := l.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		pix = append(pix, b.Pix...)
		labels = append(labels, b.Labels...)
	}
	var images []float32
	if norm != nil {
		images = make([]float32, len(pix))
		norm.Apply(images, pix)
	} else {
		images = standardise(pix, mean[0], std[0])
	}
	d := &Dataset{
		Name:    in.Name,
		Images:  images,
		Labels:  labels,
		N:       in.N,
		C:       in.C,
		H:       in.H,
		W:       in.W,
		Classes: in.Classes,
		Mean:    float32(mean[0]),
		Std:     float32(std[0]),
	}
	if norm != nil {
		d.ChannelMean, d.ChannelStd = slices.Clone(mean), slices.Clone(std)
	}
	if ms, ok := src.(MultiSource); ok {
		d.Labels, d.LabelSets = nil, make([][]int32, in.N)
		for i := range d.LabelSets {
			d.LabelSets[i] = ms.LabelSet(i)
		}
	}
	return d, nil
}
