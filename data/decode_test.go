package data

import (
	"fmt"
	"image"
	"image/color"
	"math"
	"testing"
)

func TestResizedSize(t *testing.T) {
	// torchvision's _compute_resized_output_size for an int size.
	for _, c := range []struct{ h, w, size, nh, nw int }{
		{100, 50, 32, 64, 32},
		{50, 100, 32, 32, 64},
		{32, 32, 32, 32, 32},
		{33, 50, 32, 32, 48},      // int(32·50/33) = int(48.48…)
		{375, 500, 224, 224, 298}, // int(298.66…)
		{7, 3, 2, 4, 2},           // int(4.66…)
	} {
		nh, nw := resizedSize(c.h, c.w, c.size)
		if nh != c.nh || nw != c.nw {
			t.Errorf("resizedSize(%d, %d, %d) = %d×%d, want %d×%d", c.h, c.w, c.size, nh, nw, c.nh, c.nw)
		}
	}
}

func TestCropOffset(t *testing.T) {
	// int(round((in − out)/2)) with round half to even; −(out−in)//2 when
	// the crop is larger (torchvision pads first).
	for _, c := range []struct{ in, out, off int }{
		{5, 2, 2}, // round(1.5) = 2
		{7, 2, 2}, // round(2.5) = 2
		{9, 2, 4}, // round(3.5) = 4
		{4, 2, 1},
		{3, 2, 0}, // round(0.5) = 0
		{2, 2, 0},
		{2, 5, -1}, // pad (5−2)//2 = 1 before
		{2, 6, -2},
	} {
		if got := cropOffset(c.in, c.out); got != c.off {
			t.Errorf("cropOffset(%d, %d) = %d, want %d", c.in, c.out, got, c.off)
		}
	}
}

func TestCentreCropPads(t *testing.T) {
	src := []uint8{1, 2, 3, 4} // 1×2×2
	dst := make([]uint8, 3*3)
	centreCrop(dst, 3, 3, src, 1, 2, 2)
	// (3−2)//2 = 0 rows and columns of zeros before, 1 after.
	want := []uint8{1, 2, 0, 3, 4, 0, 0, 0, 0}
	if fmt.Sprint(dst) != fmt.Sprint(want) {
		t.Errorf("crop = %v, want %v", dst, want)
	}
}

// naiveBilinear is the reference for resizeBilinear: Pillow's filter (a
// triangle stretched by the downscale factor, centred at (k+0.5)·scale)
// written as one 2-D weighted sum in float64 over every input pixel, with
// no fixed point and no rounding between the passes.
func naiveBilinear(src []uint8, sh, sw, h, w int) []uint8 {
	weights := func(in, out, k int) []float64 {
		scale := float64(in) / float64(out)
		fs := max(scale, 1)
		center := (float64(k) + 0.5) * scale
		ws := make([]float64, in)
		var sum float64
		for j := range in {
			ws[j] = triangle((float64(j) + 0.5 - center) / fs)
			sum += ws[j]
		}
		for j := range ws {
			ws[j] /= sum
		}
		return ws
	}
	out := make([]uint8, h*w)
	for y := range h {
		wy := weights(sh, h, y)
		for x := range w {
			wx := weights(sw, w, x)
			var v float64
			for j := range sh {
				for i := range sw {
					v += wy[j] * wx[i] * float64(src[j*sw+i])
				}
			}
			out[y*w+x] = uint8(min(max(math.Round(v), 0), 255))
		}
	}
	return out
}

func TestResizeBilinearMatchesNaive(t *testing.T) {
	r := newRNG(1, 99)
	sizes := []int{1, 2, 3, 5, 8, 13, 32}
	for _, sh := range sizes {
		for _, sw := range sizes {
			src := make([]uint8, sh*sw)
			for i := range src {
				src[i] = uint8(r.intn(256))
			}
			for _, h := range []int{1, 2, 4, 7, 16} {
				for _, w := range []int{1, 3, 9} {
					got := resizeBilinear(src, 1, sh, sw, h, w)
					want := naiveBilinear(src, sh, sw, h, w)
					for i := range got {
						if d := int(got[i]) - int(want[i]); d < -1 || d > 1 {
							t.Fatalf("%d×%d → %d×%d: pixel %d = %d, reference %d", sh, sw, h, w, i, got[i], want[i])
						}
					}
				}
			}
		}
	}
}

