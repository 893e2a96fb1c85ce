package data

import "fmt"

// streamAugment keeps the augmentation draws independent of the package's
// other seeded streams (rng.go numbers those from 1).
const streamAugment uint64 = 0x617567 // "aug"

// Augmenter applies torchvision's RandomCrop(size, padding=Pad) followed by
// RandomHorizontalFlip() (when Flip) to batches of standardised images.
//
// Each image's crop offset and flip are a pure function of (Seed, epoch,
// example index), so an example is augmented the same way whatever batch it
// lands in, on whichever worker, and differently from one epoch to the
// next. The zero value leaves images unchanged. An Augmenter is read-only
// once configured and safe for concurrent use.
type Augmenter struct {
	// Pad is the padding on every side before cropping back to H×W: the
	// content moves by up to Pad pixels along each axis. 0 disables the
	// crop. torchvision's CIFAR recipe uses 4 for 32×32; 2 suits 28×28.
	Pad int
	// Flip mirrors each image left–right with probability 1/2.
	Flip bool
	// Seed selects the stream of offsets and flips.
	Seed int64
}

// ZeroPixel returns the standardised value of a zero (black) pixel,
// (0 − Mean)/Std: the fill for [Augmenter.Apply] that pads with zeros in
// pixel space, as torchvision's RandomCrop does before normalisation.
// (It is recomputed from the float32 Mean and Std, so it may differ from
// the stored value of a black pixel in the last bit.)
//
// A Dataset standardised per channel has no single such value: ZeroPixel
// panics for it (augment its channels one at a time, each with its own
// fill).
func (d *Dataset) ZeroPixel() float32 {
	if len(d.ChannelMean) > 0 {
		panic("data: ZeroPixel of a Dataset standardised per channel")
	}
	return float32(-float64(d.Mean) / float64(d.Std))
}

// params returns the shift (dy, dx) ∈ [−Pad, Pad]² and the flip for
// example index in epoch: the output pixel (y, x) is the source pixel
// (y+dy, x+dx), which is torchvision's crop at offset (dy+Pad, dx+Pad) of
// the padded image.
func (a *Augmenter) params(epoch, index int) (dy, dx int, flip bool) {
	key := splitmix64(splitmix64(uint64(epoch)) ^ uint64(index))
	r := newRNG(a.Seed^int64(key), streamAugment)
	if a.Pad > 0 {
		dy = r.intn(2*a.Pad+1) - a.Pad
		dx = r.intn(2*a.Pad+1) - a.Pad
	}
	if a.Flip {
		flip = r.src.Uint64()&1 == 1
	}
	return dy, dx, flip
}

// Apply augments in place the batch x, (n, c, h, w) row-major, whose image j
// is example indices[j] of the data set; epoch is the current epoch. Pixels
// shifted in from outside the image take the value fill, normally the
// data set's [Dataset.ZeroPixel]. It allocates nothing. Mismatched sizes
// panic.
func (a *Augmenter) Apply(x []float32, n, c, h, w int, indices []int, epoch int, fill float32) {
	if n < 0 || c < 0 || h < 0 || w < 0 || len(x) != n*c*h*w || len(indices) != n {
		panic(fmt.Sprintf("data: Augmenter.Apply: len(x)=%d and %d indices for n=%d, c=%d, h=%d, w=%d",
			len(x), len(indices), n, c, h, w))
	}
	if a.Pad < 0 {
		panic(fmt.Sprintf("data: Augmenter.Apply: negative Pad %d", a.Pad))
	}
	if a.Pad == 0 && !a.Flip {
		return
	}
	sz := c * h * w
	for j, idx := range indices {
		dy, dx, flip := a.params(epoch, idx)
		img := x[j*sz : (j+1)*sz]
		for ch := range c {
			plane := img[ch*h*w : (ch+1)*h*w]
			shift(plane, h, w, dy, dx, fill)
			if flip {
				flipRows(plane, h, w)
			}
		}
	}
}

// shift moves the (h, w) plane in place so that out(y, x) = in(y+dy, x+dx),
// with fill where (y+dy, x+dx) lies outside the plane. Rows are visited in
// the direction that reads each source row before it is overwritten, and
// copy handles the overlap within a row.
func shift(plane []float32, h, w, dy, dx int, fill float32) {
	if dy == 0 && dx == 0 {
		return
	}
	// The output columns [x0, x1) have a source column.
	x0, x1 := max(0, -dx), min(w, w-dx)
	row := func(y int) {
		dst := plane[y*w : (y+1)*w]
		sy := y + dy
		if sy < 0 || sy >= h || x0 >= x1 {
			fillRow(dst, fill)
			return
		}
		copy(dst[x0:x1], plane[sy*w+x0+dx:sy*w+x1+dx])
		fillRow(dst[:x0], fill)
		fillRow(dst[x1:], fill)
	}
	if dy >= 0 {
		for y := range h {
			row(y)
		}
	} else {
		for y := h - 1; y >= 0; y-- {
			row(y)
		}
	}
}

func fillRow(s []float32, v float32) {
	for i := range s {
		s[i] = v
	}
}

// flipRows mirrors each row of the (h, w) plane.
func flipRows(plane []float32, h, w int) {
	for y := range h {
		r := plane[y*w : (y+1)*w]
		for i, k := 0, w-1; i < k; i, k = i+1, k-1 {
			r[i], r[k] = r[k], r[i]
		}
	}
}
