package data

import (
	"errors"
	"fmt"
)

// streamMultiDigit keeps MultiDigit's draws independent of the package's
// other seeded streams.
const streamMultiDigit uint64 = 0x6d756c7469 // "multi"

// MultiLabelDataset is a multi-label task built from a single-label
// [Dataset]: example i is the two source images Pairs[i] placed side by
// side, and its label set is {label of the left, label of the right}. The
// composite images are not stored; [MultiLabelDataset.Batch] assembles
// them from Src, which it shares and must be treated as read-only.
type MultiLabelDataset struct {
	Name string
	Src  *Dataset
	// Pairs[i] holds the Src indices of example i's left and right image.
	Pairs [][2]int
	// N examples of (C, H, W) = (Src.C, Src.H, 2·Src.W), targets over
	// Classes = Src.Classes.
	N, C, H, W int
	Classes    int
}

// MultiDigit returns n examples of two images of src side by side: each a
// C×H×2W image (1×28×56 for MNIST) whose left and right halves are two
// independently, uniformly drawn src examples, unscaled. Its target is the
// multi-hot set of their two labels, so with 10 classes one example in ten
// (when the labels are balanced) shows the same digit twice and has a
// single label. Pixels keep src's standardisation (the halves are src
// images as stored, so the composite has src's mean and deviation);
// [Dataset.ZeroPixel] of src is the padding value for augmentation.
//
// Side by side at full resolution was chosen over two digits squeezed into
// 28×28: no resampling, and each half is exactly a source image. Models
// therefore need Options{Height: H, Width: 2W} (28×56). Draw the train and
// test tasks from the train and test splits, with different seeds, so no
// test image was seen in training. The same (src, n, seed) gives the same
// pairs on every platform.
func MultiDigit(src *Dataset, n int, seed int64) (*MultiLabelDataset, error) {
	if src == nil || src.N < 1 {
		return nil, errors.New("data: MultiDigit: empty source data set")
	}
	if n < 0 {
		return nil, fmt.Errorf("data: MultiDigit: n = %d, must be ≥ 0", n)
	}
	r := newRNG(seed, streamMultiDigit)
	pairs := make([][2]int, n)
	for i := range pairs {
		pairs[i] = [2]int{r.intn(src.N), r.intn(src.N)}
	}
	return &MultiLabelDataset{
		Name:    src.Name + "-multidigit",
		Src:     src,
		Pairs:   pairs,
		N:       n,
		C:       src.C,
		H:       src.H,
		W:       2 * src.W,
		Classes: src.Classes,
	}, nil
}

// Len returns the number of examples.
func (m *MultiLabelDataset) Len() int { return m.N }

// ImageSize returns the number of values per image, C*H*W.
func (m *MultiLabelDataset) ImageSize() int { return m.C * m.H * m.W }

// Labels returns the labels of example i's left and right image.
func (m *MultiLabelDataset) Labels(i int) (left, right int32) {
	p := m.Pairs[i]
	return m.Src.Labels[p[0]], m.Src.Labels[p[1]]
}

// PositiveCounts returns, per class, how many examples carry that label:
// the P of BCEWithLogits' usual pos_weight (N − P)/P.
func (m *MultiLabelDataset) PositiveCounts() []int {
	counts := make([]int, m.Classes)
	for i := range m.N {
		a, b := m.Labels(i)
		counts[a]++
		if b != a {
			counts[b]++
		}
	}
	return counts
}

// Batch assembles the examples at indices into caller-owned buffers: dstX
// is (len(indices), C, H, W) row-major and dstY is (len(indices), Classes)
// multi-hot (1 for each label of the example, else 0). Both are
// overwritten. It allocates nothing. Buffers of the wrong size and indices
// out of range are bugs in the caller and panic.
func (m *MultiLabelDataset) Batch(indices []int, dstX []float32, dstY []float32) {
	sz := m.ImageSize()
	if len(dstX) != len(indices)*sz || len(dstY) != len(indices)*m.Classes {
		panic(fmt.Sprintf("data: MultiLabelDataset.Batch: %d indices need dstX of %d and dstY of %d, got %d and %d",
			len(indices), len(indices)*sz, len(indices)*m.Classes, len(dstX), len(dstY)))
	}
	sw := m.Src.W
	for j, i := range indices {
		if i < 0 || i >= m.N {
			panic(fmt.Sprintf("data: MultiLabelDataset.Batch: index %d out of range [0, %d)", i, m.N))
		}
		p := m.Pairs[i]
		left, right := m.Src.Image(p[0]), m.Src.Image(p[1])
		img := dstX[j*sz : (j+1)*sz]
		// Row r of channel c of the composite is that row of left then
		// of right: (c·H + y) indexes rows in all three.
		for row := range m.C * m.H {
			copy(img[row*m.W:row*m.W+sw], left[row*sw:(row+1)*sw])
			copy(img[row*m.W+sw:(row+1)*m.W], right[row*sw:(row+1)*sw])
		}
		y := dstY[j*m.Classes : (j+1)*m.Classes]
		clear(y)
		y[m.Src.Labels[p[0]]] = 1
		y[m.Src.Labels[p[1]]] = 1
	}
}