func TestResizeBilinearExact(t *testing.T) {
	// A constant image stays constant, up or down.
	src := make([]uint8, 2*5*7)
	for i := range src {
		src[i] = 77
	}
	for _, s := range [][2]int{{3, 3}, {10, 14}, {1, 1}, {5, 7}} {
		for i, v := range resizeBilinear(src, 2, 5, 7, s[0], s[1]) {
			if v != 77 {
				t.Fatalf("constant 5×7 → %v: pixel %d = %d", s, i, v)
			}
		}
	}
	// Halving a row: the stretched triangle weighs inputs 2k−1..2k+2 as
	// 1:3:3:1 (edges renormalised): Pillow's antialiased BILINEAR, not the
	// 2-tap average an unfiltered bilinear lookup would give.
	row := []uint8{0, 80, 160, 240}
	got := resizeBilinear(row, 1, 1, 4, 1, 2)
	// k=0: taps 0..2 with weights 3:3:1 → (0·3+80·3+160)/7 = 57.1 → 57;
	// k=1: taps 1..3 with 1:3:3 → (80+160·3+240·3)/7 = 182.9 → 183.
	if got[0] != 57 || got[1] != 183 {
		t.Errorf("halving %v = %v, want [57 183]", row, got)
	}
}

func TestPlanarColourConversions(t *testing.T) {
	nrgba := image.NewNRGBA(image.Rect(0, 0, 2, 1))
	nrgba.SetNRGBA(0, 0, color.NRGBA{10, 20, 30, 0}) // alpha dropped, colour kept
	nrgba.SetNRGBA(1, 0, color.NRGBA{200, 100, 50, 128})
	pix, h, w := planar(nrgba, 3)
	if h != 1 || w != 2 || fmt.Sprint(pix) != "[10 200 20 100 30 50]" {
		t.Errorf("NRGBA → RGB planes = %v (%d×%d)", pix, h, w)
	}
	rgba := image.NewRGBA(image.Rect(0, 0, 2, 1))
	rgba.SetRGBA(0, 0, color.RGBA{10, 20, 30, 255})
	rgba.SetRGBA(1, 0, color.RGBA{50, 25, 0, 128}) // premultiplied: NRGBA (99, 49, 0)
	if pix, _, _ := planar(rgba, 3); fmt.Sprint(pix) != "[10 99 20 49 30 0]" {
		t.Errorf("RGBA → RGB planes = %v", pix)
	}
	pal := image.NewPaletted(image.Rect(0, 0, 2, 1), color.Palette{color.RGBA{1, 2, 3, 255}, color.NRGBA{9, 8, 7, 0}})
	pal.SetColorIndex(1, 0, 1)
	if pix, _, _ := planar(pal, 3); fmt.Sprint(pix) != "[1 9 2 8 3 7]" {
		t.Errorf("paletted → RGB planes = %v", pix)
	}
	g := image.NewGray(image.Rect(0, 0, 2, 1))
	g.Pix = []uint8{5, 250}
	if pix, _, _ := planar(g, 3); fmt.Sprint(pix) != "[5 250 5 250 5 250]" {
		t.Errorf("gray → RGB planes = %v", pix)
	}
	if pix, _, _ := planar(g, 1); fmt.Sprint(pix) != "[5 250]" {
		t.Errorf("gray → gray = %v", pix)
	}
	// PIL's convert('L'): (19595 R + 38470 G + 7471 B + 2^15) >> 16.
	if pix, _, _ := planar(nrgba, 1); pix[1] != uint8((19595*200+38470*100+7471*50+1<<15)>>16) {
		t.Errorf("RGB → L = %v", pix)
	}
	// A sub-image starts at its own origin.
	big := image.NewGray(image.Rect(0, 0, 3, 3))
	for i := range big.Pix {
		big.Pix[i] = uint8(i)
	}
	if pix, h, w := planar(big.SubImage(image.Rect(1, 1, 3, 3)), 1); h != 2 || w != 2 || fmt.Sprint(pix) != "[4 5 7 8]" {
		t.Errorf("sub-image = %v (%d×%d)", pix, h, w)
	}
}
