package data

import (
	"fmt"
	"math"
	"runtime"
	"sync"
)

// Dataset is one split (train or test) of an image classification data set,
// held in memory.
//
// Data sets returned by [Load] are cached and shared by every caller in the
// process: treat them as read-only.
type Dataset struct {
	Name string
	// Images is (N, C, H, W) row-major: image i is
	// Images[i*C*H*W : (i+1)*C*H*W]. Pixels are standardised,
	// (p/255 − Mean) / Std.
	Images []float32
	// Labels has N entries, each in [0, Classes), for a single-label set;
	// nil for a multi-label one.
	Labels []int32
	// LabelSets is set instead of Labels for a multi-label set: example
	// i's classes, increasing, without duplicates, possibly none (shared:
	// not to be modified).
	LabelSets  [][]int32
	N, C, H, W int
	Classes    int
	// Mean and Std are the training split's pixel mean and standard
	// deviation on the [0, 1] scale (p/255); both splits are standardised
	// with them.
	Mean, Std float32
	// ChannelMean and ChannelStd are set instead when the channels were
	// standardised separately ([Materialize] with per-channel statistics):
	// channel c is (p/255 − ChannelMean[c]) / ChannelStd[c]. Mean and Std
	// then hold channel 0's values.
	ChannelMean, ChannelStd []float64
}

// Len returns the number of examples.
func (d *Dataset) Len() int { return d.N }

// ImageSize returns the number of values per image, C*H*W.
func (d *Dataset) ImageSize() int { return d.C * d.H * d.W }

// Image returns example i's image, (C, H, W) row-major. It is a view into
// d.Images, not a copy.
func (d *Dataset) Image(i int) []float32 {
	sz := d.ImageSize()
	return d.Images[i*sz : (i+1)*sz : (i+1)*sz]
}

// Batch copies the examples at indices into caller-owned buffers:
// dstX is (len(indices), C, H, W) row-major and dstY has len(indices)
// entries. It allocates nothing. Buffers of the wrong size and indices out of
// range are bugs in the caller and panic.
func (d *Dataset) Batch(indices []int, dstX []float32, dstY []int32) {
	sz := d.ImageSize()
	if len(dstX) != len(indices)*sz || len(dstY) != len(indices) {
		panic(fmt.Sprintf("data: Batch: %d indices need dstX of %d and dstY of %d, got %d and %d",
			len(indices), len(indices)*sz, len(indices), len(dstX), len(dstY)))
	}
	for j, i := range indices {
		if i < 0 || i >= d.N {
			panic(fmt.Sprintf("data: Batch: index %d out of range [0, %d)", i, d.N))
		}
		copy(dstX[j*sz:(j+1)*sz], d.Images[i*sz:(i+1)*sz])
		dstY[j] = d.Labels[i]
	}
}

// MultiLabel reports whether the set's examples carry label sets.
func (d *Dataset) MultiLabel() bool { return d.LabelSets != nil }

// MultiHot is [Dataset.Batch] for a multi-label set: dstY is
// (len(indices), Classes), 1 for each label of the example, else 0. It
// allocates nothing; wrong buffer sizes, indices out of range and a
// single-label set are bugs in the caller and panic.
func (d *Dataset) MultiHot(indices []int, dstX, dstY []float32) {
	sz := d.ImageSize()
	if d.LabelSets == nil || len(dstX) != len(indices)*sz || len(dstY) != len(indices)*d.Classes {
		panic(fmt.Sprintf("data: MultiHot: %d indices need a multi-label set (%v), dstX of %d and dstY of %d, got %d and %d",
			len(indices), d.LabelSets != nil, len(indices)*sz, len(indices)*d.Classes, len(dstX), len(dstY)))
	}
	for j, i := range indices {
		if i < 0 || i >= d.N {
			panic(fmt.Sprintf("data: MultiHot: index %d out of range [0, %d)", i, d.N))
		}
		copy(dstX[j*sz:(j+1)*sz], d.Images[i*sz:(i+1)*sz])
		y := dstY[j*d.Classes : (j+1)*d.Classes]
		clear(y)
		for _, l := range d.LabelSets[i] {
			y[l] = 1
		}
	}
}

