package data

import "fmt"

// streamJitter keeps the colour jitter's draws independent of the crop
// and flip ([Augmenter]) and the package's other seeded streams.
const streamJitter uint64 = 0x6a6974 // "jit"

// ColorJitter is torchvision's ColorJitter(brightness, contrast,
// saturation) on decoded pixels, before normalisation. Each image draws
// factors uniformly from [max(0, 1−v), 1+v] for each non-zero v and
// applies, on the [0, 1] scale and clamped to it after each:
//
//   - brightness f: x·f (adjust_brightness);
//   - contrast f: x·f + (1−f)·m, m the mean of the image's grayscale
//     (0.299 R + 0.587 G + 0.114 B; the one channel when grayscale),
//     taken after the brightness (adjust_contrast);
//   - saturation f (three channels only): x·f + (1−f)·gray(pixel)
//     (adjust_saturation).
//
// Unlike torchvision, the order is fixed (brightness, contrast,
// saturation) rather than drawn per image. The factors are a pure
// function of (Seed, epoch, example index), as [Augmenter]'s crops, so
// an example is jittered alike on any worker, batch or resume, and anew
// each epoch. The zero value is off. It is read-only once configured and
// safe for concurrent use.
type ColorJitter struct {
	Brightness, Contrast, Saturation float64
	Seed                             int64
}

// Enabled reports whether j changes anything.
func (j *ColorJitter) Enabled() bool {
	return j != nil && (j.Brightness > 0 || j.Contrast > 0 || j.Saturation > 0)
}

// Factors returns the brightness, contrast and saturation factors of
// example index in epoch (1 for each one that is off).
func (j *ColorJitter) Factors(epoch, index int) (b, c, s float64) {
	key := splitmix64(splitmix64(uint64(epoch)) ^ uint64(index))
	r := newRNG(j.Seed^int64(key), streamJitter)
	draw := func(v float64) float64 {
		if v <= 0 {
			return 1
		}
		lo := max(0, 1-v)
		return lo + (1+v-lo)*r.float64()
	}
	b = draw(j.Brightness)
	c = draw(j.Contrast)
	s = draw(j.Saturation)
	return b, c, s
}

// Apply writes into dst the jittered pixels of one image pix (ch planes
// of h×w bytes, as [Pixels.Read] gives them) on the [0, 1] scale, for
// example index in epoch. Lengths other than ch·h·w, or ch other than 1
// and 3, panic.
func (j *ColorJitter) Apply(dst []float32, pix []uint8, ch, h, w, epoch, index int) {
	plane := h * w
	if (ch != 1 && ch != 3) || len(pix) != ch*plane || len(dst) != len(pix) {
		panic(fmt.Sprintf("data: ColorJitter.Apply: %d bytes into %d floats for %d×%d×%d", len(pix), len(dst), ch, h, w))
	}
	fb, fc, fs := j.Factors(epoch, index)
	for i, p := range pix {
		dst[i] = clamp01(float32(p) / 255 * float32(fb))
	}
	gray := func(i int) float32 {
		if ch == 1 {
			return dst[i]
		}
		return 0.299*dst[i] + 0.587*dst[plane+i] + 0.114*dst[2*plane+i]
	}
	if fc != 1 {
		var sum float64
		for i := range plane {
			sum += float64(gray(i))
		}
		m := float32(sum / float64(max(plane, 1)))
		f := float32(fc)
		for i, v := range dst {
			dst[i] = clamp01(f*v + (1-f)*m)
		}
	}
	if fs != 1 && ch == 3 {
		f := float32(fs)
		for i := range plane {
			g := gray(i)
			for c := range 3 {
				o := c*plane + i
				dst[o] = clamp01(f*dst[o] + (1-f)*g)
			}
		}
	}
}

func clamp01(v float32) float32 {
	return min(max(v, 0), 1)
}

// ApplyScaled normalises pixels already on the [0, 1] scale (a
// [ColorJitter]'s output): dst[i] = (v[i] − mean[c]) / std[c], for k whole
// images, in float64 as [Normalizer.Apply]'s table is.
func (n *Normalizer) ApplyScaled(dst, v []float32) {
	sz := n.c * n.plane
	if len(dst) != len(v) || sz == 0 || len(v)%sz != 0 {
		panic(fmt.Sprintf("data: Normalizer.ApplyScaled: %d values into %d floats, want equal whole numbers of %d-value images", len(v), len(dst), sz))
	}
	for o := 0; o < len(v); o += n.plane {
		c := (o / n.plane) % n.c
		m, s := n.mean[c], n.std[c]
		d := dst[o : o+n.plane]
		for i, x := range v[o : o+n.plane] {
			d[i] = float32((float64(x) - m) / s)
		}
	}
}
