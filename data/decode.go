package data

import (
	"bufio"
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"io"
	"math"
	"os"
)

// Image decoding for the file-based sources: PNG and JPEG through the
// standard library, detected by content (as PIL does), converted to planar
// bytes in the colour layout torchvision's loader gives, then resized and
// centre-cropped with the semantics of torchvision's Resize + CenterCrop.

var (
	pngMagic  = []byte("\x89PNG\r\n\x1a\n")
	jpegMagic = []byte{0xff, 0xd8, 0xff}
)

// decoderFor picks the decoder from the file's first bytes. Formats are
// chosen here rather than through image.Decode's registry so that the
// package does not register decoders for the whole process, and so that a
// file that is neither gets an error saying what it starts with.
func decoderFor(br *bufio.Reader) (decode func(io.Reader) (image.Image, error), config func(io.Reader) (image.Config, error), err error) {
	head, _ := br.Peek(len(pngMagic))
	switch {
	case bytes.HasPrefix(head, pngMagic):
		return png.Decode, png.DecodeConfig, nil
	case bytes.HasPrefix(head, jpegMagic):
		return jpeg.Decode, jpeg.DecodeConfig, nil
	}
	return nil, nil, fmt.Errorf("not a PNG or JPEG file (starts with % x)", head)
}

// MaxImagePixels bounds the width × height of an image file, so that a
// small file claiming a huge image (a decompression bomb) is an error
// rather than an allocation that kills the process: Pillow's limit for
// raising DecompressionBombError, 2 × its MAX_IMAGE_PIXELS.
const MaxImagePixels = 2 * 89478485

// probeImage reads just enough of path to learn its size and colour model.
func probeImage(path string) (image.Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return image.Config{}, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	return probeFile(path, f)
}

func probeFile(path string, f *os.File) (image.Config, error) {
	br := bufio.NewReader(f)
	_, config, err := decoderFor(br)
	if err != nil {
		return image.Config{}, fmt.Errorf("data: %s: %v", path, err)
	}
	cfg, err := config(br)
	if err != nil {
		return image.Config{}, fmt.Errorf("data: %s: decoding header: %v", path, err)
	}
	if cfg.Width < 1 || cfg.Height < 1 || int64(cfg.Width)*int64(cfg.Height) > MaxImagePixels {
		return image.Config{}, fmt.Errorf("data: %s: image is %d×%d (W×H): want at least 1×1 and at most %d pixels", path, cfg.Width, cfg.Height, MaxImagePixels)
	}
	return cfg, nil
}

