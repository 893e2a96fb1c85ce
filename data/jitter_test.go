package data

import (
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func randomImage(seed uint64, n int) []uint8 {
	r := rand.New(rand.NewPCG(seed, 1))
	p := make([]uint8, n)
	for i := range p {
		p[i] = uint8(r.IntN(256))
	}
	return p
}

// factors is the brightness, contrast and saturation of j's draw.
func factors(j *ColorJitter, epoch, index int) (b, c, s float64) {
	p := j.Params(epoch, index)
	return p.Brightness, p.Contrast, p.Saturation
}

// TestColorJitterDeterministic: the zero value is off; the factors are a
// pure function of (seed, epoch, index), within [max(0, 1−v), 1+v], and
// change with each of the three; Apply gives the same image for the same
// draw.
func TestColorJitterDeterministic(t *testing.T) {
	var off ColorJitter
	if off.Enabled() || (*ColorJitter)(nil).Enabled() {
		t.Error("the zero ColorJitter (or nil) is enabled")
	}
	if b, c, s := factors(&off, 3, 7); b != 1 || c != 1 || s != 1 {
		t.Errorf("zero value factors %v %v %v, want 1 1 1", b, c, s)
	}
	j := ColorJitter{Brightness: 0.4, Contrast: 0.4, Saturation: 1.5, Seed: 9}
	seen := map[[3]float64]bool{}
	for epoch := range 3 {
		for idx := range 50 {
			b, c, s := factors(&j, epoch, idx)
			if b2, c2, s2 := factors(&j, epoch, idx); b != b2 || c != c2 || s != s2 {
				t.Fatalf("epoch %d index %d: two draws differ", epoch, idx)
			}
			if b < 0.6 || b > 1.4 || c < 0.6 || c > 1.4 || s < 0 || s > 2.5 {
				t.Fatalf("epoch %d index %d: factors %v %v %v out of range", epoch, idx, b, c, s)
			}
			seen[[3]float64{b, c, s}] = true
		}
	}
	if len(seen) != 150 {
		t.Errorf("%d distinct draws over 3 epochs × 50 examples, want 150", len(seen))
	}
	other := j
	other.Seed = 10
	if b, _, _ := factors(&other, 0, 0); b == func() float64 { b, _, _ := factors(&j, 0, 0); return b }() {
		t.Error("another seed draws the same brightness")
	}
	pix := randomImage(1, 3*6*5)
	a, b := make([]float32, len(pix)), make([]float32, len(pix))
	j.Apply(a, pix, 3, 6, 5, 1, 4)
	j.Apply(b, pix, 3, 6, 5, 1, 4)
	if !slices.Equal(a, b) {
		t.Error("Apply of the same example twice differs")
	}
	j.Apply(b, pix, 3, 6, 5, 2, 4)
	if slices.Equal(a, b) {
		t.Error("another epoch jitters the example the same way")
	}
	for i, v := range a {
		if v < 0 || v > 1 {
			t.Fatalf("pixel %d = %v outside [0, 1]", i, v)
		}
	}
}

// TestColorJitterOperations checks each operation against its definition
// (torchvision's adjust_brightness, adjust_contrast, adjust_saturation):
// brightness scales and clamps; contrast blends with the grayscale mean
// (no change on a flat image); saturation blends with each pixel's gray
// (no change on a gray image); off leaves p/255.
func TestColorJitterOperations(t *testing.T) {
	const ch, h, w = 3, 4, 5
	pix := randomImage(2, ch*h*w)
	got := make([]float32, len(pix))
	near := func(what string, i int, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-6 {
			t.Fatalf("%s: pixel %d = %v, want %v", what, i, got, want)
		}
	}

	bj := ColorJitter{Brightness: 0.5, Seed: 1}
	f, _, _ := factors(&bj, 0, 3)
	bj.Apply(got, pix, ch, h, w, 0, 3)
	for i, p := range pix {
		near("brightness", i, float64(got[i]), math.Min(float64(p)/255*f, 1))
	}

	cj := ColorJitter{Contrast: 0.5, Seed: 1}
	_, f, _ = factors(&cj, 0, 3)
	cj.Apply(got, pix, ch, h, w, 0, 3)
	var m float64
	for i := range h * w {
		m += (0.299*float64(pix[i]) + 0.587*float64(pix[h*w+i]) + 0.114*float64(pix[2*h*w+i])) / 255
	}
	m /= h * w
	for i, p := range pix {
		near("contrast", i, float64(got[i]), math.Min(math.Max(f*float64(p)/255+(1-f)*m, 0), 1))
	}
	flat := slices.Repeat([]uint8{77}, ch*h*w)
	cj.Apply(got, flat, ch, h, w, 0, 3)
	for i := range got {
		near("contrast of a flat image", i, float64(got[i]), 77.0/255)
	}

	sj := ColorJitter{Saturation: 0.9, Seed: 1}
	_, _, f = factors(&sj, 0, 3)
	sj.Apply(got, pix, ch, h, w, 0, 3)
	for i := range h * w {
		g := (0.299*float64(pix[i]) + 0.587*float64(pix[h*w+i]) + 0.114*float64(pix[2*h*w+i])) / 255
		for c := range ch {
			o := c*h*w + i
			near("saturation", o, float64(got[o]), math.Min(math.Max(f*float64(pix[o])/255+(1-f)*g, 0), 1))
		}
	}
	gray := make([]uint8, ch*h*w)
	for i := range h * w {
		gray[i], gray[h*w+i], gray[2*h*w+i] = pix[i], pix[i], pix[i]
	}
	sj.Apply(got, gray, ch, h, w, 0, 3)
	for i, p := range gray {
		near("saturation of a gray image", i, float64(got[i]), float64(p)/255)
	}
	// One channel: saturation does nothing.
	sj.Apply(got[:h*w], pix[:h*w], 1, h, w, 0, 3)
	for i, p := range pix[:h*w] {
		near("saturation of one channel", i, float64(got[i]), float64(p)/255)
	}
}

// TestNormalizerApplyScaled: on p/255 values ApplyScaled agrees with the
// table of Apply to float32 rounding.
func TestNormalizerApplyScaled(t *testing.T) {
	in := Info{N: 1, C: 3, H: 2, W: 3}
	n, err := NewNormalizer(in, []float64{0.4, 0.5, 0.6}, []float64{0.2, 0.25, 0.3})
	if err != nil {
		t.Fatal(err)
	}
	pix := randomImage(3, 2*in.ImageSize())
	v := make([]float32, len(pix))
	for i, p := range pix {
		v[i] = float32(p) / 255
	}
	a, b := make([]float32, len(pix)), make([]float32, len(pix))
	n.Apply(a, pix)
	n.ApplyScaled(b, v)
	for i := range a {
		if math.Abs(float64(a[i]-b[i])) > 1e-6 {
			t.Fatalf("value %d: table %v, scaled %v", i, a[i], b[i])
		}
	}
}

// jitterGoldenCases are the configurations whose output
// testdata/golden/jitter_bcs.txt pins: brightness, contrast and
// saturation alone and together, on RGB and grayscale images.
var jitterGoldenCases = []struct {
	name  string
	j     ColorJitter
	ch    int
	epoch int
	index int
}{
	{"brightness", ColorJitter{Brightness: 0.4, Seed: 3}, 3, 0, 5},
	{"contrast", ColorJitter{Contrast: 0.6, Seed: 3}, 3, 1, 2},
	{"saturation", ColorJitter{Saturation: 0.8, Seed: 3}, 3, 2, 9},
	{"all", ColorJitter{Brightness: 0.4, Contrast: 0.4, Saturation: 0.4, Seed: 11}, 3, 0, 0},
	{"all-epoch3", ColorJitter{Brightness: 0.4, Contrast: 0.4, Saturation: 0.4, Seed: 11}, 3, 3, 17},
	{"strong", ColorJitter{Brightness: 2, Contrast: 1.5, Saturation: 3, Seed: -7}, 3, 1, 1},
	{"gray-all", ColorJitter{Brightness: 0.5, Contrast: 0.5, Saturation: 0.5, Seed: 4}, 1, 0, 8},
}

// TestColorJitterGolden pins Apply's exact output (float32 bits) for
// fixed configurations, so that a change to the jitter that alters what
// existing jobs compute is seen. Regenerate with:
// go test ./data -run TestColorJitterGolden -update
func TestColorJitterGolden(t *testing.T) {
	const h, w = 4, 5
	var b strings.Builder
	b.WriteString("# ColorJitter.Apply output as float32 bits (hex), one image per line: case ch×h×w epoch index factors: bits\n")
	for i, c := range jitterGoldenCases {
		pix := randomImage(uint64(100+i), c.ch*h*w)
		dst := make([]float32, len(pix))
		c.j.Apply(dst, pix, c.ch, h, w, c.epoch, c.index)
		fb, fc, fs := factors(&c.j, c.epoch, c.index)
		fmt.Fprintf(&b, "%s %d×%d×%d %d %d %v %v %v:", c.name, c.ch, h, w, c.epoch, c.index, fb, fc, fs)
		for _, v := range dst {
			fmt.Fprintf(&b, " %08x", math.Float32bits(v))
		}
		b.WriteString("\n")
	}
	checkGolden(t, filepath.Join("testdata", "golden", "jitter_bcs.txt"), "jitter outputs", b.String())
}
