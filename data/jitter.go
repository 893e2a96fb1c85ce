package data

import (
	"fmt"
	"math"
)

// streamJitter keeps the colour jitter's draws independent of the crop
// and flip ([Augmenter]) and the package's other seeded streams.
const streamJitter uint64 = 0x6a6974 // "jit"

// ColorJitter is torchvision's ColorJitter(brightness, contrast,
// saturation, hue) on decoded pixels, before normalisation. Each image
// draws factors uniformly from [max(0, 1−v), 1+v] for each non-zero
// brightness, contrast and saturation v, and from [−Hue, Hue] for a
// non-zero Hue, and applies, on the [0, 1] scale and clamped to it after
// each:
//
//   - brightness f: x·f (adjust_brightness);
//   - contrast f: x·f + (1−f)·m, m the mean of the image's grayscale
//     (0.299 R + 0.587 G + 0.114 B; the one channel when grayscale),
//     taken after the operations before it (adjust_contrast);
//   - saturation f (three channels only): x·f + (1−f)·gray(pixel)
//     (adjust_saturation);
//   - hue f (three channels only): each pixel to HSV, its hue turned by
//     f of a full turn (h ← (h + f) mod 1), and back to RGB, in float32
//     as torchvision's tensor adjust_hue computes it.
//
// With Hue on, the four are applied in an order drawn per image, as
// torchvision's ColorJitter.get_params draws fn_idx. With Hue off the
// order is fixed (brightness, contrast, saturation), as it was before
// hue existed, so that a job without hue computes what it always has.
// The draws are a pure function of (Seed, epoch, example index), as
// [Augmenter]'s crops, so an example is jittered alike on any worker,
// batch or resume, and anew each epoch. The zero value is off. It is
// read-only once configured and safe for concurrent use.
type ColorJitter struct {
	Brightness, Contrast, Saturation float64
	// Hue is at most 0.5 (half a turn), as torchvision requires.
	Hue  float64
	Seed int64
}

// The operations of a [ColorJitter], numbered as torchvision's fn_idx.
const (
	JitterBrightness = iota
	JitterContrast
	JitterSaturation
	JitterHue
)

// JitterParams is one image's draw: what torchvision's
// ColorJitter.get_params returns.
type JitterParams struct {
	// Order lists the operations (JitterBrightness..JitterHue) in the
	// order they apply; those that are off are skipped.
	Order [4]int
	// The factors, 1 (brightness, contrast, saturation) or 0 (hue) for
	// each one that is off.
	Brightness, Contrast, Saturation, Hue float64
}

// Enabled reports whether j changes anything.
func (j *ColorJitter) Enabled() bool {
	return j != nil && (j.Brightness > 0 || j.Contrast > 0 || j.Saturation > 0 || j.Hue > 0)
}

// Params returns the draw of example index in epoch. The brightness,
// contrast and saturation factors are drawn first, as before hue
// existed, so they do not depend on Hue; the hue factor and then the
// order (with Hue on) follow from the same generator.
func (j *ColorJitter) Params(epoch, index int) JitterParams {
	key := splitmix64(splitmix64(uint64(epoch)) ^ uint64(index))
	r := newRNG(j.Seed^int64(key), streamJitter)
	draw := func(v float64) float64 {
		if v <= 0 {
			return 1
		}
		lo := max(0, 1-v)
		return lo + (1+v-lo)*r.float64()
	}
	p := JitterParams{Order: [4]int{JitterBrightness, JitterContrast, JitterSaturation, JitterHue}}
	p.Brightness = draw(j.Brightness)
	p.Contrast = draw(j.Contrast)
	p.Saturation = draw(j.Saturation)
	if j.Hue > 0 {
		p.Hue = -j.Hue + 2*j.Hue*r.float64()
		shuffle(&r, p.Order[:])
	}
	return p
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
	p := j.Params(epoch, index)
	for i, v := range pix {
		dst[i] = float32(v) / 255
	}
	gray := func(i int) float32 {
		if ch == 1 {
			return dst[i]
		}
		return 0.299*dst[i] + 0.587*dst[plane+i] + 0.114*dst[2*plane+i]
	}
	for _, op := range p.Order {
		switch {
		case op == JitterBrightness && p.Brightness != 1:
			f := float32(p.Brightness)
			for i, v := range dst {
				dst[i] = clamp01(v * f)
			}
		case op == JitterContrast && p.Contrast != 1:
			var sum float64
			for i := range plane {
				sum += float64(gray(i))
			}
			m := float32(sum / float64(max(plane, 1)))
			f := float32(p.Contrast)
			for i, v := range dst {
				dst[i] = clamp01(f*v + (1-f)*m)
			}
		case op == JitterSaturation && p.Saturation != 1 && ch == 3:
			f := float32(p.Saturation)
			for i := range plane {
				g := gray(i)
				for c := range 3 {
					o := c*plane + i
					dst[o] = clamp01(f*dst[o] + (1-f)*g)
				}
			}
		case op == JitterHue && j.Hue > 0 && ch == 3:
			// Applied whenever hue is on, even for a factor of exactly 0,
			// as torchvision's round trip through HSV is not exactly the
			// identity in float32.
			AdjustHue(dst[:plane], dst[plane:2*plane], dst[2*plane:], float32(p.Hue))
		}
	}
}