// LabelHistogram returns the number of examples of each class among
// d's examples idx; an example of a multi-label set counts once for each
// of its labels. An index out of range is a bug and panics.
func (d *Dataset) LabelHistogram(idx []int) []int {
	if d.LabelSets == nil {
		return Histogram(d.Labels, idx, d.Classes)
	}
	h := make([]int, d.Classes)
	for _, i := range idx {
		for _, l := range d.LabelSets[i] {
			h[l]++
		}
	}
	return h
}

// pixelStats returns the mean and population standard deviation of pix on
// the [0, 1] scale. The sums are exact integers (no histogram: incrementing
// one bin for runs of equal pixels serialises on memory).
func pixelStats(pix []uint8) (mean, std float64) {
	if len(pix) == 0 {
		return 0, 1
	}
	// ≤ 2^30 pixels × 255² < 2^46: no overflow.
	var sum, ss uint64
	for _, p := range pix {
		v := uint64(p)
		sum += v
		ss += v * v
	}
	n := float64(len(pix))
	m := float64(sum) / n
	variance := max(float64(ss)/n-m*m, 0)
	mean, std = m/255, math.Sqrt(variance)/255
	if std < 1e-6 {
		// A constant image set: keep values finite rather than divide by 0.
		std = 1
	}
	return mean, std
}

// standardise returns pix as float32 (p/255 − mean) / std through a 256-entry
// table, so every byte value maps to exactly the same float everywhere.
// Large inputs are converted in parallel chunks.
func standardise(pix []uint8, mean, std float64) []float32 {
	var lut [256]float32
	for v := range lut {
		lut[v] = float32((float64(v)/255 - mean) / std)
	}
	out := make([]float32, len(pix))
	const minChunk = 1 << 20
	parts := min(runtime.GOMAXPROCS(0), max(1, len(pix)/minChunk))
	var wg sync.WaitGroup
	for c := range parts {
		lo, hi := evenCut(len(pix), parts, c)
		wg.Go(func() {
			dst := out[lo:hi]
			for i, p := range pix[lo:hi] {
				dst[i] = lut[p]
			}
		})
	}
	wg.Wait()
	return out
}

// split is one decoded split before standardisation.
type split struct {
	pix        []uint8 // (n, c, h, w) row-major
	labels     []uint8
	n, c, h, w int
}

// newDatasets standardises both splits with train's statistics. It checks
// that the shapes agree and labels are in [0, classes).
func newDatasets(name string, classes int, train, test split) (*Dataset, *Dataset, error) {
	for _, s := range []struct {
		which string
		sp    split
	}{{"train", train}, {"test", test}} {
		if s.sp.n != len(s.sp.labels) {
			return nil, nil, fmt.Errorf("data: %s %s split: %d images but %d labels", name, s.which, s.sp.n, len(s.sp.labels))
		}
		if len(s.sp.pix) != s.sp.n*s.sp.c*s.sp.h*s.sp.w {
			panic(fmt.Sprintf("data: %s %s split: %d pixels for %d×%d×%d×%d", name, s.which, len(s.sp.pix), s.sp.n, s.sp.c, s.sp.h, s.sp.w))
		}
		for i, l := range s.sp.labels {
			if int(l) >= classes {
				return nil, nil, fmt.Errorf("data: %s %s split: label %d at index %d is out of range [0, %d)", name, s.which, l, i, classes)
			}
		}
	}
	if train.c != test.c || train.h != test.h || train.w != test.w {
		return nil, nil, fmt.Errorf("data: %s: train images are %d×%d×%d but test images are %d×%d×%d",
			name, train.c, train.h, train.w, test.c, test.h, test.w)
	}
	mean, std := pixelStats(train.pix)
	mk := func(s split) *Dataset {
		return &Dataset{
			Name:    name,
			Images:  standardise(s.pix, mean, std),
			Labels:  widenLabels(s.labels),
			N:       s.n,
			C:       s.c,
			H:       s.h,
			W:       s.w,
			Classes: classes,
			Mean:    float32(mean),
			Std:     float32(std),
		}
	}
	return mk(train), mk(test), nil
}

// widenLabels returns the IDX files' byte labels as a Dataset holds them.
func widenLabels(b []uint8) []int32 {
	out := make([]int32, len(b))
	for i, l := range b {
		out[i] = int32(l)
	}
	return out
}