// decodeImage decodes the whole of path, after checking its header's size
// against MaxImagePixels.
func decodeImage(path string) (image.Image, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	if _, err := probeFile(path, f); err != nil {
		return nil, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	br := bufio.NewReaderSize(f, 1<<16)
	decode, _, err := decoderFor(br)
	if err != nil {
		return nil, fmt.Errorf("data: %s: %v", path, err)
	}
	img, err := decode(br)
	if err != nil {
		return nil, fmt.Errorf("data: %s: decoding: %v", path, err)
	}
	return img, nil
}

// isGray reports whether images of colour model m decode to one channel:
// 8- and 16-bit grayscale (PNG types 0, JPEG with one component). Gray with
// alpha and paletted images count as colour, as PIL opens them as LA and P
// and converts them with convert('RGB').
func isGray(m color.Model) bool {
	return m == color.GrayModel || m == color.Gray16Model
}

// planar returns img as c planes (c = 1 or 3) of its height × width bytes.
//
// With c = 3 it is PIL's convert('RGB'): alpha is dropped (the colour
// channels of non-premultiplied RGBA are kept as stored), palettes are
// looked up, grayscale is copied to all three planes, and 16-bit samples
// keep their high byte (as PIL does for 16-bit colour; for 16-bit
// grayscale PIL's 'I' mode would clip values above 255 instead, which
// torchvision users know as a bug). With c = 1 grayscale is copied and colour images
// get PIL's convert('L') luma, (19595 R + 38470 G + 7471 B + 2^15) >> 16.
func planar(img image.Image, c int) (pix []uint8, h, w int) {
	b := img.Bounds()
	h, w = b.Dy(), b.Dx()
	pix = make([]uint8, c*h*w)
	plane := h * w
	put := func(o int, r, g, bl uint8) {
		if c == 1 {
			pix[o] = uint8((19595*uint32(r) + 38470*uint32(g) + 7471*uint32(bl) + 1<<15) >> 16)
			return
		}
		pix[o], pix[plane+o], pix[2*plane+o] = r, g, bl
	}
	putGray := func(o int, v uint8) {
		pix[o] = v
		if c == 3 {
			pix[plane+o], pix[2*plane+o] = v, v
		}
	}
	switch m := img.(type) {
	case *image.Gray:
		for y := range h {
			row := m.Pix[m.PixOffset(b.Min.X, b.Min.Y+y):]
			for x := range w {
				putGray(y*w+x, row[x])
			}
		}
	case *image.Gray16:
		for y := range h {
			row := m.Pix[m.PixOffset(b.Min.X, b.Min.Y+y):]
			for x := range w {
				putGray(y*w+x, row[2*x])
			}
		}
	case *image.NRGBA:
		for y := range h {
			row := m.Pix[m.PixOffset(b.Min.X, b.Min.Y+y):]
			for x := range w {
				put(y*w+x, row[4*x], row[4*x+1], row[4*x+2])
			}
		}
	case *image.RGBA:
		// Go's PNG decoder gives opaque truecolour (the commonest PNG) as
		// RGBA; premultiplied and non-premultiplied agree when alpha is 255.
		for y := range h {
			row := m.Pix[m.PixOffset(b.Min.X, b.Min.Y+y):]
			for x := range w {
				if a := row[4*x+3]; a == 255 {
					put(y*w+x, row[4*x], row[4*x+1], row[4*x+2])
				} else {
					p := nrgba(color.RGBA{row[4*x], row[4*x+1], row[4*x+2], a})
					put(y*w+x, p.R, p.G, p.B)
				}
			}
		}
	case *image.YCbCr:
		for y := range h {
			for x := range w {
				yi := m.YOffset(b.Min.X+x, b.Min.Y+y)
				ci := m.COffset(b.Min.X+x, b.Min.Y+y)
				r, g, bl := color.YCbCrToRGB(m.Y[yi], m.Cb[ci], m.Cr[ci])
				put(y*w+x, r, g, bl)
			}
		}
	case *image.Paletted:
		lut := make([]color.NRGBA, len(m.Palette))
		for i, p := range m.Palette {
			lut[i] = nrgba(p)
		}
		for y := range h {
			row := m.Pix[m.PixOffset(b.Min.X, b.Min.Y+y):]
			for x := range w {
				// An index beyond the palette decodes as black, as in
				// image.Paletted.At.
				var p color.NRGBA
				if int(row[x]) < len(lut) {
					p = lut[row[x]]
				}
				put(y*w+x, p.R, p.G, p.B)
			}
		}
	default:
		for y := range h {
			for x := range w {
				p := nrgba(img.At(b.Min.X+x, b.Min.Y+y))
				put(y*w+x, p.R, p.G, p.B)
			}
		}
	}
	return pix, h, w
}

// nrgba converts to non-premultiplied 8-bit colour; already non-premultiplied
// colours (PNG's RGBA and palette entries with alpha) keep their colour
// bytes, as PIL keeps them when it drops alpha.
func nrgba(c color.Color) color.NRGBA {
	switch v := c.(type) {
	case color.NRGBA:
		return v
	case color.NRGBA64:
		return color.NRGBA{uint8(v.R >> 8), uint8(v.G >> 8), uint8(v.B >> 8), uint8(v.A >> 8)}
	}
	return color.NRGBAModel.Convert(c).(color.NRGBA)
}

// resizedSize is torchvision's Resize(size) output for an int size: the
// shorter side becomes size and the longer one int(size·long/short),
// truncated (torchvision's _compute_resized_output_size).
func resizedSize(h, w, size int) (nh, nw int) {
	if w <= h {
		return int(float64(size) * float64(h) / float64(w)), size
	}
	return size, int(float64(size) * float64(w) / float64(h))
}

// cropOffset is torchvision's CenterCrop offset along one axis of length
// in for an output of length out: int(round((in − out) / 2)) with Python's
// round-half-to-even, or, when out > in, minus the zero padding torchvision
// adds before the crop, (out − in) // 2. Output pixel k is input pixel
// k + offset; outside the input it is 0.
func cropOffset(in, out int) int {
	d := in - out
	if d < 0 {
		return -((-d) / 2)
	}
	k := d / 2
	if d%2 == 1 && k%2 == 1 {
		k++ // x.5 rounds to the even neighbour
	}
	return k
}

// centreCrop copies the (h, w) centre of the c planes of src, (sh, sw)
// each, into dst, (c, h, w), zero where the crop reaches past src.
func centreCrop(dst []uint8, h, w int, src []uint8, c, sh, sw int) {
	oy, ox := cropOffset(sh, h), cropOffset(sw, w)
	for ch := range c {
		for y := range h {
			d := dst[(ch*h+y)*w : (ch*h+y+1)*w]
			sy := y + oy
			if sy < 0 || sy >= sh {
				clear(d)
				continue
			}
			s := src[(ch*sh+sy)*sw : (ch*sh+sy+1)*sw]
			for x := range w {
				if sx := x + ox; sx >= 0 && sx < sw {
					d[x] = s[sx]
				} else {
					d[x] = 0
				}
			}
		}
	}
}

// Fixed-point precision of the resampling coefficients: Pillow's
// PRECISION_BITS (32 − 8 − 2) for 8-bit images.
const resamplePrecision = 22

// resampleTaps are the taps of a 1-D resampling from in to out samples:
// output k reads ksize-wide coefficients kk[k*ksize:] over the inputs
// starting at first[k], n[k] of them.
type resampleTaps struct {
	ksize    int
	first, n []int
	kk       []int32
}

// bilinearTaps computes Pillow's precompute_coeffs for its BILINEAR filter
// (a triangle of support 1) and normalize_coeffs_8bpc. When downscaling,
// the filter is stretched by the scale factor, so every input pixel
// contributes (antialiasing), as Pillow's Image.resize does.
func bilinearTaps(in, out int) resampleTaps {
	scale := float64(in) / float64(out)
	filterScale := max(scale, 1)
	support := 1.0 * filterScale
	ksize := int(math.Ceil(support))*2 + 1
	t := resampleTaps{ksize: ksize, first: make([]int, out), n: make([]int, out), kk: make([]int32, out*ksize)}
	pre := make([]float64, ksize)
	for k := range out {
		center := (float64(k) + 0.5) * scale
		ss := 1 / filterScale
		// C's (int) truncates toward zero; so does Go's conversion.
		lo := max(int(center-support+0.5), 0)
		hi := min(int(center+support+0.5), in)
		n := hi - lo
		var ww float64
		for x := range n {
			v := triangle((float64(x+lo) - center + 0.5) * ss)
			pre[x] = v
			ww += v
		}
		for x := range n {
			if ww != 0 {
				pre[x] /= ww
			}
			r := 0.5
			if pre[x] < 0 {
				r = -0.5
			}
			t.kk[k*ksize+x] = int32(pre[x]*(1<<resamplePrecision) + r)
		}
		t.first[k], t.n[k] = lo, n
	}
	return t
}

func triangle(x float64) float64 {
	if x < 0 {
		x = -x
	}
	if x < 1 {
		return 1 - x
	}
	return 0
}

// clip8 is Pillow's rounding of a fixed-point sum to a byte.
func clip8(v int64) uint8 {
	if v >= 1<<resamplePrecision<<8 {
		return 255
	}
	if v <= 0 {
		return 0
	}
	return uint8(v >> resamplePrecision)
}

// resizeBilinear resizes each of the c planes of src, (sh, sw), to
// (h, w): Pillow's ImagingResample with BILINEAR, a horizontal pass into a
// byte image followed by a vertical pass, each skipped when that side keeps
// its length.
func resizeBilinear(src []uint8, c, sh, sw, h, w int) []uint8 {
	cur, curW := src, sw
	if w != sw {
		t := bilinearTaps(sw, w)
		tmp := make([]uint8, c*sh*w)
		for row := range c * sh {
			s := src[row*sw : (row+1)*sw]
			d := tmp[row*w : (row+1)*w]
			for k := range w {
				acc := int64(1) << (resamplePrecision - 1)
				kk := t.kk[k*t.ksize:]
				for x, p := range s[t.first[k] : t.first[k]+t.n[k]] {
					acc += int64(p) * int64(kk[x])
				}
				d[k] = clip8(acc)
			}
		}
		cur, curW = tmp, w
	}
	if h == sh {
		if w == sw {
			return append([]uint8(nil), src...)
		}
		return cur
	}
	t := bilinearTaps(sh, h)
	out := make([]uint8, c*h*curW)
	for ch := range c {
		plane := cur[ch*sh*curW : (ch+1)*sh*curW]
		for k := range h {
			d := out[(ch*h+k)*curW : (ch*h+k+1)*curW]
			kk := t.kk[k*t.ksize:]
			for x := range curW {
				acc := int64(1) << (resamplePrecision - 1)
				for j := range t.n[k] {
					acc += int64(plane[(t.first[k]+j)*curW+x]) * int64(kk[j])
				}
				d[x] = clip8(acc)
			}
		}
	}
	return out
}

// Transform says how decoded images are brought to one size.
type Transform struct {
	// H and W, when both > 0, are the output size: each image is resized
	// with bilinear filtering so that its shorter side is min(H, W), then
	// centre-cropped to H×W — torchvision's
	// Compose([Resize(min(H, W)), CenterCrop((H, W))]) on a PIL image:
	//
	//   - Resize: the shorter side becomes min(H, W), the longer one
	//     int(min(H, W)·long/short), truncated; resampling is Pillow's
	//     BILINEAR filter, which antialiases when downscaling (the triangle
	//     is stretched by the scale factor), in 22-bit fixed point,
	//     horizontal pass first, with a byte image between the passes — as
	//     Pillow's Resample.c computes it. (Pillow is not installed here,
	//     so this is checked against a float reference of the same filter,
	//     to ±1, not against Pillow's own output.)
	//   - CenterCrop: offsets int(round((in − out)/2)) with round half to
	//     even; when the crop is larger than the image along an axis (a
	//     non-square H×W) that axis is zero-padded first, (out − in)//2
	//     before, as torchvision pads.
	//
	// JPEG pixels come from Go's decoder, whose IDCT and chroma upsampling
	// differ from libjpeg's by a level or two. With H or W zero, images
	// keep their size, and all images of a set must then have the same.
	H, W int
}

func (t Transform) enabled() bool { return t.H > 0 && t.W > 0 }

// apply brings the planar image pix, (c, h, w), to the transform's size.
func (t Transform) apply(dst []uint8, pix []uint8, c, h, w int) {
	if !t.enabled() {
		copy(dst, pix)
		return
	}
	nh, nw := resizedSize(h, w, min(t.H, t.W))
	if nh != h || nw != w {
		pix = resizeBilinear(pix, c, h, w, nh, nw)
	}
	centreCrop(dst, t.H, t.W, pix, c, nh, nw)
}