// AdjustHue turns the hue of the RGB pixels (r[i], g[i], b[i]), values in
// [0, 1], by f of a full turn in place, f in [−0.5, 0.5]: torchvision's
// adjust_hue on a float32 tensor, written out operation by operation
// (_rgb2hsv, h ← (h + f) mod 1, _hsv2rgb) so that it rounds as
// torchvision does. The planes must have one length; a pixel with equal
// channels (a gray) keeps them.
func AdjustHue(r, g, b []float32, f float32) {
	if len(g) != len(r) || len(b) != len(r) {
		panic(fmt.Sprintf("data: AdjustHue: planes of %d, %d and %d values", len(r), len(g), len(b)))
	}
	for i := range r {
		h, s, v := rgbToHSV(r[i], g[i], b[i])
		h = remainder1(h + f)
		r[i], g[i], b[i] = hsvToRGB(h, s, v)
	}
}

// rgbToHSV is torchvision's _rgb2hsv for one pixel (after Pillow's
// Convert.c): h and s are 0 for a gray, h in [0, 1).
func rgbToHSV(r, g, b float32) (h, s, v float32) {
	maxc, minc := max(r, g, b), min(r, g, b)
	cr := maxc - minc
	if cr == 0 {
		return 0, 0, maxc
	}
	s = cr / maxc
	rc, gc, bc := (maxc-r)/cr, (maxc-g)/cr, (maxc-b)/cr
	switch {
	case maxc == r:
		h = bc - gc
	case maxc == g:
		h = 2 + rc - bc
	default:
		h = 4 + gc - rc
	}
	return float32(math.Mod(float64(h/6+1), 1)), s, maxc
}

// remainder1 is torch.remainder(x, 1.0) in float32: fmod, moved into
// [0, 1) when negative (which may round up to 1; hsvToRGB takes it as 0).
func remainder1(x float32) float32 {
	m := float32(math.Mod(float64(x), 1))
	if m < 0 {
		m += 1
	}
	return m
}

// hsvToRGB is torchvision's _hsv2rgb for one pixel: the sector
// floor(6h) mod 6 picks which of v, p, q, t each channel takes.
func hsvToRGB(h, s, v float32) (r, g, b float32) {
	h6 := h * 6
	fi := float32(math.Floor(float64(h6)))
	f := h6 - fi
	p := clamp01(v * (1 - s))
	q := clamp01(v * (1 - s*f))
	t := clamp01(v * (1 - s*(1-f)))
	return hexSector(int(int32(fi)%6), v, p, q, t)
}

// hexSector gives the RGB of sector k (0..5, of a sixth of a turn each)
// of the HSV hexcone from v and the ramps p = v(1−s), q = v(1−s·f),
// t = v(1−s(1−f)), f the position within the sector: which of the four
// each channel takes.
func hexSector[T float32 | float64](k int, v, p, q, t T) (r, g, b T) {
	switch k {
	case 0:
		return v, t, p
	case 1:
		return q, v, p
	case 2:
		return p, v, t
	case 3:
		return p, q, v
	case 4:
		return t, p, v
	default:
		return v, p, q
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
