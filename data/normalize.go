package data

import (
	"fmt"
	"math"
)

// Normalizer turns decoded bytes into model input: (p/255 − mean[c]) /
// std[c] for each pixel of channel c, torchvision's ToTensor + Normalize,
// through one 256-entry table per channel — the same table the IDX
// loaders use, so that one channel normalises bit-identically to a
// [Dataset] standardised with the same mean and std. It is immutable and
// safe for concurrent use.
type Normalizer struct {
	c, plane  int
	lut       [][256]float32
	mean, std []float64 // per channel
}

// NewNormalizer returns the normalizer for images of in's shape with the
// given per-channel statistics (one entry per channel, or one for all;
// usually [Stats] of the training split).
func NewNormalizer(in Info, mean, std []float64) (*Normalizer, error) {
	if len(mean) != len(std) || (len(mean) != 1 && len(mean) != in.C) {
		return nil, fmt.Errorf("data: normalizer for %s: %d means and %d standard deviations for %d channels: want 1 or %d of each", in.Name, len(mean), len(std), in.C, in.C)
	}
	n := &Normalizer{c: in.C, plane: in.H * in.W, lut: make([][256]float32, in.C), mean: make([]float64, in.C), std: make([]float64, in.C)}
	for c := range in.C {
		m, s := mean[min(c, len(mean)-1)], std[min(c, len(std)-1)]
		if !(s > 0) || math.IsInf(s, 0) || math.IsNaN(m) || math.IsInf(m, 0) {
			return nil, fmt.Errorf("data: normalizer for %s: channel %d has mean %v, std %v: want finite values and std > 0", in.Name, c, m, s)
		}
		n.mean[c], n.std[c] = m, s
		for v := range 256 {
			n.lut[c][v] = float32((float64(v)/255 - m) / s)
		}
	}
	return n, nil
}

// Apply normalises whole images: pix holds k images of C×H×W bytes
// (a [Batch]'s Pix) and dst receives them as float32 in the same layout.
// Lengths that are not the same whole number of images are a bug and
// panic.
func (n *Normalizer) Apply(dst []float32, pix []uint8) {
	sz := n.c * n.plane
	if len(dst) != len(pix) || sz == 0 || len(pix)%sz != 0 {
		panic(fmt.Sprintf("data: Normalizer.Apply: %d bytes into %d floats, want equal whole numbers of %d-byte images", len(pix), len(dst), sz))
	}
	for o := 0; o < len(pix); o += n.plane {
		lut := &n.lut[(o/n.plane)%n.c]
		d := dst[o : o+n.plane]
		for i, p := range pix[o : o+n.plane] {
			d[i] = lut[p]
		}
	}
}
